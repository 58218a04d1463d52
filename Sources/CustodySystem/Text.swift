extension String {
    /// The string without leading and trailing Unicode whitespace.
    public func trimmingWhitespace() -> String {
        // Nearly always nothing to trim: no copy then.
        if let first = unicodeScalars.first, let last = unicodeScalars.last,
           !first.properties.isWhitespace, !last.properties.isWhitespace {
            return self
        }
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, first.properties.isWhitespace { scalars = scalars.dropFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars = scalars.dropLast() }
        return String(String.UnicodeScalarView(scalars))
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
