/// A loopback TCP address and port (`127.0.0.1:9464`, `[::1]:9464`): where the daemon may also
/// serve its metrics. Only loopback: the metrics are for a local Prometheus or node_exporter,
/// and a wider address would publish them to the network.
public struct LoopbackAddress: Equatable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16
    public var isIPv6: Bool { host == "::1" }

    public struct Problem: Error, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    public init(_ text: String) throws(Problem) {
        let host: Substring, port: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[close...].hasPrefix("]:") else {
                throw Problem(message: "must be address:port on loopback, such as 127.0.0.1:9464 or [::1]:9464, not \(text)")
            }
            host = text[text.index(after: text.startIndex)..<close]
            port = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":") else {
                throw Problem(message: "must be address:port on loopback, such as 127.0.0.1:9464, not \(text)")
            }
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        }
        guard let number = UInt16(port), number > 0 else { throw Problem(message: "port must be 1 to 65535, not \(port)") }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        let isIPv4Loopback = octets.count == 4 && octets.first == "127" && octets.allSatisfy { UInt8($0) != nil }
        guard isIPv4Loopback || host == "::1" else {
            throw Problem(message: "\(host) is not a loopback address (127.0.0.0/8 or ::1): the metrics are served to this machine only")
        }
        self.host = String(host)
        self.port = number
    }

    public var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
