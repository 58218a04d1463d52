import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// The control plane runs in a process of its own (the control front): nothing sent to the
/// socket, and no crash of that process, reaches the mounts.
final class ControlFrontTests: XCTestCase {
    var daemon: MountedDaemon!

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--socket-mode", "0666"])
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    /// The daemon's children: its control front (one, while it runs).
    func frontPIDs() -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { Int32($0) }.filter { pid in
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let close = stat.lastIndex(of: ")") else { return false }
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            return fields.count > 2 && Int32(fields[1]) == daemon.pid
        }
    }

    func front() throws -> pid_t {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            let pids = frontPIDs()
            // Once it has confined itself (before that it may still be starting).
            if pids.count == 1, let pid = pids.first,
               (try? String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8))?.contains("--control-front") == true,
               (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8))?.contains("NoNewPrivs:\t1") == true { return pid }
            usleep(10_000)
        }
        let children = frontPIDs().map { "\($0): " + ((try? String(contentsOfFile: "/proc/\($0)/cmdline", encoding: .utf8)) ?? "") }
        throw HarnessError("the daemon's children are not one control front: \(children) \(daemon.log)")
    }

    /// Sends raw bytes on a fresh connection and returns what comes back before the close.
    func raw(_ bytes: [UInt8], halfClose: Bool = true) throws -> String {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(Errno.current)") }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(daemon.socket.utf8)) }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else { throw HarnessError("connect: \(Errno.current)") }
        var timeout = timeval(tv_sec: 15, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if halfClose { shutdown(fd, Int32(SHUT_WR)) }
        var answer: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { break }
            answer += buffer[0..<count]
        }
        return String(decoding: answer, as: UTF8.self)
    }

    /// Seconds until the socket answers a status request with 200 (nil after `limit`).
    func secondsUntilServing(limit: Double = 10) -> Double? {
        let start = Date()
        return try? eventualValue("the socket to serve", timeout: limit, interval: 0.005) {
            (try? daemon.api("GET", "/v1/status").status) == 200 ? Date().timeIntervalSince(start) : nil
        }
    }

    func post(_ path: String, _ body: String) -> String {
        "POST \(path) HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }

    func testHostileRequestsAreAnsweredByTheFrontAndNothingCrashes() throws {
        let pid = try front()
        let cases: [(String, String)] = [
            ("GET /v1/status?= HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 200"),
            ("GET /v1/status?&&=&a==b&%zz=%%&=x HTTP/1.1\r\n\r\n", "HTTP/1.1 200"),
            ("GET /v1/accounts/%2F..%2F/lock HTTP/1.1\r\n\r\n", "HTTP/1.1 405"),
            ("POST /v1/accounts/%00/lock HTTP/1.1\r\n\r\n", "HTTP/1.1 404"),
            ("GET /v1/status HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400"),
            ("GET /v1/status HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", "HTTP/1.1 400"),
            ("GET /v1/status HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "HTTP/1.1 400"),
            ("GET /v1/status HTTP/1.1\r\n folded: header\r\n\r\n", "HTTP/1.1 400"),
            ("GET /v1/ status HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("G\u{0}T /v1/status HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("GET v1/status HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("GET /v1/status HTTP/2.0\r\n\r\n", "HTTP/1.1 400"),
            ("\r\n\r\n", ""), // blank lines before a request are allowed (RFC 9112 2.2); then the client left
            ("GET /v1/status HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "HTTP/1.1 200"),
            ("GET /v1/status HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 400"),
            ("GET /v1/status HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", "HTTP/1.1 413"),
            (post("/v1/accounts", "\u{ff}\u{fe}{}}"), "HTTP/1.1 400"),
            (post("/v1/bindings", #"{"pid": 99999999999999999, "identity": "a"}"#), "HTTP/1.1 400"),
            (post("/v1/bindings", #"{"pid": 1, "identity": 1}"#), "HTTP/1.1 400"),
            (post("/v1/accounts", #"{"id": "a", "upn": "a@b", "passphrase": ""}"#), "HTTP/1.1 400"),
            (post("/v1/accounts/a@b/unlock", #"{"passphrase": ""}"#), "HTTP/1.1 400"),
            (post("/v1/data/protect", #"{"identity": "a@b", "data": "@@not base64@@"}"#), "HTTP/1.1 400"),
            ("DELETE /v1/bindings/-1 HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("DELETE /v1/bindings/4294967296 HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("GET /v1/events?after=-5&follow=false HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
            ("POST /v1/accounts/x/wipe?wait=maybe HTTP/1.1\r\n\r\n", "HTTP/1.1 400"),
        ]
        for (request, expected) in cases {
            let answer = try raw(Array(request.utf8))
            XCTAssertTrue(expected.isEmpty ? answer.isEmpty : answer.hasPrefix(expected), "\(request.debugDescription) → \(answer.prefix(200).debugDescription)")
        }
        // Random bytes, and a head over the limit.
        var generator = SystemRandomNumberGenerator()
        for length in [1, 7, 100, 4096, 70_000] {
            _ = try raw((0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) })
        }
        _ = try raw(Array(("GET /v1/status HTTP/1.1\r\n" + String(repeating: "X-A: b\r\n", count: 5000) + "\r\n").utf8))
        XCTAssertEqual(try front(), pid, "no input crashed the front")
        XCTAssertTrue(daemon.isMounted)
        XCTAssertFalse(daemon.log.contains("control front (pid"), daemon.log)
    }

    func testEveryMethodARouteDoesNotServeIs405WithAllow() throws {
        let answer = try raw(Array("PATCH /v1/accounts/alice HTTP/1.1\r\n\r\n".utf8))
        XCTAssertTrue(answer.hasPrefix("HTTP/1.1 405"), answer)
        XCTAssertTrue(answer.contains("\r\nAllow: GET, DELETE\r\n"), answer)
        let status = try raw(Array("POST /v1/status HTTP/1.1\r\n\r\n".utf8))
        XCTAssertTrue(status.contains("\r\nAllow: GET\r\n"), status)
    }

    func testTheFrontIsUnprivilegedAndConfined() throws {
        let pid = try front()
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = { (name: String) in status.split(separator: "\n").first { $0.hasPrefix(name + ":") }.map(String.init) ?? "" }
        if geteuid() == 0 {
            let uid = line("Uid").split(separator: "\t").dropFirst().compactMap { UInt32($0) }
            XCTAssertEqual(uid.count, 4, line("Uid"))
            XCTAssertFalse(uid.contains(0), "the front gave up root: \(line("Uid"))")
            XCTAssertEqual(line("Groups").trimmingCharacters(in: " \t"), "Groups:", "no supplementary groups")
        }
        XCTAssertEqual(line("NoNewPrivs"), "NoNewPrivs:\t1")
        // Nothing but the standard descriptors, the channel, the listener and the event loop's
        // own (epoll, eventfd, timerfd): no file. The event loop makes its own once it runs,
        // which on a loaded machine can be a while after the front confined itself.
        let expected: Set<String> = ["anon_inode:[eventpoll]", "anon_inode:[eventfd]", "anon_inode:[timerfd]"]
        var descriptors: [Int] = []
        var others: [String] = []
        let deadline = Date().addingTimeInterval(10)
        repeat {
            descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").compactMap { Int($0) }.sorted()
            others = descriptors.dropFirst(5).map { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")) ?? "?" }
            if Set(others) == expected { break }
            usleep(20_000)
        } while Date() < deadline
        XCTAssertEqual(Array(descriptors.prefix(5)), [0, 1, 2, 3, 4])
        XCTAssertEqual(Set(others), expected, "\(others)")
        XCTAssertTrue(try String(contentsOfFile: "/proc/\(pid)/cmdline", encoding: .utf8).contains("--control-front"))
    }

    /// The front dies (killed, or trapping on a request as a parsing bug would: test builds have a
    /// header for that) while files are being written through the mount: every write completes,
    /// the mount never drops, and the socket answers again within a second.
    func testTheFrontCrashingNeverReachesTheMounts() throws {
        let stopFlag = daemon.root + "/stop-writing"
        let writerLog = daemon.root + "/writer.log"
        // Writes 1 MiB files one after another and checks each right away.
        let script = """
            i=0; head -c 1048576 /dev/urandom > '\(daemon.root)/pattern'
            while [ ! -e '\(stopFlag)' ]; do
              i=$((i+1)); cp '\(daemon.root)/pattern' '\(daemon.mountPoint)/file-'$i || { echo "write $i failed"; exit 1; }
              cmp -s '\(daemon.root)/pattern' '\(daemon.mountPoint)/file-'$i || { echo "file $i differs"; exit 1; }
            done; echo "wrote $i"
            """
        let writer = try spawn("/bin/sh", ["-c", script], stdoutPath: writerLog, stderrPath: writerLog)
        defer { kill(writer, SIGKILL); waitForExit(writer, seconds: 5) }
        usleep(200_000)
        var previous = try front()
        for signal in [SIGKILL, SIGTRAP, SIGKILL, SIGTRAP] {
            if signal == SIGTRAP {
                let answer = try raw(Array("GET /v1/status HTTP/1.1\r\nX-Custody-Test-Trap: index-out-of-range\r\n\r\n".utf8))
                XCTAssertEqual(answer, "", "the front died on the request")
            } else {
                XCTAssertEqual(kill(previous, signal), 0)
            }
            let seconds = secondsUntilServing()
            XCTAssertNotNil(seconds, "the socket answers again after signal \(signal)")
            XCTAssertLessThan(seconds ?? 99, 1.0, "within a second after signal \(signal)")
            let next = try front()
            XCTAssertNotEqual(next, previous, "a new front: \((try? String(contentsOfFile: "/proc/\(next)/status", encoding: .utf8)) ?? "") \(daemon.log)")
            previous = next
            XCTAssertTrue(daemon.isMounted, "the mount stays after signal \(signal)")
            usleep(100_000)
        }
        XCTAssertTrue(FileManager.default.createFile(atPath: stopFlag, contents: Data()))
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(writer, seconds: 60, status: &status))
        let output = (try? String(contentsOfFile: writerLog, encoding: .utf8)) ?? ""
        XCTAssertEqual(status, 0, output)
        XCTAssertTrue(output.hasPrefix("wrote "), output)
        XCTAssertGreaterThan(Int(output.dropFirst(6).trimmingCharacters(in: "\n")) ?? 0, 2, output)
        XCTAssertTrue(daemon.log.contains("was killed by signal 9; starting a new one"), daemon.log)
        XCTAssertTrue(daemon.log.contains("trapping on request"), daemon.log)
        XCTAssertEqual(daemon.log.components(separatedBy: "; starting a new one").count - 1, 4, daemon.log)
        // The daemon itself still answers everything, and the mount still serves.
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts").status, 200)
        try writeFile(daemon.mnt("after"), Array("after".utf8))
        XCTAssertEqual(try readFile(daemon.mnt("after")), Array("after".utf8))
    }

    /// A daemon killed outright takes its front with it: nothing is left holding the socket.
    func testTheFrontEndsWithTheDaemon() throws {
        let pid = try front()
        daemon.killHard()
        _ = try? eventually("the front to go", timeout: 5) { kill(pid, 0) != 0 }
        XCTAssertNotEqual(kill(pid, 0), 0, "the front (\(pid)) is gone")
        XCTAssertNotEqual((try? daemon.api("GET", "/v1/status").status) ?? 0, 200)
    }

    /// One user holding hundreds of idle connections starves nobody: it gets at most its share
    /// (the rest are answered 503 at once), its idle connections are closed after the head
    /// timeout, and meanwhile root's wipe and another user's unlock go through.
    func testOneUserCannotStarveTheOthers() throws {
        try daemon.openToOtherUsers()
        let hog = try testUser(), other = try testUser("custody-test2")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@contoso.com", "passphrase": "pw", "uid": \#(other)}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "carol-oid", "upn": "carol@contoso.com"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/bob@contoso.com/lock").status, 200)
        let script = daemon.root + "/hog.py", report = daemon.root + "/hog.log"
        try writeFile(script, Array("""
            import socket, sys, time
            path, count = sys.argv[1], int(sys.argv[2])
            held = []
            for _ in range(count):
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                held.append(s)
            time.sleep(1.0)
            def answered(s, prefix):
                s.setblocking(False)
                try:
                    data = s.recv(64)
                except BlockingIOError:
                    return False
                return data.startswith(prefix) or (prefix == b"" and data == b"")
            refused = [s for s in held if answered(s, b"HTTP/1.1 503")]
            print("refused", len(refused), flush=True)
            kept = [s for s in held if s not in refused]
            time.sleep(float(sys.argv[3]))
            closed = sum(1 for s in kept if answered(s, b"HTTP/1.1 408") or answered(s, b""))
            print("kept", len(kept), "closed", closed, flush=True)
            """.utf8), mode: 0o755)
        let hogger = try spawn("setpriv", ["--reuid=\(hog)", "--regid=\(hog)", "--clear-groups", "/usr/bin/python3", script, daemon.socket, "300", "6"],
                               stdoutPath: report, stderrPath: report)
        defer { kill(hogger, SIGKILL); waitForExit(hogger, seconds: 5) }
        usleep(1_500_000)
        // Meanwhile: root wipes, the other user unlocks its own account.
        let wipe = try daemon.api("POST", "/v1/accounts/carol@contoso.com/wipe")
        XCTAssertEqual(wipe.status, 200, wipe.body)
        let unlock = try daemon.api("POST", "/v1/accounts/bob@contoso.com/unlock", #"{"passphrase": "pw"}"#, asUser: other)
        XCTAssertEqual(unlock.status, 200, unlock.body)
        XCTAssertTrue(waitForExit(hogger, seconds: 30))
        let lines = ((try? String(contentsOfFile: report, encoding: .utf8)) ?? "").split(separator: "\n")
        XCTAssertEqual(lines.first, "refused \(300 - 32)", "\(lines)")
        XCTAssertEqual(lines.dropFirst().first, "kept 32 closed 32", "idle connections are closed after the head timeout: \(lines)")
        XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200)
    }

    /// 500 idle connections and a client sending its request a byte a second: another client's
    /// requests go on being answered at once, all on one event loop (no thread per connection);
    /// the idle ones and the slow one are answered 408 at the head deadline and closed.
    func testIdleAndSlowClientsStopNobody() throws {
        let pid = try front()
        let script = daemon.root + "/crowd.py", report = daemon.root + "/crowd.log"
        try writeFile(script, Array("""
            import select, socket, sys, time
            path = sys.argv[1]
            held = []
            for _ in range(500):
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                held.append(s)
            slow = socket.socket(socket.AF_UNIX)
            slow.connect(path)
            start = time.monotonic()
            print("connected", flush=True)
            sent = 0
            for byte in b"GET /v1/status HTTP/1.1\\r\\nHost: slow\\r\\n\\r\\n":
                if select.select([slow], [], [], 0)[0]:
                    break
                try:
                    slow.send(bytes([byte]))
                except OSError:
                    break
                sent += 1
                time.sleep(1)
            slow.settimeout(10)
            answer = slow.recv(64)
            print("slow", sent, answer[:12].decode(errors="replace"), round(time.monotonic() - start), flush=True)
            answers = {}
            for s in held:
                s.settimeout(10)
                data = s.recv(64)[:12].decode(errors="replace")
                answers[data] = answers.get(data, 0) + 1
            print("idle", sorted(answers.items()), flush=True)
            """.utf8), mode: 0o755)
        let crowd = try spawn("/usr/bin/python3", [script, daemon.socket], stdoutPath: report, stderrPath: report)
        defer { kill(crowd, SIGKILL); waitForExit(crowd, seconds: 5) }
        _ = try? eventually("the crowd to connect", timeout: 20) { ((try? String(contentsOfFile: report, encoding: .utf8)) ?? "").contains("connected") }
        // While the crowd waits: requests of a normal client, each answered well within a second.
        var slowest = 0.0
        for _ in 0..<40 {
            let began = Date()
            XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200)
            slowest = max(slowest, Date().timeIntervalSince(began))
            usleep(150_000)
        }
        XCTAssertLessThan(slowest, 1.0, "a request waited \(slowest) s behind the crowd")
        let threads = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8).split(separator: "\n").first { $0.hasPrefix("Threads:") } ?? ""
        XCTAssertLessThanOrEqual(Int(threads.split(separator: "\t").last ?? "") ?? 99, 3, "the front serves the crowd on its event loop: \(threads)")
        XCTAssertTrue(waitForExit(crowd, seconds: 30))
        let lines = ((try? String(contentsOfFile: report, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        // The slow client got 5 of its bytes in before the head deadline cut it off.
        let slow = lines.first { $0.hasPrefix("slow ") }?.split(separator: " ").map(String.init) ?? []
        XCTAssertEqual(slow.count, 5, "\(lines)")
        if slow.count == 5 {
            XCTAssertTrue((4...6).contains(Int(slow[1]) ?? 0), "\(lines)")
            XCTAssertEqual(slow[2] + " " + slow[3], "HTTP/1.1 408", "\(lines)")
        }
        XCTAssertEqual(lines.last, "idle [('HTTP/1.1 408', 500)]", "\(lines)")
        XCTAssertEqual(try front(), pid)
    }

    /// A connection is kept open between requests (HTTP/1.1 keep-alive), and closed quietly when
    /// it stays idle past the head deadline.
    func testKeptAliveConnectionsServeSeveralRequestsThenTimeOut() throws {
        let script = daemon.root + "/keepalive.py", report = daemon.root + "/keepalive.log"
        try writeFile(script, Array("""
            import socket, sys, time
            s = socket.socket(socket.AF_UNIX)
            s.connect(sys.argv[1])
            s.settimeout(15)
            def answer():
                data = b""
                while b"\\r\\n\\r\\n" not in data:
                    data += s.recv(4096)
                head, body = data.split(b"\\r\\n\\r\\n", 1)
                length = int([l.split(b":")[1] for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")][0])
                while len(body) < length:
                    body += s.recv(4096)
                return head.split(b"\\r\\n")[0].decode()
            for n in range(3):
                s.sendall(b"GET /v1/status HTTP/1.1\\r\\nHost: k\\r\\n\\r\\n")
                print(answer(), flush=True)
            start = time.monotonic()
            rest = s.recv(64)
            print("closed", repr(rest), round(time.monotonic() - start), flush=True)
            """.utf8), mode: 0o755)
        let client = try spawn("/usr/bin/python3", [script, daemon.socket], stdoutPath: report, stderrPath: report)
        defer { kill(client, SIGKILL); waitForExit(client, seconds: 5) }
        XCTAssertTrue(waitForExit(client, seconds: 30))
        let lines = ((try? String(contentsOfFile: report, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        XCTAssertEqual(Array(lines.prefix(3)), Array(repeating: "HTTP/1.1 200 OK", count: 3), "\(lines)")
        XCTAssertEqual(lines.dropFirst(3).first, "closed b'' 5", "\(lines)")
    }

    /// The front keeps nothing of the connections and requests it has served.
    func testTheFrontsMemoryDoesNotGrowWithRequests() throws {
        let pid = try front()
        func resident() -> Int {
            let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
        }
        let script = daemon.root + "/many.py"
        try writeFile(script, Array("""
            import socket, sys
            for n in range(int(sys.argv[2])):
                s = socket.socket(socket.AF_UNIX)
                s.connect(sys.argv[1])
                s.sendall(b"GET /v1/status HTTP/1.1\\r\\nConnection: close\\r\\n\\r\\n" if n % 2 else b"bad request\\r\\n\\r\\n")
                while s.recv(65536):
                    pass
                s.close()
            """.utf8), mode: 0o755)
        func run(_ count: Int) throws {
            let client = try spawn("/usr/bin/python3", [script, daemon.socket, "\(count)"])
            XCTAssertTrue(waitForExit(client, seconds: 120))
        }
        try run(300)
        let before = resident()
        try run(3000)
        let grown = resident() - before
        XCTAssertLessThan(grown, 3 * 1024, "the front grew by \(grown) KiB over 3,000 connections")
        XCTAssertEqual(try front(), pid)
    }

    /// An event stream crosses the front (chunked), and ends for the daemon when its client goes.
    func testEventStreamsCrossTheFront() throws {
        let log = daemon.root + "/stream.log"
        let stream = try spawn("curl", ["-s", "-N", "--unix-socket", daemon.socket, "http://localhost/v1/events?after=latest"], stdoutPath: log)
        defer { kill(stream, SIGKILL); waitForExit(stream, seconds: 5) }
        usleep(300_000)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "a-oid", "upn": "a@contoso.com", "enroll": false}"#).status, 201)
        _ = try? eventually("the event in the log") { ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("registered") }
        XCTAssertTrue(((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains(#""kind":"registered""#))
    }
}
