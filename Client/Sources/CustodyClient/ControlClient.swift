@_exported import CustodyAPI
import FoundationEssentials
import Glibc

/// Why a call to the daemon failed.
public enum CustodyClientError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The control socket is not there or refuses connections.
    case cannotConnect(path: String, errno: Int32)
    /// The daemon answered with an error (`{code, name, message}`; `status` is the HTTP status).
    case server(status: Int, code: Int, name: String, message: String)
    /// The answer could not be read or understood.
    case badResponse(String)
    /// A stream that follows the daemon (`GET /v1/events`) was cut: the daemon stopped or
    /// restarted. Open a new one; a restarted daemon numbers its events from 1 again.
    case streamEnded(path: String)

    public var description: String {
        switch self {
        case .cannotConnect(let path, let errno): return "cannot reach custodyd at \(path): \(String(cString: strerror(errno)))"
        case .server(_, let code, let name, let message): return "\(message) (\(code) \(name))"
        case .badResponse(let reason): return "unexpected answer from custodyd: \(reason)"
        case .streamEnded(let path): return "custodyd at \(path) ended the stream (it stopped or restarted)"
        }
    }

    /// The API's stable error code, when the daemon sent one.
    public var code: Int? {
        if case .server(_, let code, _, _) = self { return code }
        return nil
    }

    public var name: String? {
        if case .server(_, _, let name, _) = self { return name }
        return nil
    }
}

/// One answer from the daemon.
public struct ControlResponse: Sendable {
    public var status: Int
    public var body: [UInt8]

    public var text: String { String(decoding: body, as: UTF8.self) }
}

/// A blocking HTTP/1.1 client for the control socket (one request per connection, as the daemon
/// serves them). The managers wrap it in async calls; `custodyctl` uses it directly.
public struct ControlClient: Sendable {
    public let socketPath: String
    public var timeoutSeconds: Int = 600

    /// The socket at `path`, else `$CUSTODY_SOCKET`, else the daemon's default (root:
    /// /run/custody/control.sock; others: $XDG_RUNTIME_DIR/custody.sock).
    public init(socketPath path: String? = nil) {
        socketPath = path ?? Self.defaultSocketPath()
    }

    public static func defaultSocketPath() -> String {
        if let configured = getenv("CUSTODY_SOCKET"), configured.pointee != 0 { return String(cString: configured) }
        if geteuid() == 0 || access("/run/custody/control.sock", F_OK) == 0 { return "/run/custody/control.sock" }
        let runtime = getenv("XDG_RUNTIME_DIR").map { String(cString: $0) } ?? "/tmp"
        return runtime + "/custody.sock"
    }

