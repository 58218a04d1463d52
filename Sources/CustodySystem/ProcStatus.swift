import Glibc

/// Fields of a task's /proc/PID/status (or /proc/TID/status for one thread).
public enum ProcStatus {
    /// The whitespace-separated values of the line starting with `field` (such as `"Uid:"`) in
    /// task `pid`'s status; nil when the task is gone or has no such line.
    public static func values(_ field: String, of pid: Int32) -> [Substring]? {
        guard let text = readTextFile("/proc/\(pid)/status") else { return nil }
        return values(field, in: text)
    }

    /// The whitespace-separated values of the line starting with `field` in a status text.
    public static func values(_ field: String, in text: String) -> [Substring]? {
        for line in text.split(separator: "\n") where line.hasPrefix(field) {
            return line.dropFirst(field.count).split(whereSeparator: { $0 == " " || $0 == "\t" })
        }
        return nil
    }
}

/// Fields of /proc/PID/stat: the parent and the start time (what tells a task from a later one
/// with the same ID).
public struct ProcessStat: Sendable {
    public let parent: Int32
    /// Clock ticks since boot (field 22).
    public let start: UInt64

    public init?(_ pid: Int32) {
        guard let text = readTextFile("/proc/\(pid)/stat"), let close = text.lastIndex(of: ")") else { return nil }
        // Fields after the command name (which may hold spaces and parentheses): state is field 3.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 19, let parent = Int32(fields[1]), let start = UInt64(fields[19]) else { return nil }
        self.parent = parent
        self.start = start
    }

    /// Now, in the same clock ticks since boot.
    public static func now() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_BOOTTIME, &now)
        let ticks = UInt64(max(sysconf(Int32(_SC_CLK_TCK)), 1))
        return UInt64(now.tv_sec) * ticks + UInt64(now.tv_nsec) * ticks / 1_000_000_000
    }
}

extension Syscall {
    /// The numbered entries of a /proc directory (`/proc`: processes; `/proc/PID/task`: threads;
    /// `/proc/PID/fd`: descriptors); nil when it cannot be read (the process is gone).
    public static func numberedEntries(_ directory: String) -> [Int32]? {
        guard let fd = try? open(directory, Linux.O_PATH | O_DIRECTORY | O_CLOEXEC) else { return nil }
        defer { close(fd) }
        guard let names = try? directoryNames(in: fd) else { return nil }
        return names.compactMap { $0.text.flatMap { Int32($0) } }
    }
}
