import CustodyAPI

/// Routes match request paths here, in the daemon and its front; clients only build paths.
extension Endpoint {
    /// The values of the pattern's parameters when `path` (as sent, escapes kept) matches it,
    /// else nil. Segments are split before escapes are decoded, so "%2F" stays inside one.
    func match(_ path: String) -> [String: String]? {
        let want = pattern.split(separator: "/")
        let have = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().filter { _ in true }
        let segments = have.last == "" ? Array(have.dropLast()) : Array(have)
        guard path.hasPrefix("/"), want.count == segments.count else { return nil }
        var parameters: [String: String] = [:]
        for (pattern, value) in zip(want, segments) {
            if pattern.hasPrefix("{") {
                let decoded = String(value).removingPercentEncoding
                guard !decoded.isEmpty else { return nil }
                parameters[String(pattern.dropFirst().dropLast())] = decoded
            } else if pattern != value {
                return nil
            }
        }
        return parameters
    }
}
