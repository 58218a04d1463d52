import CLinux
import CustodySystem
import Glibc
import NIOCore
import NIOPosix
import Synchronization

/// The control front: the process that faces the control socket's clients (`custodyd
/// --control-front`, started by the daemon's `FrontSupervisor`). It holds no key, no mount and no
/// privilege: it runs as `nobody` when started by root, with no new privileges, no core dumps and
/// (where the kernel has Landlock) no access to any file. It accepts connections and serves them
/// on one SwiftNIO event loop: reads and checks each request (NIOHTTP1's decoder in
/// `FrontConnection`, then `ControlAPI.check`), answers malformed ones itself, and hands the rest
/// to the daemon with the client's connection (`DaemonForwarder`), so the daemon reads the
/// caller's credentials from the kernel. If anything here traps, only this process ends.
public enum ControlFront {
    /// Connections served at once, in all; more are answered 503 at once.
    public static let maxConnections = 1024
    /// Of those, kept for root and the admin group: no crowd of users locks an administrator out.
    public static let reservedForAdministrators = 64
    /// Connections one other user may hold at once.
    public static let perUser = 32

    private static let channel = FrontSupervisor.channelDescriptor
    private static let listener = FrontSupervisor.listenerDescriptor
    private static let connections = Mutex(ConnectionCounts())

    struct ConnectionCounts {
        var total = 0
        var others = 0
        var byUser: [uid_t: Int] = [:]
    }

    /// Counts a new connection, or says why it cannot be served now.
    static func admit(uid: uid_t, privileged: Bool) -> String? {
        connections.withLock { counts in
            guard counts.total < maxConnections else { return "too many connections; try again" }
            if !privileged {
                guard counts.others < maxConnections - reservedForAdministrators else { return "too many connections; try again" }
                guard counts.byUser[uid, default: 0] < perUser else { return "at most \(perUser) connections per user at once" }
                counts.others += 1
                counts.byUser[uid, default: 0] += 1
            }
            counts.total += 1
            return nil
        }
    }

    static func release(uid: uid_t, privileged: Bool) {
        connections.withLock { counts in
            counts.total -= 1
            guard !privileged else { return }
            counts.others -= 1
            let left = counts.byUser[uid, default: 1] - 1
            counts.byUser[uid] = left > 0 ? left : nil
        }
    }

