import Glibc

// What the control front (the unprivileged process that parses HTTP) and the daemon say to each
// other about one request, over a socket pair made for that request:
//
//   frame = kind (1 byte) · payload length (4 bytes, little-endian) · payload
//
//   front → daemon  "Q"  method, path, query (count, then name and value pairs), body
//   daemon → front  "R"  status (2 bytes), content type, extra headers (count, pairs), body
//                   "S"  status, content type: a streamed answer begins; then
//                   "C"  one chunk of it, any number of times, and
//                   "E"  its end (empty)
//
// Strings and byte fields are a 4-byte little-endian length and the bytes. Both sides check every
// length against what is left, so a frame from a confused or hostile peer is an error, never a trap.

enum FrameKind: UInt8 {
    case request = 0x51 // Q
    case response = 0x52 // R
    case streamHead = 0x53 // S
    case chunk = 0x43 // C
    case end = 0x45 // E

    /// A frame head's kind byte and payload length, checked: a known kind, a length within
    /// `maxPayload`. Both readers of frames (blocking and on the event loop) use it.
    static func checked(_ byte: UInt8, length: Int, maxPayload: Int) throws(ForwardingError) -> FrameKind {
        guard let kind = FrameKind(rawValue: byte) else { throw ForwardingError("unknown frame kind \(byte)") }
        guard length <= maxPayload else { throw ForwardingError("frame of \(length) bytes is over the limit") }
        return kind
    }
}

public struct ForwardingError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Builds a frame's payload.
struct WireWriter {
    private(set) var bytes: [UInt8] = []

    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u16(_ value: Int) { bytes += [UInt8(truncatingIfNeeded: value), UInt8(truncatingIfNeeded: value >> 8)] }
    mutating func u32(_ value: Int) {
        let word = UInt32(truncatingIfNeeded: value)
        bytes += [UInt8(truncatingIfNeeded: word), UInt8(truncatingIfNeeded: word >> 8), UInt8(truncatingIfNeeded: word >> 16), UInt8(truncatingIfNeeded: word >> 24)]
    }
    mutating func data(_ value: [UInt8]) {
        u32(value.count)
        bytes += value
    }
    mutating func string(_ value: String) { data(Array(value.utf8)) }
    mutating func pairs(_ value: [String: String]) {
        u32(value.count)
        for (name, text) in value.sorted(by: { $0.key < $1.key }) {
            string(name)
            string(text)
        }
    }
}

/// Reads a frame's payload; every read checks what is left.
struct WireReader {
    private let bytes: [UInt8]
    private var offset = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var isAtEnd: Bool { offset == bytes.count }

    mutating func take(_ count: Int) throws(ForwardingError) -> ArraySlice<UInt8> {
        guard count >= 0, count <= bytes.count - offset else { throw ForwardingError("frame field runs past its end") }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    mutating func u8() throws(ForwardingError) -> UInt8 {
        let field = try take(1)
        return field[field.startIndex]
    }

    mutating func u16() throws(ForwardingError) -> Int {
        let field = try take(2)
        return Int(field[field.startIndex]) | Int(field[field.startIndex + 1]) << 8
    }

    mutating func u32() throws(ForwardingError) -> Int {
        let field = try take(4)
        var value = 0
        for (shift, byte) in zip(stride(from: 0, to: 32, by: 8), field) { value |= Int(byte) << shift }
        return value
    }

    mutating func data() throws(ForwardingError) -> [UInt8] { Array(try take(try u32())) }

    mutating func string() throws(ForwardingError) -> String {
        let field = try data()
        guard let text = String(validating: field, as: UTF8.self) else { throw ForwardingError("frame string is not UTF-8") }
        return text
    }

    mutating func pairs(limit: Int = 256) throws(ForwardingError) -> [String: String] {
        let count = try u32()
        guard count <= limit else { throw ForwardingError("too many pairs in a frame") }
        var result: [String: String] = [:]
        for _ in 0..<count {
            let name = try string()
            result[name] = try string()
        }
        return result
    }
}

/// One socket of a request's pair: frames in and out, with blocking I/O.
struct FrameChannel {
    let fd: Int32
    /// The largest payload accepted (requests carry at most a 1 MiB body; answers may be larger).
    var maxPayload: Int

    @discardableResult
    func send(_ kind: FrameKind, _ payload: [UInt8]) -> Bool { sendAll(fd, Self.frame(kind, payload)) }

    /// A whole frame: kind, length, payload.
    static func frame(_ kind: FrameKind, _ payload: [UInt8]) -> [UInt8] {
        var frame = WireWriter()
        frame.u8(kind.rawValue)
        frame.data(payload)
        return frame.bytes
    }

    /// The next frame, or an error (end of file, a short read, an unknown kind, too large).
    func receive() throws(ForwardingError) -> (FrameKind, [UInt8]) {
        var head = WireReader(try readExactly(5))
        let byte = try head.u8()
        let length = try head.u32()
        let kind = try FrameKind.checked(byte, length: length, maxPayload: maxPayload)
        return (kind, try readExactly(length))
    }

    private func readExactly(_ count: Int) throws(ForwardingError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let got = bytes.withUnsafeMutableBytes { raw in
                Glibc.recv(fd, raw.baseAddress.map { $0 + done }, count - done, 0)
            }
            if got < 0, errno == EINTR { continue }
            guard got > 0 else { throw ForwardingError(got == 0 ? "peer closed" : "receive failed: errno \(errno)") }
            done += got
        }
        return bytes
    }
}

extension HTTPRequest {
    /// The "Q" frame's payload (headers are not forwarded: nothing past the front reads them).
    func forwardedPayload() -> [UInt8] {
        var writer = WireWriter()
        writer.string(method)
        writer.string(path)
        writer.pairs(query)
        writer.data(body)
        return writer.bytes
    }

    init(forwarded payload: [UInt8]) throws(ForwardingError) {
        var reader = WireReader(payload)
        let method = try reader.string()
        let path = try reader.string()
        let query = try reader.pairs()
        let body = try reader.data()
        guard reader.isAtEnd else { throw ForwardingError("trailing bytes in a request frame") }
        guard body.count <= ControlLimits.maxBodyBytes else { throw ForwardingError("request body over the limit") }
        self.init(method: method, path: path, query: query, headers: [:], body: body)
    }
}

extension HTTPResponse {
    /// The "R" (or, for a streamed answer, "S") frame's payload.
    func forwardedPayload() -> [UInt8] {
        var writer = WireWriter()
        writer.u16(status)
        writer.string(contentType)
        writer.pairs(headers)
        if stream == nil { writer.data(body) }
        return writer.bytes
    }

    init(forwarded payload: [UInt8], streamed: Bool) throws(ForwardingError) {
        var reader = WireReader(payload)
        let status = try reader.u16()
        guard (100...599).contains(status) else { throw ForwardingError("status \(status) out of range") }
        let contentType = try reader.string()
        let headers = try reader.pairs()
        let body = streamed ? [] : try reader.data()
        guard reader.isAtEnd else { throw ForwardingError("trailing bytes in a response frame") }
        self.init(status: status, body: body, contentType: contentType)
        self.headers = headers
    }
}
