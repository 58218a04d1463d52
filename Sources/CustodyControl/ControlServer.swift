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

/// The control socket: HTTP/1.1 and JSON over a Unix socket, one thread per connection (at most
/// `maxConnections`), a request per connection, with size limits and read timeouts, so that a slow
/// or broken client never holds the daemon up.
public final class ControlServer: @unchecked Sendable {
    public let path: String
    public static let maxConnections = 64
    public static let timeoutSeconds = 10

    private let listener: Int32
    /// False for a socket passed by the service manager (it owns the file).
    private let ownsSocketFile: Bool
    let api: ControlAPI
    private let active = Atomic<Int>(0)
    private let stopping = Atomic<Bool>(false)
    private var acceptThread: pthread_t?

    /// Binds the socket (mode 0660 by default, group `group` when given) and starts serving.
    public init(path: String, engine: Engine, mode: mode_t = 0o660, group: gid_t? = nil, adminGroup: gid_t? = nil) throws(ControlError) {
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
    }

    /// Serves a socket that is already listening (socket activation: systemd passed it).
    public init(listening fd: Int32, engine: Engine, adminGroup: gid_t? = nil) {
        self.api = ControlAPI(engine: engine, adminGroup: adminGroup)
        self.listener = fd
        self.ownsSocketFile = false
        self.path = Self.boundPath(of: fd) ?? ""
    }

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
        guard !path.isEmpty else { return !stopping.load(ordering: .acquiring) }
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

    public func start() {
        acceptThread = startThread { [self] in self.acceptLoop() }
    }

    /// Stops accepting, closes the socket and removes its file.
    public func stop() {
        stopping.store(true, ordering: .releasing)
        shutdown(listener, Int32(SHUT_RDWR))
        if let acceptThread { pthread_join(acceptThread, nil) }
        Glibc.close(listener)
        if ownsSocketFile { _ = unlink(path) }
    }

    private func acceptLoop() {
        while !stopping.load(ordering: .acquiring) {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if stopping.load(ordering: .acquiring) { return }
                usleep(10_000)
                continue
            }
            _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
            if active.wrappingAdd(1, ordering: .acquiringAndReleasing).newValue > Self.maxConnections {
                active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
                send(connection, ControlAPI.failure(503, 503, "ServiceBusy", "too many connections; try again"))
                Glibc.close(connection)
                continue
            }
            if startThread(detached: true, { [self] in
                self.serve(connection)
                self.active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
            }) == nil {
                active.wrappingSubtract(1, ordering: .acquiringAndReleasing)
                Glibc.close(connection)
            }
        }
    }

    private func serve(_ connection: Int32) {
        defer { Glibc.close(connection) }
        var timeout = timeval(tv_sec: Self.timeoutSeconds, tv_usec: 0)
        setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
        guard clinux_peer_credentials(connection, &pid, &uid, &gid) == 0 else { return }
        let caller = api.caller(pid: pid, uid: uid, gid: gid)
        let response: HTTPResponse
        do {
            let request = try HTTPReader(fd: connection).read()
            response = api.handle(request, from: caller)
        } catch {
            switch error {
            case .closed: return
            case .timedOut: response = ControlAPI.failure(408, 408, "RequestTimeout", "no complete request within \(Self.timeoutSeconds) s")
            case .headersTooLarge: response = ControlAPI.failure(431, 431, "HeadersTooLarge", "request headers over \(HTTPReader.maxHeaderBytes) bytes")
            case .bodyTooLarge: response = ControlAPI.failure(413, 413, "RequestTooLarge", "request body over \(HTTPReader.maxBodyBytes) bytes")
            case .malformed(let reason): response = ControlAPI.failure(400, 400, "BadRequest", reason)
            }
        }
        send(connection, response)
        if let stream = response.stream {
            let writer = StreamWriter(fd: connection)
            stream(writer)
            writer.finish()
        }
    }

    private func send(_ connection: Int32, _ response: HTTPResponse) {
        sendAll(connection, response.serialized())
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

/// Starts a thread running `body` (detached: nobody joins it); nil when it could not be made.
@discardableResult
func startThread(detached: Bool = false, _ body: @escaping @Sendable () -> Void) -> pthread_t? {
    final class Box { let body: @Sendable () -> Void; init(_ body: @escaping @Sendable () -> Void) { self.body = body } }
    let box = Unmanaged.passRetained(Box(body))
    var thread = pthread_t()
    let result = pthread_create(&thread, nil, { raw in
        guard let raw else { return nil }
        let box = Unmanaged<Box>.fromOpaque(raw).takeRetainedValue()
        box.body()
        return nil
    }, box.toOpaque())
    guard result == 0 else {
        box.release()
        return nil
    }
    if detached { pthread_detach(thread) }
    return thread
}