    /// Runs the front until the daemon goes; the process's exit status. `arguments` are what
    /// follows `--control-front`: `--admin-gid N` names the administrators' group.
    public static func run(arguments: [String] = []) -> Int32 {
        var adminGroup: gid_t?
        if let index = arguments.firstIndex(of: "--admin-gid"), index + 1 < arguments.count { adminGroup = gid_t(arguments[index + 1]) }
        // Only the two descriptors it was given (and the standard ones) stay open.
        clinux_close_from(listener + 1)
        let daemon = getppid()
        let confinement = confine()
        // After the change of user, which clears it: the front dies with the daemon (and if the
        // daemon is already gone, now).
        _ = clinux_die_with_parent()
        if getppid() != daemon { return 0 }
        if !confinement.isEmpty { note("control front: \(confinement)") }
        raiseDescriptorLimit()
        // A hand-over that would block (the daemon not taking them) is answered 503 instead.
        _ = fcntl(channel, F_SETFL, fcntl(channel, F_GETFL) | O_NONBLOCK)
        // One event loop serves every connection (after the confinement, which binds only the
        // threads that exist when it is made): idle and slow clients cost memory, not threads.
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS {
                    if errno != EINTR, errno != ECONNABORTED { usleep(10_000) }
                    continue
                }
                note("control front: accept failed (\(Errno.current)); exiting")
                return 1
            }
            _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
            // Who connected, from the kernel (the daemon asks again for its own decisions).
            var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
            guard clinux_peer_credentials(connection, &pid, &uid, &gid) == 0 else {
                Glibc.close(connection)
                continue
            }
            let privileged = uid == 0 || adminGroup.map { clinux_peer_in_group(connection, $0) == 1 } ?? false
            let user = uid
            if let refusal = admit(uid: user, privileged: privileged) {
                // Never waits for a client that does not read.
                let answer = ControlAPI.failure(503, 503, "ServiceBusy", refusal).serialized()
                _ = answer.withUnsafeBytes { Glibc.send(connection, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
                Glibc.close(connection)
                continue
            }
            let forwarder = DaemonForwarder(channel: channel, connection: connection)
            ClientBootstrap(group: loops)
                .channelOption(ChannelOptions.autoRead, value: false)
                .channelOption(ChannelOptions.allowRemoteHalfClosure, value: true)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandlers(FrontPipeline.handlers(forwarder)) }
                }
                .withConnectedSocket(connection)
                .whenComplete { result in
                    switch result {
                    case .success(let channel): channel.closeFuture.whenComplete { _ in release(uid: user, privileged: privileged) }
                    case .failure: release(uid: user, privileged: privileged)
                    }
                }
        }
    }

    /// Two descriptors per connection (the client's and, while a request is forwarded, its pair):
    /// the soft limit goes up to the hard one.
    private static func raiseDescriptorLimit() {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    }

    /// Drops what the front does not need; says what could not be dropped ("" when all was).
    static func confine() -> String {
        var missing: [String] = []
        if geteuid() == 0 {
            // nobody's IDs are read before the file system is closed off.
            let nobody = getpwnam("nobody")
            let uid = nobody?.pointee.pw_uid ?? 65534, gid = nobody?.pointee.pw_gid ?? 65534
            if setgroups(0, nil) != 0 || setgid(gid) != 0 || setuid(uid) != 0 || setuid(0) == 0 {
                missing.append("cannot give up root (\(Errno.current))")
            }
        }
        if clinux_no_new_privileges() != 0 { missing.append("cannot set no_new_privs (\(Errno.current))") }
        if clinux_landlock_deny_filesystem() < 0 { missing.append("no Landlock file system confinement (\(Errno.current))") }
        return missing.joined(separator: "; ")
    }

    private static func note(_ text: String) { writeStandardError("custodyd: \(text)\n") }
}

/// Where untrusted bytes enter the control plane, for the fuzzer (`make fuzz-http`) and its
/// replay in `make test`: each function takes any bytes and must return, never trap.
public enum ControlInputs {
    /// Bytes sent on a connection, as the front's HTTP pipeline reads them (SwiftNIO's decoder, the
    /// limits, the checks), with every checked request answered 200 in place of the daemon. The
    /// status of the first answer (0 when the connection closed without one).
    @discardableResult
    public static func parseAndCheck(_ bytes: [UInt8]) -> Int {
        let answer = FrontExchange.run(bytes) { _ in HTTPResponse(status: 200, body: Array("{}".utf8)) }
        let line = answer.prefix { $0 != 13 }
        guard line.count >= 12 else { return 0 }
        return Int(String(decoding: line.dropFirst(9).prefix(3), as: UTF8.self)) ?? 0
    }

    /// The bytes as the body of every route that takes one (JSON decoding and body checks).
    public static func checkAsEveryBody(_ bytes: [UInt8]) {
        for route in ControlAPI.routes where route.method != "GET" {
            let path = route.pattern.split(separator: "/").map { $0.hasPrefix("{") ? "1" : String($0) }.joined(separator: "/")
            _ = try? ControlAPI.check(HTTPRequest(method: route.method, path: "/" + path, query: [:], headers: [:], body: bytes))
        }
    }

    /// The bytes as a frame payload the daemon or the front decodes.
    public static func decodeFrames(_ bytes: [UInt8]) {
        _ = try? HTTPRequest(forwarded: bytes)
        _ = try? HTTPResponse(forwarded: bytes, streamed: false)
        _ = try? HTTPResponse(forwarded: bytes, streamed: true)
    }
}
