import CLinux
import Glibc

/// The daemon's threads, each named for its job: `top -H`, `ps -L`, gdb and
/// /proc/PID/task/TID/comm show the name (its first 15 bytes) instead of a wall of "custodyd".
/// The one place a thread is made, so that what it runs is retained once and released once.
public enum DaemonThread {
    /// Starts `body` on a new thread called `name`, and returns it (to join, unless `detached`:
    /// then nobody joins it). Throws the errno `pthread_create` gave.
    @discardableResult
    public static func start(_ name: String, detached: Bool = false, _ body: @escaping () -> Void) throws(Errno) -> pthread_t {
        final class Work {
            let name: String
            let body: () -> Void
            init(_ name: String, _ body: @escaping () -> Void) {
                self.name = name
                self.body = body
            }
        }
        let work = Unmanaged.passRetained(Work(name, body))
        var thread = pthread_t()
        let result = pthread_create(&thread, nil, { raw in
            guard let raw else { return nil }
            let work = Unmanaged<Work>.fromOpaque(raw).takeRetainedValue()
            clinux_set_thread_name(work.name)
            work.body()
            return nil
        }, work.toOpaque())
        guard result == 0 else {
            work.release()
            throw Errno(result)
        }
        if detached { pthread_detach(thread) }
        return thread
    }
}
