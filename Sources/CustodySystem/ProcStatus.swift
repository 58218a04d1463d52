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
