import CustodySystem
import Glibc

/// One HTTP/1.1 request, as read from a control socket connection.
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

    /// The status line and headers; a streamed answer announces chunked transfer.
    func serializedHead(streamed: Bool) -> [UInt8] {
        var head = "HTTP/1.1 \(status) \(Self.reason(status))\r\nContent-Type: \(Self.clean(contentType))\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { head += "\(Self.clean(name)): \(Self.clean(value))\r\n" }
        head += streamed ? "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n" : "Content-Length: \(body.count)\r\n"
        head += "Connection: close\r\n\r\n"
        return Array(head.utf8)
    }

    func serialized() -> [UInt8] { serializedHead(streamed: false) + body }

    /// A header field without line breaks or other control characters.
    private static func clean(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7f }))
    }

    /// One chunk of a chunked body (RFC 9112 7.1); the last one is `chunk([])`.
    static func chunk(_ bytes: [UInt8]) -> [UInt8] {
        Array((String(bytes.count, radix: 16) + "\r\n").utf8) + bytes + [13, 10]
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

/// Why a request could not be read; each becomes an error response (or a dropped connection).
public enum HTTPReadError: Error, Equatable {
    case closed
    case timedOut
    case headersTooLarge
    case bodyTooLarge
    case malformed(String)
}

/// The head of a request: what comes before the blank line, parsed and checked.
public struct HTTPRequestHead: Sendable, Equatable {
    public var method: String
    /// The path as sent (percent escapes kept, so an escaped "/" cannot make a new segment).
    public var path: String
    public var query: [String: String]
    public var headers: [String: String]
    public var contentLength: Int
}

/// The request grammar of the control socket (RFC 9112, the subset a JSON API needs): pure
/// functions over bytes, so the fuzzer drives them without a socket. Every input gives a head or
/// an `HTTPReadError`; none traps.
public enum HTTPParser {
    public static let maxHeaderBytes = 16 * 1024
    public static let maxBodyBytes = 1024 * 1024
    static let maxHeaders = 64

    /// Parses the bytes before the blank line (without it).
    public static func parseHead(_ bytes: ArraySlice<UInt8>) throws(HTTPReadError) -> HTTPRequestHead {
        guard bytes.count <= maxHeaderBytes else { throw .headersTooLarge }
        guard let head = String(validating: bytes, as: UTF8.self) else { throw .malformed("headers are not UTF-8") }
        var lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)[...]
        // RFC 9112 2.2: empty lines before the request line are ignored.
        while let first = lines.first, first.isEmpty { lines = lines.dropFirst() }
        guard let requestLine = lines.popFirst() else { throw .malformed("empty request") }
        let parts = requestLine.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw .malformed("bad request line") }
        let method = String(parts[0]), target = String(parts[1]), version = parts[2]
        guard !method.isEmpty, method.utf8.count <= 16, method.utf8.allSatisfy(isTokenByte) else { throw .malformed("bad method") }
        guard version == "HTTP/1.1" || version == "HTTP/1.0" else { throw .malformed("unsupported HTTP version") }
        guard target.hasPrefix("/"), target.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f }) else { throw .malformed("bad request target") }
        var headers: [String: String] = [:]
        var count = 0
        for line in lines where !line.isEmpty {
            count += 1
            guard count <= maxHeaders else { throw .headersTooLarge }
            guard let colon = line.firstIndex(of: ":") else { throw .malformed("bad header line") }
            let name = line[..<colon]
            guard !name.isEmpty, name.utf8.allSatisfy(isTokenByte) else { throw .malformed("bad header name") }
            let value = line[line.index(after: colon)...].trimmingCharacters(in: " \t")
            guard value.utf8.allSatisfy({ $0 == 0x09 || $0 >= 0x20 && $0 != 0x7f }) else { throw .malformed("bad header value") }
            let key = name.lowercased()
            if let earlier = headers[key] {
                // Repeated Content-Length values must agree (RFC 9110 8.6); others are joined.
                if key == "content-length" {
                    guard earlier == value else { throw .malformed("conflicting Content-Length") }
                    continue
                }
                headers[key] = earlier + ", " + value
            } else {
                headers[key] = value
            }
        }
        if headers["transfer-encoding"] != nil { throw .malformed("chunked bodies are not accepted; send Content-Length") }
        var length = 0
        if let text = headers["content-length"] {
            guard !text.isEmpty, text.utf8.count <= 9, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let value = Int(text) else {
                throw .malformed("bad Content-Length")
            }
            length = value
        }
        guard length <= maxBodyBytes else { throw .bodyTooLarge }
        let (path, queryText) = splitTarget(target)
        return HTTPRequestHead(method: method, path: path, query: parseQuery(queryText), headers: headers, contentLength: length)
    }

    /// Path and query of an origin-form target ("/a/b?x=1"); the query is "" when absent.
    static func splitTarget(_ target: String) -> (String, Substring) {
        guard let mark = target.firstIndex(of: "?") else { return (target, "") }
        return (String(target[..<mark]), target[target.index(after: mark)...])
    }

    /// "a=1&b&c=" → [a: 1, b: "", c: ""]; empty pairs and names are skipped, escapes decoded,
    /// the first of repeated names wins.
    static func parseQuery(_ text: Substring) -> [String: String] {
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

    /// RFC 9110 `tchar`s besides letters and digits.
    private static let tokenPunctuation = Array("!#$%&'*+-.^_`|~".utf8)

    static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"): return true
        default: return tokenPunctuation.contains(byte)
        }
    }

    /// Where the blank line ending the head starts in `bytes`, searching from `from`.
    static func endOfHead(_ bytes: [UInt8], from: Int) -> Int? {
        var index = max(0, from)
        while index + 3 < bytes.count {
            if bytes[index] == 13, bytes[index + 1] == 10, bytes[index + 2] == 13, bytes[index + 3] == 10 { return index }
            index += 1
        }
        return nil
    }

    /// A whole request in one buffer (the fuzzer's entry; the socket reader does the same in steps).
    public static func parse(_ bytes: [UInt8]) throws(HTTPReadError) -> HTTPRequest {
        guard let end = endOfHead(bytes, from: 0) else { throw bytes.count > maxHeaderBytes ? .headersTooLarge : .malformed("no end of headers") }
        let head = try parseHead(bytes[..<end])
        let body = bytes[(end + 4)...]
        guard body.count >= head.contentLength else { throw .malformed("connection closed inside the body") }
        return HTTPRequest(head: head, body: Array(body.prefix(head.contentLength)))
    }
}

