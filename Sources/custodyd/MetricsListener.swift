import CustodyConfig
import CustodySystem
import Glibc
import Synchronization

/// Serves the metrics on a loopback TCP address (`metrics-listen`) for a Prometheus server that
/// cannot reach the control socket. It answers `GET /metrics` (and `GET /v1/metrics`) and
/// nothing else, as an anonymous reader: no series names an identity.
///
/// The daemon parses no HTTP here: it reads the request head (at most 8 KiB, within 5 seconds)
/// and compares its first bytes with the two request lines it serves; it never looks further.
/// One thread serves every connection with `poll`. At most `maxConnections` are kept; a new one
/// beyond that pushes out the oldest, so idle or slow clients cannot keep a scrape out.
final class MetricsListener: @unchecked Sendable {
    static let maxConnections = 64
    static let headBytes = 8192
    static let deadlineSeconds = 5.0

    let address: LoopbackAddress
    private let fd: Int32
    private let render: @Sendable () -> [UInt8]
    private let stopping = Atomic<Bool>(false)
    private var thread: pthread_t?

    enum Failure: Error, CustomStringConvertible {
        case cannotListen(LoopbackAddress, Errno)
        var description: String {
            switch self {
            case .cannotListen(let address, let error): return "cannot serve metrics on \(address): \(error)"
            }
        }
    }

    /// One client: what it sent so far, what is left to send it, and when it must be done.
    private struct Client {
        let fd: Int32
        let deadline: Double
        var head: [UInt8] = []
        var answer: [UInt8] = []
        var sent = 0
    }

    init(_ address: LoopbackAddress, render: @escaping @Sendable () -> [UInt8]) throws(Failure) {
        self.address = address
        self.render = render
        let family = address.isIPv6 ? AF_INET6 : AF_INET
        let fd = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { throw .cannotListen(address, .current) }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        let bound: Int32
        if address.isIPv6 {
            var socketAddress = sockaddr_in6()
            socketAddress.sin6_family = sa_family_t(AF_INET6)
            socketAddress.sin6_port = address.port.bigEndian
            socketAddress.sin6_addr = in6addr_loopback
            bound = withUnsafePointer(to: &socketAddress) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) }
            }
        } else {
            var socketAddress = sockaddr_in()
            socketAddress.sin_family = sa_family_t(AF_INET)
            socketAddress.sin_port = address.port.bigEndian
            _ = inet_pton(AF_INET, address.host, &socketAddress.sin_addr)
            bound = withUnsafePointer(to: &socketAddress) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            let error = Errno.current
            Glibc.close(fd)
            throw .cannotListen(address, error)
        }
        self.fd = fd
    }

    func start() {
        thread = try? DaemonThread.start("custody-metrics") { [self] in loop() }
    }

    /// Stops serving and closes every connection.
    func stop() {
        stopping.store(true, ordering: .releasing)
        shutdown(fd, Int32(SHUT_RDWR))
        if let thread { pthread_join(thread, nil) }
        thread = nil
        Glibc.close(fd)
    }

    private func loop() {
        var clients: [Client] = []
        defer { clients.forEach { Glibc.close($0.fd) } }
        while !stopping.load(ordering: .acquiring) {
            var waits = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0)]
            for client in clients {
                waits.append(pollfd(fd: client.fd, events: Int16(client.answer.isEmpty ? POLLIN : POLLOUT), revents: 0))
            }
            let ready = poll(&waits, nfds_t(waits.count), 500)
            if ready < 0, errno != EINTR { return }
            let now = monotonicSeconds()
            var kept: [Client] = []
            for (index, var client) in clients.enumerated() {
                let events = index + 1 < waits.count ? waits[index + 1].revents : 0
                if events != 0, Self.advance(&client, render) == false {
                    Glibc.close(client.fd)
                } else if client.deadline < now {
                    Glibc.close(client.fd)
                } else {
                    kept.append(client)
                }
            }
            clients = kept
            if waits[0].revents & Int16(POLLIN) != 0 { acceptAll(into: &clients, now: now) }
            if waits[0].revents & Int16(POLLERR | POLLHUP | POLLNVAL) != 0 { return }
        }
    }

    private func acceptAll(into clients: inout [Client], now: Double) {
        while true {
            let connection = accept(fd, nil, nil)
            guard connection >= 0 else { return }
            _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
            _ = fcntl(connection, F_SETFL, fcntl(connection, F_GETFL) | O_NONBLOCK)
            if clients.count >= Self.maxConnections, let oldest = clients.first {
                Glibc.close(oldest.fd)
                clients.removeFirst()
            }
            clients.append(Client(fd: connection, deadline: now + Self.deadlineSeconds))
        }
    }

    /// Reads what the client sent or sends what is left of its answer; false when it is done
    /// with (answered, gone, or sent something that is not a request head within the limit).
    private static func advance(_ client: inout Client, _ render: () -> [UInt8]) -> Bool {
        if client.answer.isEmpty {
            var chunk = [UInt8](repeating: 0, count: 2048)
            let count = chunk.withUnsafeMutableBytes { recv(client.fd, $0.baseAddress, $0.count, 0) }
            if count < 0, errno == EAGAIN || errno == EINTR { return true }
            guard count > 0 else { return false }
            client.head += chunk.prefix(count)
            guard endsHead(client.head) else { return client.head.count < headBytes }
            client.answer = answer(to: client.head, render)
        }
        let count = client.answer[client.sent...].withUnsafeBytes { Glibc.send(client.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if count < 0, errno == EAGAIN || errno == EINTR { return true }
        guard count > 0 else { return false }
        client.sent += count
        return client.sent < client.answer.count
    }

    static func answer(to head: [UInt8], _ render: () -> [UInt8]) -> [UInt8] {
        guard asksForMetrics(head) else {
            let body = Array("only GET /metrics is served here\n".utf8)
            return Array("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8) + body
        }
        let body = render()
        return Array("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8) + body
    }

    static func endsHead(_ bytes: [UInt8]) -> Bool {
        let end: [UInt8] = [13, 10, 13, 10]
        guard bytes.count >= end.count else { return false }
        for start in 0...(bytes.count - end.count) where bytes[start..<(start + end.count)].elementsEqual(end) { return true }
        return false
    }

    /// True for `GET /metrics` and `GET /v1/metrics` (with or without a query).
    static func asksForMetrics(_ head: [UInt8]) -> Bool {
        for path in ["/metrics", "/v1/metrics"] {
            for next in [" ", "?"] where head.starts(with: Array("GET \(path)\(next)".utf8)) { return true }
        }
        return false
    }
}
