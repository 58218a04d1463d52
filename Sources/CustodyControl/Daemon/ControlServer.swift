import CLinux
import CustodyCore
import CustodySystem
import Glibc
import Synchronization

/// Who is calling, from the socket's peer credentials (SO_PEERCRED), not from anything it says.
public struct Caller: Sendable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    /// Root, or a member of the admin group.
    public var isAdmin: Bool
}

public enum ControlError: Error, CustomStringConvertible {
    case socketInUse(String)
    case cannotListen(String, Errno)

    public var description: String {
        switch self {
        case .socketInUse(let path): return "control socket \(path) is in use by another daemon"
        case .cannotListen(let path, let error): return "cannot listen on \(path): \(error)"
        }
    }
}

/// The control socket, split as OpenSSH splits sshd (privilege separation). The daemon binds the
/// socket and keeps it; a separate, unprivileged process — the control front
/// (`ControlFront.swift`), started from this executable — accepts connections, parses HTTP,
/// checks each request (`ControlAPI.check`) and hands it over. Whatever input makes the front
/// trap kills only the front: the daemon, its keys and its mounts go on, and the daemon starts a
/// new front at once (connections wait in the socket's backlog meanwhile).
///
/// For each request the front sends the daemon, over a socket pair made at start (SCM_RIGHTS),
/// the client's connection and one end of a fresh pair. The daemon asks the kernel who the
/// client is (SO_PEERCRED on that connection, so the front cannot make a caller up), closes it,
/// reads the typed request from the pair (`Forwarding.swift`) and answers on it.
public final class ControlServer: @unchecked Sendable {
    public let path: String
    public static let timeoutSeconds = 10
    /// Requests the daemon serves at once (the front limits its connections as well).
    public static let maxRequests = 512

    private let listener: Int32
    /// False for a socket passed by the service manager (it owns the file).
    private let ownsSocketFile: Bool
    let api: ControlAPI
    private let active = Atomic<Int>(0)
    private let stopping = Atomic<Bool>(false)
    private let front: FrontSupervisor

    /// Binds the socket (mode 0666 by default, group `group` when given); `start()` serves it.
    /// `frontCommand` starts the control front (default: this executable with `--control-front`).
    public init(path: String, engine: Engine, mode: mode_t = 0o666, group: gid_t? = nil, adminGroup: gid_t? = nil,
                frontCommand: [String] = ControlServer.defaultFrontCommand) throws(ControlError) {
        self.path = path
        self.api = ControlAPI(engine: engine, adminGroup: adminGroup)
        if (try? Syscall.lstat(path)) != nil {
            // A socket left by a daemon that died can be replaced; a live one cannot.
            if Self.isAlive(path) { throw .socketInUse(path) }
            _ = unlink(path)
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .cannotListen(path, .current) }
        do {
            try Self.withAddress(path) { (address, length) throws(Errno) in
                _ = try valueOrErrno(bind(fd, address, length))
            }
            try Syscall.chmod(path, mode)
            if let group { try Syscall.fchownat(AT_FDCWD, path, uid_t.max, group, 0) }
            _ = try valueOrErrno(listen(fd, 128))
        } catch {
            Glibc.close(fd)
            throw .cannotListen(path, error)
        }
        listener = fd
        ownsSocketFile = true
        front = Self.supervisor(listener: fd, frontCommand, adminGroup, api)
    }

    /// The supervisor of the front for `listener`, its PID reported in the diagnostics.
    private static func supervisor(listener: Int32, _ command: [String], _ adminGroup: gid_t?, _ api: ControlAPI) -> FrontSupervisor {
        let front = FrontSupervisor(listener: listener, command: command + (adminGroup.map { ["--admin-gid", "\($0)"] } ?? []))
        api.diagnostics.frontProcess.withLock { $0 = { front.processID } }
        return front
    }

    /// Serves a socket that is already listening (socket activation: systemd passed it).
    public init(listening fd: Int32, engine: Engine, adminGroup: gid_t? = nil, frontCommand: [String] = ControlServer.defaultFrontCommand) {
        self.api = ControlAPI(engine: engine, adminGroup: adminGroup)
        self.listener = fd
        self.ownsSocketFile = false
        self.path = Self.boundPath(of: fd) ?? ""
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        front = Self.supervisor(listener: fd, frontCommand, adminGroup, api)
    }

    /// The running executable (even if its file was replaced since) in its front role.
    public static let defaultFrontCommand = ["/proc/self/exe", "--control-front"]

    /// Where the daemon's notes about the front go (it sets its logger here).
    public func setLog(_ log: @escaping @Sendable (String) -> Void) { front.setLog(log) }

    /// The control front's process ID (0 while none runs).
    public var frontProcessID: Int32 { front.processID }

