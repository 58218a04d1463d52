import CLinux
import CustodySystem
import Glibc
import Synchronization

/// The control front: the process that faces the control socket's clients (`custodyd
/// --control-front`, started by the daemon's `FrontSupervisor`). It holds no key, no mount and no
/// privilege: it runs as `nobody` when started by root, with no new privileges, no core dumps and
/// (where the kernel has Landlock) no access to any file. It accepts connections, reads and
/// checks each request (`HTTPParser`, `ControlAPI.check`), answers malformed ones itself, and
/// hands the rest to the daemon with the client's connection, so the daemon reads the caller's
/// credentials from the kernel. If anything here traps, only this process ends.
public enum ControlFront {
    /// Connections served at once, in all; more are answered 503 at once.
    public static let maxConnections = 512
    /// Of those, kept for root and the admin group: no crowd of users locks an administrator out.
    public static let reservedForAdministrators = 64
    /// Connections one other user may hold at once.
    public static let perUser = 32

    private static let channel = FrontSupervisor.channelDescriptor
    private static let listener = FrontSupervisor.listenerDescriptor
    private static let handOver = Mutex<Void>(())
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
            if startThread(detached: true, {
                serve(connection)
                release(uid: user, privileged: privileged)
            }) == nil {
                release(uid: user, privileged: privileged)
                Glibc.close(connection)
            }
        }
    }

    /// Seconds a connection may take to send its request head.
    static let headSeconds: Double = 5

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

    /// One connection: read, check, hand over, relay the answer.
    static func serve(_ connection: Int32) {
        defer { Glibc.close(connection) }
        var timeout = timeval(tv_sec: ControlServer.timeoutSeconds, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let request: HTTPRequest
        do {
            // An idle connection goes after `headSeconds`: holding many costs a user its own slots.
            request = try HTTPReader(fd: connection, headSeconds: Self.headSeconds, requestSeconds: Double(ControlServer.timeoutSeconds)).read()
        } catch {
            guard let response = answer(to: error) else { return }
            sendAll(connection, response.serialized())
            return
        }
        #if DEBUG
        // Test builds only: a request can make the front trap as a parsing bug would (an index
        // out of range), so the tests see a real Swift trap contained.
        if request.headers["x-custody-test-trap"] == "index-out-of-range" { trapForTests(Int(request.body.count) + 1) }
        #endif
        do throws(ControlAPI.Failure) {
            try ControlAPI.check(request)
        } catch {
            sendAll(connection, ControlAPI.answer(error).serialized())
            return
        }
        forward(request, connection)
    }

    /// The answer for a request that could not be read; nil when the client is gone.
    static func answer(to error: HTTPReadError) -> HTTPResponse? {
        switch error {
        case .closed: return nil
        case .timedOut: return ControlAPI.failure(408, 408, "RequestTimeout", "no request head within \(Int(headSeconds)) s or no whole request within \(ControlServer.timeoutSeconds) s")
        case .headersTooLarge: return ControlAPI.failure(431, 431, "HeadersTooLarge", "request headers over \(HTTPParser.maxHeaderBytes) bytes or \(HTTPParser.maxHeaders) fields")
        case .bodyTooLarge: return ControlAPI.failure(413, 413, "RequestTooLarge", "request body over \(HTTPParser.maxBodyBytes) bytes")
        case .malformed(let reason): return ControlAPI.failure(400, 400, "BadRequest", reason)
        }
    }

    /// Hands the request to the daemon and relays its answer to the client.
    static func forward(_ request: HTTPRequest, _ connection: Int32) {
        var pair: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else {
            sendAll(connection, ControlAPI.failure(503, 503, "ServiceBusy", "cannot reach the daemon (\(Errno.current)); try again").serialized())
            return
        }
        let (ours, theirs) = (pair[0], pair[1])
        defer { Glibc.close(ours) }
        let handed = handOver.withLock { _ in [connection, theirs].withUnsafeBufferPointer { clinux_send_descriptors(channel, $0.baseAddress, 2) } }
        Glibc.close(theirs)
        guard handed == 0 else {
            // The daemon's end is gone: it is stopping (or died; then so do we, by PR_SET_PDEATHSIG).
            sendAll(connection, ControlAPI.failure(503, 503, "ServiceBusy", "the daemon is stopping").serialized())
            exit(0)
        }
        let daemon = FrameChannel(fd: ours, maxPayload: 256 * 1024 * 1024)
        guard daemon.send(.request, request.forwardedPayload()) else { return badGateway(connection) }
        let kind: FrameKind, payload: [UInt8]
        do throws(ForwardingError) {
            (kind, payload) = try daemon.receive()
        } catch {
            return badGateway(connection)
        }
        switch kind {
        case .response:
            guard let response = try? HTTPResponse(forwarded: payload, streamed: false) else { return badGateway(connection) }
            sendAll(connection, response.serialized())
        case .streamHead:
            guard let response = try? HTTPResponse(forwarded: payload, streamed: true) else { return badGateway(connection) }
            guard sendAll(connection, response.serializedHead(streamed: true)) else { return }
            relayStream(from: daemon, to: connection)
        default:
            badGateway(connection)
        }
    }

    /// Chunks from the daemon to the client until the stream ends or either side goes.
    static func relayStream(from daemon: FrameChannel, to connection: Int32) {
        while true {
            var waits = [pollfd(fd: daemon.fd, events: Int16(POLLIN), revents: 0),
                         pollfd(fd: connection, events: Int16(0x2000), revents: 0)] // POLLRDHUP
            guard poll(&waits, 2, -1) >= 0 || errno == EINTR else { return }
            if waits[1].revents != 0 { return } // the client hung up: closing our end tells the daemon
            guard waits[0].revents != 0 else { continue }
            let kind: FrameKind, payload: [UInt8]
            do throws(ForwardingError) {
                (kind, payload) = try daemon.receive()
            } catch {
                return
            }
            switch kind {
            case .chunk:
                guard sendAll(connection, HTTPResponse.chunk(payload)) else { return }
            case .end:
                sendAll(connection, HTTPResponse.chunk([]))
                return
            default:
                return
            }
        }
    }

    #if DEBUG
    private static func trapForTests(_ index: Int) {
        let nothing: [UInt8] = []
        note("control front: trapping on request (test builds only)")
        _ = nothing[index]
    }
    #endif

    private static func badGateway(_ connection: Int32) {
        sendAll(connection, ControlAPI.failure(502, 502, "DaemonError", "the daemon gave no answer").serialized())
    }
}

/// Where untrusted bytes enter the control plane, for the fuzzer (`make fuzz-http`) and its
/// replay in `make test`: each function takes any bytes and must return, never trap.
public enum ControlInputs {
    /// A whole request as the front reads it: parsed, then checked as the front checks it.
    /// The status the front would answer with (200 when it would hand the request over).
    @discardableResult
    public static func parseAndCheck(_ bytes: [UInt8]) -> Int {
        guard let request = try? HTTPParser.parse(bytes) else { return 400 }
        do throws(ControlAPI.Failure) {
            try ControlAPI.check(request)
            return 200
        } catch {
            return error.status
        }
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