    /// Sends a request and returns the answer, whatever its status.
    public func send(_ method: String, _ path: String, body: [UInt8]? = nil) throws(CustodyClientError) -> ControlResponse {
        let fd = try connect()
        defer { close(fd) }
        try write(fd, request(method, path, body))
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            if count < 0 { throw .badResponse("read failed: \(String(cString: strerror(errno)))") }
            if count == 0 { break }
            bytes += chunk[0..<count]
        }
        let (status, headers, rest) = try Self.parseHead(bytes)
        let body = headers["transfer-encoding"] == "chunked" ? Self.dechunk(rest) : rest
        return ControlResponse(status: status, body: body)
    }

    /// Sends a request to `endpoint` (with its path parameter and query) and decodes a
    /// successful answer as `T`; error answers throw `.server`.
    public func call<T: Decodable>(_ endpoint: Endpoint, _ parameter: String = "", query: [(String, String)] = [],
                                   json: (any Encodable)? = nil, as type: T.Type = T.self) throws(CustodyClientError) -> T {
        try call(endpoint.method, endpoint.path(parameter, query: query), json: json, as: type)
    }

    /// Sends a request and decodes a successful answer as `T`; error answers throw `.server`.
    public func call<T: Decodable>(_ method: String, _ path: String, json: (any Encodable)? = nil, as type: T.Type = T.self) throws(CustodyClientError) -> T {
        let response = try send(method, path, body: try json.map { (value) throws(CustodyClientError) in try Self.encode(value) })
        try Self.check(response)
        do {
            return try JSONDecoder().decode(T.self, from: Data(response.body.isEmpty ? Array("{}".utf8) : response.body))
        } catch {
            throw .badResponse("\(error)")
        }
    }

    /// Streams newline-delimited lines of a chunked answer to `line` until it returns false or
    /// the daemon ends the stream. True when the daemon ended the answer itself; false when
    /// `line` stopped it or the connection was cut first. `connected`, when given, gets the
    /// socket before anything is sent (another thread may `shutdown` it to stop the stream) and
    /// `closing` is called just before it is closed.
    @discardableResult
    public func stream(_ path: String, connected: ((Int32) -> Void)? = nil, closing: (() -> Void)? = nil,
                       _ line: (String) -> Bool) throws(CustodyClientError) -> Bool {
        let fd = try connect()
        defer {
            closing?()
            close(fd)
        }
        connected?(fd)
        try write(fd, request("GET", path, nil))
        var buffer: [UInt8] = []
        var headerDone = false
        var decoder = ChunkDecoder()
        var pending: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EINTR { continue }
            if count <= 0 { return false }
            if !headerDone {
                buffer += chunk[0..<count]
                guard let end = Self.find([13, 10, 13, 10], in: buffer) else { continue }
                let (status, _, rest) = try Self.parseHead(buffer)
                headerDone = true
                if status >= 300 {
                    try Self.check(ControlResponse(status: status, body: rest))
                }
                pending += decoder.feed(Array(buffer[(end + 4)...]))
            } else {
                pending += decoder.feed(Array(chunk[0..<count]))
            }
            while let newline = pending.firstIndex(of: 10) {
                let text = String(decoding: pending[..<newline], as: UTF8.self)
                pending.removeSubrange(...newline)
                if !line(text) { return false }
            }
            if decoder.finished { return true }
        }
    }

    /// What `identity` owns in the mounts (`GET /v1/accounts/{identity}/files`), line by line as
    /// the daemon walks them, to `visit` until it returns false; with `wipe`, only what a wipe of
    /// it would delete. The last line is the summary. Administrators only.
    public func ownedFiles(_ identity: String, wipe: Bool = false, _ visit: (CustodyOwnedLine) -> Bool) throws(CustodyClientError) {
        var bad: String?
        try stream(Endpoint.ownedFiles.path(identity, query: [("wipe", String(wipe))])) { text in
            guard let line = CustodyOwnedLine(json: Array(text.utf8)) else {
                bad = text
                return false
            }
            return visit(line)
        }
        if let bad { throw .badResponse("not a line of a file listing: \(bad)") }
    }

    /// The empty answer (204).
    public struct Empty: Decodable, Sendable {}

    // MARK: Pieces

    /// A request body as JSON.
    public static func encode(_ value: any Encodable) throws(CustodyClientError) -> [UInt8] {
        do { return Array(try JSONEncoder().encode(value)) } catch { throw .badResponse("cannot encode the request: \(error)") }
    }

    /// Throws `.server` (with the API's code and name) for an error answer.
    public static func check(_ response: ControlResponse) throws(CustodyClientError) {
        guard response.status >= 300 else { return }
        if let failure = try? JSONDecoder().decode(ErrorAnswer.self, from: Data(response.body)) {
            throw .server(status: response.status, code: failure.code, name: failure.name, message: failure.message)
        }
        throw .server(status: response.status, code: response.status, name: "HTTP\(response.status)", message: response.text)
    }

    private func connect() throws(CustodyClientError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .cannotConnect(path: socketPath, errno: errno) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(socketPath.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            throw .cannotConnect(path: socketPath, errno: ENAMETOOLONG)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard result == 0 else {
            let error = errno
            close(fd)
            throw .cannotConnect(path: socketPath, errno: error)
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    private func request(_ method: String, _ path: String, _ body: [UInt8]?) -> [UInt8] {
        var head = "\(method) \(Self.percentEncode(path)) HTTP/1.1\r\nHost: custody\r\nConnection: close\r\n"
        if let body { head += "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n" }
        head += "\r\n"
        return Array(head.utf8) + (body ?? [])
    }

    private func write(_ fd: Int32, _ bytes: [UInt8]) throws(CustodyClientError) {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if sent < 0, errno == EINTR { continue }
            if sent <= 0 { throw .badResponse("the daemon closed the connection") }
            offset += sent
        }
    }

    /// Escapes what may not appear in a request target (spaces, controls, non-ASCII, `#`, `%`).
    static func percentEncode(_ path: String) -> String {
        var out = ""
        for byte in path.utf8 {
            if byte > 0x20, byte < 0x7F, byte != UInt8(ascii: "%"), byte != UInt8(ascii: "#") {
                out.unicodeScalars.append(UnicodeScalar(byte))
            } else {
                out += "%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
            }
        }
        return out
    }

    static func parseHead(_ bytes: [UInt8]) throws(CustodyClientError) -> (Int, [String: String], [UInt8]) {
        guard let end = find([13, 10, 13, 10], in: bytes) else { throw .badResponse("no complete header") }
        let lines = String(decoding: bytes[0..<end], as: UTF8.self).split(separator: "\r\n")
        guard let first = lines.first, first.hasPrefix("HTTP/1."), let status = Int(first.split(separator: " ").dropFirst().first ?? "") else {
            throw .badResponse("bad status line")
        }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = String(line[line.index(after: colon)...].drop { $0 == " " })
        }
        return (status, headers, Array(bytes[(end + 4)...]))
    }

    static func dechunk(_ bytes: [UInt8]) -> [UInt8] {
        var decoder = ChunkDecoder()
        return decoder.feed(bytes)
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for index in 0...(haystack.count - needle.count) where haystack[index] == needle[0] {
            if Array(haystack[index..<(index + needle.count)]) == needle { return index }
        }
        return nil
    }
}

/// Decodes a chunked body incrementally.
struct ChunkDecoder {
    private var buffer: [UInt8] = []
    private var remaining = 0
    private var inData = false
    private(set) var finished = false

    mutating func feed(_ bytes: [UInt8]) -> [UInt8] {
        buffer += bytes
        var out: [UInt8] = []
        while !finished {
            if inData {
                let take = min(remaining, buffer.count)
                out += buffer[0..<take]
                buffer.removeFirst(take)
                remaining -= take
                guard remaining == 0, buffer.count >= 2 else { break }
                buffer.removeFirst(2)
                inData = false
            } else {
                guard let end = ControlClient.find([13, 10], in: buffer) else { break }
                let size = Int(String(decoding: buffer[0..<end], as: UTF8.self).split(separator: ";").first ?? "", radix: 16) ?? 0
                buffer.removeFirst(end + 2)
                if size == 0 { finished = true } else { remaining = size; inData = true }
            }
        }
        return out
    }
}
