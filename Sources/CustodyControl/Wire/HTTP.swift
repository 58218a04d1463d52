import CustodySystem
import Glibc

/// One HTTP/1.1 request, as the control front read it from a connection.
public struct HTTPRequest: Sendable {
    public var method: String
    public var path: String
    public var query: [String: String]
    public var headers: [String: String]
    public var body: [UInt8]
}

public struct HTTPResponse: Sendable {
    public var status: Int
    public var body: [UInt8]
    public var contentType = "application/json"
    /// Headers beyond the ones every answer has (e.g. `Allow` on a 405).
    public var headers: [String: String] = [:]
    /// A streamed body (chunked): the daemon calls it with a writer after the head, on the
    /// request's thread, and the connection closes when it returns.
    var stream: (@Sendable (StreamWriter) -> Void)?

    public init(status: Int, body: [UInt8], contentType: String = "application/json") {
        self.status = status
        self.body = body
        self.contentType = contentType
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 200: return "OK"
        case 201: return "Created"
        case 202: return "Accepted"
        case 204: return "No Content"
        case 207: return "Multi-Status"
        case 400: return "Bad Request"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 408: return "Request Timeout"
        case 409: return "Conflict"
        case 413: return "Content Too Large"
        case 422: return "Unprocessable Content"
        case 423: return "Locked"
        case 429: return "Too Many Requests"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 507: return "Insufficient Storage"
        default: return "Status"
        }
    }

    /// The header fields of the answer, in order: its content type and extra headers (without
    /// control characters), then how the body is framed and whether the connection stays.
    func headerFields(streamed: Bool, keepAlive: Bool) -> [(String, String)] {
        var fields = [("Content-Type", Self.clean(contentType))]
        fields += headers.sorted { $0.key < $1.key }.map { (Self.clean($0.key), Self.clean($0.value)) }
        fields += streamed ? [("Transfer-Encoding", "chunked"), ("Cache-Control", "no-cache")] : [("Content-Length", String(body.count))]
        fields.append(("Connection", keepAlive ? "keep-alive" : "close"))
        return fields
    }

    /// The whole answer with `Connection: close`, for the one the front sends before a connection
    /// reaches the HTTP server (too many connections).
    func serialized() -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(Self.reason(status))\r\n"
        for (name, value) in headerFields(streamed: false, keepAlive: false) { head += "\(name): \(value)\r\n" }
        return Array((head + "\r\n").utf8) + body
    }

    /// A header field without line breaks or other control characters.
    private static func clean(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7f }))
    }

}

/// Writes the chunks of a streamed answer to the front (as "C" frames), and tells whether the
/// client is still there (the front closes its end when the client goes).
final class StreamWriter: @unchecked Sendable {
    let fd: Int32
    private(set) var failed = false

    init(fd: Int32) { self.fd = fd }

    /// Sends one chunk; false once the client is gone.
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        guard !bytes.isEmpty else { return !failed }
        return write(.chunk, bytes)
    }

    /// Ends the stream.
    func finish() { _ = write(.end, []) }

    /// True when the other end has closed (checked without waiting).
    var clientClosed: Bool {
        if failed { return true }
        var poller = pollfd(fd: fd, events: Int16(POLLIN) | Int16(0x2000), revents: 0)
        guard poll(&poller, 1, 0) > 0 else { return false }
        if poller.revents & (Int16(0x2000) | Int16(POLLHUP) | Int16(POLLERR)) != 0 { return true }
        // Nothing is sent this way after the request: read and ignore it; end of file means closed.
        var scratch = [UInt8](repeating: 0, count: 512)
        return scratch.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) } == 0
    }

    private func write(_ kind: FrameKind, _ bytes: [UInt8]) -> Bool {
        guard !failed else { return false }
        if !FrameChannel(fd: fd, maxPayload: 0).send(kind, bytes) { failed = true }
        return !failed
    }
}

/// Sends all of `bytes` on a connected socket (never raising SIGPIPE); false when the peer is gone.
@discardableResult
func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let sent = bytes.withUnsafeBytes { raw in Glibc.send(fd, raw.baseAddress.map { $0 + offset }, raw.count - offset, Int32(MSG_NOSIGNAL)) }
        if sent < 0, errno == EINTR { continue }
        if sent <= 0 { return false }
        offset += sent
    }
    return true
}

/// The control socket's limits on what a client may send, and how long it may take.
public enum ControlLimits {
    /// The request line and header fields together.
    public static let maxHeaderBytes = 16 * 1024
    public static let maxHeaders = 64
    /// A request body (the largest is `POST /v1/data/protect`'s base64).
    public static let maxBodyBytes = 1024 * 1024
    /// Seconds a connection may take to send a request head: from when it is accepted, and from
    /// the end of each answer (then it is closed quietly: an idle kept-alive connection).
    public static let headSeconds: Int64 = 5
    /// Seconds a request may take from its head to the end of its body.
    public static let bodySeconds: Int64 = 10
}

/// The request target of the control socket's origin-form requests ("/a/b?x=1").
enum RequestTarget {
    /// Path and query; the query is "" when absent.
    static func split(_ target: String) -> (String, Substring) {
        guard let mark = target.firstIndex(of: "?") else { return (target, "") }
        return (String(target[..<mark]), target[target.index(after: mark)...])
    }

    /// "a=1&b&c=" → [a: 1, b: "", c: ""]; empty pairs and names are skipped, escapes decoded,
    /// the first of repeated names wins.
    static func query(_ text: Substring) -> [String: String] {
        var query: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let name: Substring, value: Substring
            if let equals = pair.firstIndex(of: "=") {
                name = pair[..<equals]
                value = pair[pair.index(after: equals)...]
            } else {
                (name, value) = (pair, "")
            }
            let key = String(name).removingPercentEncoding
            guard !key.isEmpty, query[key] == nil else { continue }
            query[key] = String(value).removingPercentEncoding
        }
        return query
    }

    /// Origin form, printable ASCII without spaces.
    static func isValid(_ target: String) -> Bool {
        target.hasPrefix("/") && target.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7f }
    }
}

extension String {
    /// Decodes %XX escapes (and leaves malformed ones as they are).
    var removingPercentEncoding: String {
        guard contains("%") else { return self }
        var bytes: [UInt8] = []
        var utf8 = Array(self.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "%"), utf8.count >= 2, let high = Self.hexValue(utf8[utf8.startIndex]),
               let low = Self.hexValue(utf8[utf8.startIndex + 1]) {
                bytes.append(high << 4 | low)
                utf8 = utf8.dropFirst(2)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}
