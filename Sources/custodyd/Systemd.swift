import Glibc

/// The service manager's side channels, without libsystemd: readiness and status on
/// `$NOTIFY_SOCKET` (sd_notify's datagram protocol), the watchdog interval from `$WATCHDOG_USEC`,
/// and sockets passed by socket activation (`$LISTEN_FDS`, from descriptor 3).
enum Systemd {
    /// Sends `state` (lines such as `READY=1`, `STATUS=…`) when started by a service manager.
    @discardableResult
    static func notify(_ state: String) -> Bool {
        guard let socketPath = getenv("NOTIFY_SOCKET").map({ String(cString: $0) }), !socketPath.isEmpty else { return false }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var bytes = Array(socketPath.utf8)
        // An abstract socket is written with a leading '@'.
        if bytes.first == UInt8(ascii: "@") { bytes[0] = 0 }
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count)
        let message = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                message.withUnsafeBytes { sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), address, length) }
            }
        }
        return sent == message.count
    }

    /// Half the watchdog timeout, when the manager wants pings from this process.
    static var watchdogInterval: Double? {
        guard let text = getenv("WATCHDOG_USEC").map({ String(cString: $0) }), let usec = Double(text), usec > 0 else { return nil }
        if let pid = getenv("WATCHDOG_PID").map({ String(cString: $0) }), Int32(pid) != getpid() { return nil }
        return usec / 1e6 / 2
    }

    /// The listening sockets passed to this process (socket activation), once: the variables are
    /// cleared so children do not take them.
    static func takeListenDescriptors() -> [Int32] {
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        guard let pid = getenv("LISTEN_PID").map({ String(cString: $0) }), Int32(pid) == getpid(),
              let count = getenv("LISTEN_FDS").map({ String(cString: $0) }).flatMap(Int32.init), count > 0 else { return [] }
        let descriptors = (0..<count).map { 3 + $0 }
        for fd in descriptors { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return descriptors
    }

    /// True when stderr goes to the journal (systemd sets `JOURNAL_STREAM` to its device:inode).
    static var stderrIsJournal: Bool {
        guard let stream = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        let parts = stream.split(separator: ":")
        var info = stat()
        guard parts.count == 2, fstat(2, &info) == 0 else { return false }
        return UInt64(parts[0]) == UInt64(info.st_dev) && UInt64(parts[1]) == UInt64(info.st_ino)
    }
}
