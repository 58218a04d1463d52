import Glibc

/// One line of `/proc/self/mountinfo`.
public struct MountEntry: Sendable, Equatable {
    public var mountPoint: String
    public var fileSystemType: String
    public var source: String
    /// The file system's device number as "major:minor" (the name of its `/sys/class/bdi` entry).
    public var device: String = ""
    /// The mount's ID (the first field; `mnt_id` in /proc/PID/fdinfo/FD).
    public var id: Int = 0

    public init(mountPoint: String, fileSystemType: String, source: String, device: String = "", id: Int = 0) {
        self.mountPoint = mountPoint
        self.fileSystemType = fileSystemType
        self.source = source
        self.device = device
        self.id = id
    }
}

/// Reads the kernel's mount table (`/proc/self/mountinfo`).
public enum MountTable {
    public static func entries() -> [MountEntry] {
        guard let text = readTextFile("/proc/self/mountinfo") else { return [] }
        var result: [MountEntry] = []
        for line in text.split(separator: "\n") {
            // id parent major:minor root mountpoint options [optional fields] - fstype source superopts
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count >= 10, let dash = fields.firstIndex(of: "-"), dash + 2 < fields.count else { continue }
            result.append(MountEntry(
                mountPoint: unescape(fields[4]),
                fileSystemType: String(fields[dash + 1]),
                source: unescape(fields[dash + 2]),
                device: String(fields[2]),
                id: Int(fields[0]) ?? 0))
        }
        return result
    }

    /// The entry mounted exactly at `path` (an absolute, resolved path), if any; the last one wins,
    /// as it is the one that is visible.
    public static func entry(at path: String) -> MountEntry? {
        entries().last { $0.mountPoint == path }
    }

    /// mountinfo escapes space, tab, newline and backslash as three octal digits.
    static func unescape(_ field: Substring) -> String {
        guard field.contains("\\") else { return String(field) }
        var bytes: [UInt8] = []
        var utf8 = Array(field.utf8)[...]
        while let byte = utf8.popFirst() {
            if byte == UInt8(ascii: "\\"), utf8.count >= 3,
               let value = UInt8(String(decoding: utf8.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(value)
                utf8 = utf8.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

/// Reads a whole (small) file as UTF-8 text; nil when it cannot be read.
public func readTextFile(_ path: String) -> String? {
    let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { Glibc.close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        if n < 0 { if errno == EINTR { continue }; return nil }
        if n == 0 { break }
        bytes.append(contentsOf: chunk[0..<n])
    }
    return String(decoding: bytes, as: UTF8.self)
}

/// The absolute, symlink-free form of `path`, or nil when it does not resolve.
public func resolvedPath(_ path: String) -> String? {
    guard let resolved = realpath(path, nil) else { return nil }
    defer { free(resolved) }
    return String(cString: resolved)
}
