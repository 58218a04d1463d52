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
    /// A streamed body (chunked): the server calls it with a writer after the headers, on the
    /// connection's thread, and closes the connection when it returns.
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
        case 503: return "Service Unavailable"
        default: return "Status"
        }
    }

    func serialized() -> [UInt8] {
        if stream != nil {
            return Array("HTTP/1.1 \(status) \(Self.reason(status))\r\nContent-Type: \(contentType)\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n".utf8)
        }
        let head = "HTTP/1.1 \(status) \(Self.reason(status))\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n"
        return Array(head.utf8) + body
    }
}

/// Writes the chunks of a streamed response, and tells whether the client is still there.
final class StreamWriter: @unchecked Sendable {
    let fd: Int32
    private(set) var failed = false

    init(fd: Int32) { self.fd = fd }

    /// Sends one chunk; false once the client is gone.
    @discardableResult
    func send(_ bytes: [UInt8]) -> Bool {
        guard !bytes.isEmpty else { return !failed }
        let chunk = Array((String(bytes.count, radix: 16) + "\r\n").utf8) + bytes + [13, 10]
        return write(chunk)
    }

    /// Ends the stream (the zero-length chunk).
    func finish() { _ = write(Array("0\r\n\r\n".utf8)) }

    /// True when the client has closed its end (checked without waiting).
    var clientClosed: Bool {
        if failed { return true }
        var poller = pollfd(fd: fd, events: Int16(POLLIN) | Int16(0x2000), revents: 0)
        guard poll(&poller, 1, 0) > 0 else { return false }
        if poller.revents & (Int16(0x2000) | Int16(POLLHUP) | Int16(POLLERR)) != 0 { return true }
        // Data after the request: read and ignore it; end of file means closed.
        var scratch = [UInt8](repeating: 0, count: 512)
        return scratch.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) } == 0
    }

    private func write(_ bytes: [UInt8]) -> Bool {
        guard !failed else { return false }
        if !sendAll(fd, bytes) { failed = true }
        return !failed
    }
}

/// Sends all of `bytes` on a connected socket (never raising SIGPIPE); false when the peer is gone.
@discardableResult
func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var offset = 0
    while offset < bytes.count {
        let sent = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
        if sent < 0, errno == EINTR { continue }
        if sent <= 0 { return false }
        offset += sent
    }
    return true
}

/// Why a request could not be read; each becomes an error response (or a dropped connection).
enum HTTPReadError: Error {
    case closed
    case timedOut
    case headersTooLarge
    case bodyTooLarge
    case malformed(String)
}

/// Reads one request from `fd` within the limits (the socket has a receive timeout set).
struct HTTPReader {
    static let maxHeaderBytes = 16 * 1024
    static let maxBodyBytes = 1024 * 1024

    let fd: Int32

    func read() throws(HTTPReadError) -> HTTPRequest {
        var buffer: [UInt8] = []
        var headerEnd: Int?
        var chunk = [UInt8](repeating: 0, count: 4096)
        while headerEnd == nil {
            let count = receive(&chunk)
            if count == 0 { throw buffer.isEmpty ? .closed : .malformed("connection closed inside the headers") }
            if count < 0 { throw errno == EAGAIN || errno == EWOULDBLOCK ? .timedOut : .closed }
            buffer += chunk[0..<count]
            headerEnd = Self.find([13, 10, 13, 10], in: buffer)
            if headerEnd == nil, buffer.count > Self.maxHeaderBytes { throw .headersTooLarge }
        }
        guard let end = headerEnd else { throw .malformed("no end of headers") }
        if end > Self.maxHeaderBytes { throw .headersTooLarge }
        guard let head = String(validating: buffer[0..<end], as: UTF8.self) else { throw .malformed("headers are not UTF-8") }
        var lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)
        guard !lines.isEmpty else { throw .malformed("empty request") }
        let requestLine = lines.removeFirst().split(separator: " ")
        guard requestLine.count == 3, requestLine[2].hasPrefix("HTTP/1.") else { throw .malformed("bad request line") }
        var headers: [String: String] = [:]
        for line in lines where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { throw .malformed("bad header line") }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: " \t")
        }
        if headers["transfer-encoding"] != nil { throw .malformed("chunked bodies are not accepted; send Content-Length") }
        let length = Int(headers["content-length"] ?? "0") ?? -1
        guard length >= 0 else { throw .malformed("bad Content-Length") }
        guard length <= Self.maxBodyBytes else { throw .bodyTooLarge }
        var body = Array(buffer[(end + 4)...])
        while body.count < length {
            let count = receive(&chunk)
            if count == 0 { throw .malformed("connection closed inside the body") }
            if count < 0 { throw errno == EAGAIN || errno == EWOULDBLOCK ? .timedOut : .closed }
            body += chunk[0..<count]
        }
        if body.count > length { body.removeLast(body.count - length) }
        let target = String(requestLine[1])
        let parts = target.split(separator: "?", maxSplits: 1)
        var query: [String: String] = [:]
        if parts.count == 2 {
            for pair in parts[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1)
                query[String(kv[0]).removingPercentEncoding] = kv.count > 1 ? String(kv[1]).removingPercentEncoding : ""
            }
        }
        return HTTPRequest(method: String(requestLine[0]), path: String(parts.first ?? "/").removingPercentEncoding,
                           query: query, headers: headers, body: body)
    }

    private func receive(_ chunk: inout [UInt8]) -> Int {
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            return count
        }
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for index in 0...(haystack.count - needle.count) where haystack[index] == needle[0] {
            if Array(haystack[index..<(index + needle.count)]) == needle { return index }
        }
        return nil
    }
}

extension String {
    /// Decodes %XX escapes (and leaves malformed ones as they are).
    var removingPercentEncoding: String {
        guard contains("%") else { return self }
        var bytes: [UInt8] = []
        var utf8 = Array(self.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "%"), utf8.count >= 2, let value = UInt8(String(decoding: utf8.prefix(2), as: UTF8.self), radix: 16) {
                bytes.append(value)
                utf8 = utf8.dropFirst(2)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
