import Glibc

/// A name in a directory as the file system holds it: bytes, not text.
///
/// A Linux name may hold any byte but NUL and `/`, and need not be UTF-8. A Swift `String` made
/// from it replaces the bytes that are not UTF-8 (and so names another file, or none), and two
/// Strings compare equal when they are canonically equivalent ("é" and "e" + U+0301 are two
/// files but one String). Whatever reaches a file by a name it read from a directory or a link
/// (a wipe, a re-protection, a census) carries the name as this type.
public struct FileName: Hashable, Sendable, CustomStringConvertible {
    /// The bytes followed by one NUL: passes wherever a C string is asked for.
    public let cString: [CChar]

    /// The name whose bytes are `bytes` (up to a first NUL, if any).
    @inlinable
    public init(bytes: some Sequence<UInt8>) {
        // Arrays and native strings (every stored name the mount makes): one copy.
        if let copied = bytes.withContiguousStorageIfAvailable({ Self.cString(copying: UnsafeRawBufferPointer($0)) }) {
            cString = copied
            return
        }
        var cString = bytes.prefix { $0 != 0 }.map { CChar(bitPattern: $0) }
        cString.append(0)
        self.cString = cString
    }

    /// `bytes` up to a first NUL, if any, and a NUL.
    @usableFromInline
    static func cString(copying bytes: UnsafeRawBufferPointer) -> [CChar] {
        let length = bytes.firstIndex(of: 0) ?? bytes.count
        return [CChar](unsafeUninitializedCapacity: length + 1) { buffer, initialized in
            if let target = buffer.baseAddress {
                if length > 0, let source = bytes.baseAddress { UnsafeMutableRawPointer(target).copyMemory(from: source, byteCount: length) }
                target[length] = 0
                initialized = length + 1
            }
        }
    }

    /// The name a C string spells.
    @inlinable
    public init(cString: UnsafePointer<CChar>) {
        self.cString = Array(UnsafeBufferPointer(start: cString, count: strlen(cString) + 1))
    }

    /// The name whose C string `terminated` is, ending in its one NUL (taken as it is, no copy:
    /// for names built in place). A NUL before the end cuts the name there.
    @inlinable
    public init(terminated: [CChar]) {
        guard let end = terminated.firstIndex(of: 0) else {
            self.cString = terminated + [0]
            return
        }
        self.cString = end == terminated.count - 1 ? terminated : Array(terminated[...end])
    }

    /// The name spelled by `text` in UTF-8.
    public init(_ text: String) { self.init(bytes: text.utf8) }

    /// The bytes, without the NUL.
    public var bytes: [UInt8] {
        cString.withUnsafeBytes { all in [UInt8](UnsafeRawBufferPointer(rebasing: all.dropLast())) }
    }

    /// Calls `body` with the bytes, without the NUL (no copy). Inlinable, as every name of every
    /// request passes here: specialised where it is called rather than generic at run time.
    @inlinable
    public func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try cString.withBytes { (all) throws(E) in try body(UnsafeRawBufferPointer(rebasing: all.dropLast())) }
    }

    /// Its length in bytes.
    @inlinable
    public var count: Int { cString.count - 1 }

    /// The bytes hashed in one piece (an array hashes element by element): names key the inode
    /// table's index of listed names, looked at by every removal.
    @inlinable
    public func hash(into hasher: inout Hasher) {
        cString.withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    public var isEmpty: Bool { cString.count == 1 }

    /// `.` or `..`.
    public var isDotOrDotDot: Bool {
        let dot = CChar(UInt8(ascii: "."))
        return (count == 1 && cString[0] == dot) || (count == 2 && cString[0] == dot && cString[1] == dot)
    }

    /// Whether the name starts with the bytes of `prefix`.
    public func hasPrefix(_ prefix: String) -> Bool {
        cString.dropLast().lazy.map { UInt8(bitPattern: $0) }.starts(with: prefix.utf8)
    }

    /// The name as text when it is UTF-8 (nil otherwise).
    public var text: String? {
        let bytes = self.bytes
        let text = String(decoding: bytes, as: UTF8.self)
        return text.utf8.elementsEqual(bytes) ? text : nil
    }

    /// For messages and logs: the name with every byte that is not UTF-8 shown as `\xNN`.
    public var description: String {
        if let text { return text }
        var shown = ""
        var rest = bytes[...]
        while !rest.isEmpty {
            // The longest valid UTF-8 run at the start, else one byte escaped.
            var valid = min(rest.count, 4)
            while valid > 0, String(validating: rest.prefix(valid), as: UTF8.self) == nil { valid -= 1 }
            if valid > 0 {
                shown += String(decoding: rest.prefix(valid), as: UTF8.self)
                rest = rest.dropFirst(valid)
            } else if let byte = rest.first {
                shown += "\\x" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
                rest = rest.dropFirst()
            }
        }
        return shown
    }

    /// `directory` and this name joined by one `/` (a path for messages and the /proc fallbacks).
    public func appended(to directory: FileName) -> FileName {
        FileName(bytes: directory.bytes + [UInt8(ascii: "/")] + bytes)
    }
}

extension String {
    /// Paths compared as the kernel compares them: byte for byte. (`==` on String compares by
    /// canonical equivalence, under which two different files' paths can be equal.)
    public func bytesEqual(_ other: String) -> Bool { utf8.elementsEqual(other.utf8) }

    /// Whether the UTF-8 bytes start with those of `prefix`. (`hasPrefix` compares Characters:
    /// a slash followed by a combining mark is one Character, and not a slash.)
    public func hasBytePrefix(_ prefix: String) -> Bool { utf8.starts(with: prefix.utf8) }

    /// The text after the first `count` UTF-8 bytes (a count from `hasBytePrefix`'s prefix).
    public func droppingBytes(_ count: Int) -> String { String(decoding: utf8.dropFirst(count), as: UTF8.self) }

    /// Starts with a slash (byte-wise).
    public var isAbsolutePath: Bool { utf8.first == UInt8(ascii: "/") }

    /// Whether `self` is `directory` or lies below it (byte-wise, both normalized).
    public func isPath(inside directory: String) -> Bool {
        if directory.bytesEqual("/") || bytesEqual(directory) { return true }
        let prefix = directory.utf8.last == UInt8(ascii: "/") ? directory : directory + "/"
        return hasBytePrefix(prefix)
    }

    /// The names between slashes (empty ones left out), split on the slash byte.
    public var pathComponents: [String] {
        utf8.split(separator: UInt8(ascii: "/")).map { String(decoding: $0, as: UTF8.self) }
    }
}