extension HTTPRequest {
    public init(head: HTTPRequestHead, body: [UInt8]) {
        self.init(method: head.method, path: head.path, query: head.query, headers: head.headers, body: body)
    }
}

/// Reads one request from `fd` within the limits and deadlines: the head must be complete within
/// `headSeconds` of the start and the whole request within `requestSeconds`, however slowly the
/// bytes trickle in (each receive waits only for what is left).
struct HTTPReader {
    let fd: Int32
    var headSeconds: Double = 5
    var requestSeconds: Double = 10

    func read() throws(HTTPReadError) -> HTTPRequest {
        let start = monotonicSeconds()
        var buffer: [UInt8] = []
        var headerEnd: Int?
        var chunk = [UInt8](repeating: 0, count: 4096)
        while headerEnd == nil {
            let count = try receive(&chunk, until: start + headSeconds)
            if count == 0 { throw buffer.isEmpty ? .closed : .malformed("connection closed inside the headers") }
            let searchFrom = buffer.count - 3
            buffer += chunk[0..<count]
            headerEnd = HTTPParser.endOfHead(buffer, from: searchFrom)
            if headerEnd == nil, buffer.count > HTTPParser.maxHeaderBytes { throw .headersTooLarge }
        }
        guard let end = headerEnd else { throw .malformed("no end of headers") }
        let head = try HTTPParser.parseHead(buffer[..<end])
        var body = Array(buffer[(end + 4)...])
        while body.count < head.contentLength {
            let count = try receive(&chunk, until: start + requestSeconds)
            if count == 0 { throw .malformed("connection closed inside the body") }
            body += chunk[0..<count]
        }
        if body.count > head.contentLength { body.removeLast(body.count - head.contentLength) }
        return HTTPRequest(head: head, body: body)
    }

    /// One receive that waits at most until `deadline` (monotonic seconds).
    private func receive(_ chunk: inout [UInt8], until deadline: Double) throws(HTTPReadError) -> Int {
        while true {
            let left = deadline - monotonicSeconds()
            guard left > 0 else { throw .timedOut }
            var timeout = timeval(tv_sec: Int(left), tv_usec: Int((left - left.rounded(.down)) * 1e6) + 1)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            let count = chunk.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            if count < 0 { throw errno == EAGAIN || errno == EWOULDBLOCK ? .timedOut : .closed }
            return count
        }
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
