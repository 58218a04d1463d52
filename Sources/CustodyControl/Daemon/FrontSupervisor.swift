import CLinux
import CustodySystem
import Glibc
import Synchronization

/// Starts the control front and starts it again whenever it exits, for as long as the daemon
/// serves. Each front gets the listening socket as descriptor 4 and its end of a fresh channel
/// (a SOCK_SEQPACKET pair) as descriptor 3; the daemon's end goes to `serve`, on a thread of its
/// own, until the front closes it.
final class FrontSupervisor: @unchecked Sendable {
    static let channelDescriptor: Int32 = 3
    static let listenerDescriptor: Int32 = 4

    private let listener: Int32
    private let command: [String]
    private let state = Mutex<(pid: pid_t, stopping: Bool, log: (@Sendable (String) -> Void)?)>((0, false, nil))
    private var thread: pthread_t?

    init(listener: Int32, command: [String]) {
        self.listener = listener
        self.command = command
    }

    var processID: pid_t { state.withLock { $0.pid } }

    func setLog(_ log: @escaping @Sendable (String) -> Void) { state.withLock { $0.log = log } }

    private func log(_ message: String) {
        if let log = state.withLock({ $0.log }) { log(message) } else { writeStandardError("custodyd: \(message)\n") }
    }

    func start(serve: @escaping @Sendable (Int32) -> Void) {
        thread = try? DaemonThread.start("custody-front") { [self] in self.supervise(serve) }
    }

    /// Stops the front and waits until its supervision has ended.
    func stop() {
        let pid = state.withLock { state -> pid_t in
            state.stopping = true
            return state.pid
        }
        if pid > 0 { kill(pid, SIGTERM) }
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    private var stopping: Bool { state.withLock { $0.stopping } }

    private func supervise(_ serve: @escaping @Sendable (Int32) -> Void) {
        var quickExits = 0
        while !stopping {
            let started = monotonicSeconds()
            guard let (pid, channel) = spawn() else {
                // Nothing to run (no memory, no processes left): try again shortly.
                usleep(500_000)
                continue
            }
            if stopping { kill(pid, SIGTERM) }
            let server = try? DaemonThread.start("custody-control") { serve(channel) }
            var status: Int32 = 0
            while waitpid(pid, &status, 0) < 0, errno == EINTR {}
            state.withLock { $0.pid = 0 }
            // Its end closed with it; ours ends the serving thread's wait.
            shutdown(channel, Int32(SHUT_RDWR))
            if let server { pthread_join(server, nil) }
            Glibc.close(channel)
            if stopping { return }
            log("control front (pid \(pid)) \(Self.describe(status)); starting a new one")
            // A front that keeps dying at once is started a little less often, but never more
            // than half a second later: the socket answers again within a second whatever
            // makes it fail, and a crash loop costs at most two starts a second.
            quickExits = monotonicSeconds() - started < 1 ? quickExits + 1 : 0
            if quickExits > 3 { usleep(useconds_t(min(0.5, 0.05 * Double(1 << min(quickExits - 3, 4))) * 1e6)) }
        }
    }

    static func describe(_ status: Int32) -> String {
        let signal = status & 0x7f
        if signal == 0 { return "exited with status \((status >> 8) & 0xff)" }
        return "was killed by signal \(signal)"
    }

    /// Starts one front; its PID and the daemon's end of its channel.
    private func spawn() -> (pid_t, Int32)? {
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_SEQPACKET.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            log("cannot make the control front's channel: \(Errno.current)")
            return nil
        }
        // Copies above the low numbers, so the moves to 3 and 4 cannot overwrite each other
        // (a socket-activated listener is descriptor 3 itself).
        let frontEnd = fcntl(pair[1], F_DUPFD_CLOEXEC, 100)
        let listenerCopy = fcntl(listener, F_DUPFD_CLOEXEC, 100)
        Glibc.close(pair[1])
        defer {
            if frontEnd >= 0 { Glibc.close(frontEnd) }
            if listenerCopy >= 0 { Glibc.close(listenerCopy) }
        }
        guard frontEnd >= 0, listenerCopy >= 0 else {
            Glibc.close(pair[0])
            return nil
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, frontEnd, Self.channelDescriptor)
        posix_spawn_file_actions_adddup2(&actions, listenerCopy, Self.listenerDescriptor)
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        // Default signal handling and nothing blocked (the daemon blocks SIGTERM/SIGINT/SIGHUP).
        var empty = sigset_t(), all = sigset_t()
        sigemptyset(&empty)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        // argv[0] names the daemon, so ps shows "custodyd --control-front".
        let arguments = (["custodyd"] + command.dropFirst()).map { strdup($0) } + [nil]
        defer { for argument in arguments { free(argument) } }
        // A clean environment: nothing of the daemon's (NOTIFY_SOCKET, LISTEN_FDS, …) leaks in.
        let variables: [String] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
        let environment = variables.map { strdup($0) } + [nil]
        defer { for variable in environment { free(variable) } }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, command.first ?? "/proc/self/exe", &actions, &attributes, arguments, environment)
        guard result == 0 else {
            log("cannot start the control front (\(command.joined(separator: " "))): \(Errno(result))")
            Glibc.close(pair[0])
            return nil
        }
        state.withLock { $0.pid = pid }
        return (pid, pair[0])
    }
}

func writeStandardError(_ text: String) {
    let bytes = Array(text.utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
