extension String {
    /// The string without leading and trailing Unicode whitespace.
    public func trimmingWhitespace() -> String {
        // Nearly always nothing to trim: no copy then (and printable ASCII at both ends needs no
        // lookup of Unicode properties).
        if let first = utf8.first, let last = utf8.last, (0x21...0x7E).contains(first), (0x21...0x7E).contains(last) {
            return self
        }
        if let first = unicodeScalars.first, let last = unicodeScalars.last,
           !first.properties.isWhitespace, !last.properties.isWhitespace {
            return self
        }
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, first.properties.isWhitespace { scalars = scalars.dropFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars = scalars.dropLast() }
        return String(String.UnicodeScalarView(scalars))
    }

    /// The trimmed, lowercased form identities are compared and recorded in. An identity nearly
    /// always arrives in that form already (printable ASCII without capitals), and is then
    /// returned as it is, without building two new strings on every file created.
    public func foldedIdentity() -> String {
        if utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && !(0x41...0x5A).contains($0) }) { return self }
        return trimmingWhitespace().lowercased()
    }
}

extension StringProtocol {
    /// The text without leading and trailing characters from `set`.
    public func trimmingCharacters(in set: String) -> String {
        var slice = Substring(self)[...]
        while let first = slice.first, set.contains(first) { slice = slice.dropFirst() }
        while let last = slice.last, set.contains(last) { slice = slice.dropLast() }
        return String(slice)
    }
}

extension String {
    /// Every occurrence of `target` replaced by `replacement`.
    public func replacingAll(of target: String, with replacement: String) -> String {
        guard !target.isEmpty, contains(target) else { return self }
        return split(separator: target, omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