    static func boundPath(of fd: Int32) -> String? {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let result = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard result == 0 else { return nil }
        let path = withUnsafeBytes(of: address.sun_path) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return path.isEmpty ? nil : path
    }

    /// True when the socket answers a status request within two seconds (for the watchdog).
    public var isAccepting: Bool {
        guard !path.isEmpty else { return !stopping.load(ordering: .acquiring) && front.processID > 0 }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { Glibc.close(fd) }
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard (try? Self.withAddress(path) { (address, length) throws(Errno) in try valueOrErrno(connect(fd, address, length)) }) != nil else { return false }
        let request = Array("GET /v1/status HTTP/1.1\r\nHost: custody\r\n\r\n".utf8)
        guard request.withUnsafeBytes({ Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else { return false }
        var answer = [UInt8](repeating: 0, count: 12)
        let count = answer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_WAITALL)) }
        return count == 12 && String(decoding: answer, as: UTF8.self) == "HTTP/1.1 200"
    }

    /// Starts the front (and keeps one running) and serves what it forwards.
    public func start() {
        front.start { [self] channel in self.serveChannel(channel) }
    }

    /// Stops the front, closes the socket and removes its file.
    public func stop() {
        stopping.store(true, ordering: .releasing)
        front.stop()
        Glibc.close(listener)
        if ownsSocketFile { _ = unlink(path) }
    }

    /// Takes the front's hand-overs until its end of the channel closes (it exited).
    private func serveChannel(_ channel: Int32) {
        while true {
            var byte: UInt8 = 0
            var fds: [Int32] = [-1, -1]
            let count = fds.withUnsafeMutableBufferPointer { clinux_receive_descriptors(channel, &byte, $0.baseAddress, 2) }
            if count < 0, errno == EINTR || errno == EMSGSIZE { continue }
            if count <= 0 { return }
            guard count == 2 else {
                for fd in fds.prefix(Int(count)) { Glibc.close(fd) }
                continue
            }
            let (connection, pair) = (fds[0], fds[1])
            var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
            let known = clinux_peer_credentials(connection, &pid, &uid, &gid) == 0 && pid > 0
            Glibc.close(connection)
            guard known else {
                Glibc.close(pair)
                continue
            }
            let caller = api.caller(pid: pid, uid: uid, gid: gid)
            if active.wrappingAdd(1, ordering: .acquiringAndReleasing).newValue > Self.maxRequests {
                active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
                _ = FrameChannel(fd: pair, maxPayload: 0).send(.response, ControlAPI.failure(503, 503, "ServiceBusy", "too many requests; try again").forwardedPayload())
                Glibc.close(pair)
                continue
            }
            if (try? DaemonThread.start("custody-request", detached: true, { [self] in
                self.serve(pair, caller)
                self.active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
            })) == nil {
                active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
                Glibc.close(pair)
            }
        }
    }

    /// One forwarded request: read it from the pair, answer it there.
    private func serve(_ pair: Int32, _ caller: Caller) {
        defer { Glibc.close(pair) }
        var timeout = timeval(tv_sec: Self.timeoutSeconds, tv_usec: 0)
        setsockopt(pair, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(pair, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let channel = FrameChannel(fd: pair, maxPayload: ControlLimits.maxBodyBytes + 64 * 1024)
        let request: HTTPRequest
        do throws(ForwardingError) {
            let (kind, payload) = try channel.receive()
            guard kind == .request else { return }
            request = try HTTPRequest(forwarded: payload)
        } catch {
            return
        }
        #if DEBUG
        // Test builds only: an administrator's request can make the daemon itself crash, to show
        // that a crash writes no core dump (keys and plaintext never reach the disk).
        if caller.isAdmin, request.query["custody-test-trap"] == "daemon-abort" { abort() }
        #endif
        let response = api.handle(request, from: caller)
        guard let stream = response.stream else {
            channel.send(.response, response.forwardedPayload())
            return
        }
        guard channel.send(.streamHead, response.forwardedPayload()) else { return }
        let writer = StreamWriter(fd: pair)
        stream(writer)
        writer.finish()
    }

    static func withAddress<R>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(Errno) -> R) throws(Errno) -> R {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard bytes.count < capacity else { throw Errno.nameTooLong }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let result: Result<R, Errno> = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
                do throws(Errno) {
                    return .success(try body(generic, socklen_t(MemoryLayout<sockaddr_un>.size)))
                } catch {
                    return .failure(error)
                }
            }
        }
        return try result.get()
    }

    static func isAlive(_ path: String) -> Bool {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { Glibc.close(fd) }
        return (try? withAddress(path) { (address, length) throws(Errno) in try valueOrErrno(connect(fd, address, length)) }) != nil
    }
}

