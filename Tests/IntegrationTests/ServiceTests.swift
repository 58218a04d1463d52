import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// custodyd as a system service, without a running systemd: readiness, status and watchdog pings
/// on a datagram socket passed as NOTIFY_SOCKET, socket activation through
/// systemd-socket-activate, the configuration file (--check-config, refusing a bad one, SIGHUP
/// reload of mounts and settings), journald-style logs with scrubbed identities.
final class ServiceTests: XCTestCase {
    var root: String!
    var pid: pid_t = 0
    var mountPoints: [String] = []
    var notify: Int32 = -1

    override func setUpWithError() throws {
        try MountedDaemon.requireFUSE()
        root = try makeTemporaryDirectory("custody-service")
        try FileManager.default.createDirectory(atPath: root + "/state", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    override func tearDown() {
        if pid > 0 {
            kill(pid, SIGTERM)
            var status: Int32 = 0
            if waitForExit(pid, seconds: 10, status: &status) {
                XCTAssertEqual(status, 0, "custodyd \(describeExit(status)) after SIGTERM")
            } else {
                kill(pid, SIGKILL)
                waitForExit(pid, seconds: 5)
                XCTFail("custodyd did not exit within 10 s of SIGTERM")
            }
        }
        for mountPoint in mountPoints where MountTable.entry(at: mountPoint) != nil { _ = try? runCommand(["fusermount3", "-uz", mountPoint]) }
        if notify >= 0 { close(notify) }
        _ = try? runCommand(["rm", "-rf", root])
    }

    /// A backing directory and an empty mount point named `name`.
    func makeMount(_ name: String) throws -> (String, String) {
        let backing = root + "/\(name)-backing", mountPoint = root + "/\(name)"
        for directory in [backing, mountPoint] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        mountPoints.append(mountPoint)
        return (backing, mountPoint)
    }

    func writeConfig(_ text: String) throws -> String {
        let path = root + "/custody.toml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    func config(mounts: [(String, String)], extra: String = "") -> String {
        var text = """
            state = "\(root!)/state"
            [control]
            socket = "\(root!)/control.sock"
            mode = "0600"
            [settings]
            MultiIdentity = true
            \(extra)

            """
        for (backing, mountPoint) in mounts { text += "[[mount]]\nbacking = \"\(backing)\"\nmount_point = \"\(mountPoint)\"\n" }
        return text
    }

    /// A datagram socket for NOTIFY_SOCKET; returns its path.
    func listenForNotifications() throws -> String {
        let path = root + "/notify.sock"
        notify = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(notify, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { throw HarnessError("bind \(path): \(Errno.current)") }
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(notify, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return path
    }

    /// Notification datagrams until one contains `wanted` (or the time is up); all of them.
    func notifications(until wanted: String, seconds: Double = 15) -> [String] {
        var received: [String] = []
        let deadline = Date().addingTimeInterval(seconds)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while Date() < deadline {
            let count = buffer.withUnsafeMutableBytes { recv(notify, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                let message = String(decoding: buffer[0..<count], as: UTF8.self)
                received.append(message)
                if message.contains(wanted) { return received }
            }
        }
        return received
    }

    /// Starts custodyd with `arguments` and extra environment variables.
    func startDaemon(_ arguments: [String], environment: [String: String] = [:], program: String = MountedDaemon.binary) throws {
        let log = root + "/custodyd.log"
        pid = try spawn(program, arguments, stdoutPath: log, stderrPath: log, environment: environment)
    }

    var log: String { (try? String(contentsOfFile: root + "/custodyd.log", encoding: .utf8)) ?? "" }

    func waitForMount(_ mountPoint: String, present: Bool = true, seconds: Double = 15) -> Bool {
        (try? eventually("\(mountPoint) \(present ? "mounted" : "unmounted")", timeout: seconds) {
            (MountTable.entry(at: mountPoint)?.fileSystemType == "fuse.custody") == present
        }) != nil
    }

    func api(_ method: String, _ path: String, _ body: String? = nil, socket: String? = nil) throws -> (Int, String) {
        var arguments = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket", socket ?? root + "/control.sock", "-X", method]
        if let body { arguments += ["--data-binary", body] }
        let output = try runCommand(arguments + ["http://localhost" + path]).output.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(output.last ?? "") ?? 0, output.dropLast().joined(separator: "\n"))
    }

    // MARK: Tests

    func testReadinessStatusWatchdogReloadAndStoppingAreNotified() throws {
        let first = try makeMount("one"), second = try makeMount("two")
        let path = try writeConfig(config(mounts: [first]))
        let notifySocket = try listenForNotifications()
        try startDaemon(["--config", path], environment: ["NOTIFY_SOCKET": notifySocket, "WATCHDOG_USEC": "400000"])

        let startup = notifications(until: "READY=1")
        XCTAssertTrue(startup.last?.contains("READY=1") ?? false, "READY=1: \(startup); log: \(log)")
        XCTAssertTrue(MountTable.entry(at: first.1) != nil, "READY=1 only once the mount is live")
        XCTAssertEqual(try api("GET", "/v1/status").0, 200, "and the control socket serves")
        XCTAssertTrue(startup.last?.contains("STATUS=serving \(first.1)") ?? false, "\(startup)")
        XCTAssertTrue(startup.last?.contains("MAINPID=\(pid)") ?? false)
        let pings = notifications(until: "WATCHDOG=1", seconds: 5)
        XCTAssertTrue(pings.contains("WATCHDOG=1"), "watchdog pings: \(pings)")

        // Reload: a second mount, a new setting.
        _ = try writeConfig(config(mounts: [first, second], extra: "LockGracePeriod = 3"))
        kill(pid, SIGHUP)
        let reload = notifications(until: "READY=1")
        XCTAssertTrue(reload.contains { $0.hasPrefix("RELOADING=1") }, "\(reload)")
        XCTAssertTrue(waitForMount(second.1), "the new mount is live after the reload; log: \(log)")
        let status = try api("GET", "/v1/status").1
        XCTAssertTrue(status.contains(first.1) && status.contains(second.1), status)

        // Reload: the first mount removed.
        _ = try writeConfig(config(mounts: [second]))
        kill(pid, SIGHUP)
        XCTAssertTrue(notifications(until: "READY=1").contains { $0.hasPrefix("RELOADING=1") })
        XCTAssertTrue(waitForMount(first.1, present: false), "the removed mount is unmounted; log: \(log)")
        XCTAssertTrue(MountTable.entry(at: second.1) != nil)

        // A broken configuration is refused on reload; the daemon keeps running as it was.
        _ = try writeConfig("[settings]\nMaxFileProtectionLevel = \"ultra\"\n")
        kill(pid, SIGHUP)
        _ = notifications(until: "READY=1")
        XCTAssertTrue(log.contains("reload refused"), log)
        XCTAssertTrue(log.contains("custody.toml:2: settings.MaxFileProtectionLevel"), log)
        XCTAssertEqual(try api("GET", "/v1/status").0, 200)

        kill(pid, SIGTERM)
        let stopping = notifications(until: "STOPPING=1")
        XCTAssertTrue(stopping.contains("STOPPING=1"), "\(stopping)")
        var exitStatus: Int32 = 0
        XCTAssertTrue(waitForExit(pid, seconds: 10, status: &exitStatus))
        pid = 0
        XCTAssertEqual(exitStatus, 0)
        XCTAssertNil(MountTable.entry(at: second.1), "unmounted on stop")
    }

    func testSocketActivation() throws {
        let mount = try makeMount("work")
        let socketPath = root + "/activated.sock"
        try startDaemon(["-l", socketPath, MountedDaemon.binary, "--state", root + "/state", mount.0, mount.1], program: "systemd-socket-activate")
        // systemd-socket-activate starts the daemon at the first connection, which it then serves.
        _ = try? eventually("the activation socket") { access(socketPath, F_OK) == 0 }
        XCTAssertEqual(try api("GET", "/v1/status", socket: socketPath).0, 200, log)
        XCTAssertTrue(waitForMount(mount.1), log)
        let (status, body) = try api("GET", "/v1/status", socket: socketPath)
        XCTAssertEqual(status, 200, body)
        XCTAssertTrue(body.contains(mount.1), body)
        XCTAssertTrue(log.contains("socket activation"), log)
        XCTAssertFalse(FileManager.default.fileExists(atPath: "/run/custody/control.sock") && log.contains("control socket /run/custody"), "it did not bind its own")
    }

    func testCheckConfigAndRefusingABadConfiguration() throws {
        let mount = try makeMount("work")
        let good = try writeConfig(config(mounts: [mount]))
        let checked = try runCommand([MountedDaemon.binary, "--check-config", good])
        XCTAssertEqual(checked.status, 0, checked.error)
        XCTAssertTrue(checked.output.contains("OK (1 mount)"), checked.output)

        let bad = root + "/bad.toml"
        try """
            state = "\(root!)/state"
            [settings]
            MultiIdentity = "yes"
            Colour = "blue"
            [[mount]]
            backing = "\(root!)/nowhere"
            mount_point = "\(mount.1)"
            """.write(toFile: bad, atomically: true, encoding: .utf8)
        let refused = try runCommand([MountedDaemon.binary, "--check-config", bad])
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.error.contains("bad.toml:3: settings.MultiIdentity: must be true or false, not a string"), refused.error)
        XCTAssertTrue(refused.error.contains("bad.toml:4: settings.Colour: unknown key"), refused.error)
        let started = try runCommand([MountedDaemon.binary, "--config", bad])
        XCTAssertEqual(started.status, 1, "the daemon refuses it too")
        XCTAssertTrue(started.error.contains("bad.toml:3: settings.MultiIdentity"), started.error)
        XCTAssertNil(MountTable.entry(at: mount.1))

        try """
            [[mount]]
            backing = "\(root!)/nowhere"
            mount_point = "\(mount.1)"
            """.write(toFile: bad, atomically: true, encoding: .utf8)
        let missing = try runCommand([MountedDaemon.binary, "--check-config", bad])
        XCTAssertEqual(missing.status, 1)
        XCTAssertTrue(missing.error.contains("bad.toml:2: mount[1].backing: backing directory \(root!)/nowhere does not exist"), missing.error)
    }

    func testJournalPrioritiesAndScrubbedIdentities() throws {
        let mount = try makeMount("work")
        let path = try writeConfig(config(mounts: [mount], extra: "ValuesToScrubFromLogging = [\"secret-project\"]\nScrubAccountIdentities = true"))
        try startDaemon(["--config", path, "--log-level", "debug"], environment: ["CUSTODY_LOG_JOURNAL": "1"])
        XCTAssertTrue(waitForMount(mount.1), log)
        XCTAssertEqual(try api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#).0, 201)
        XCTAssertEqual(try api("POST", "/v1/accounts/alice@contoso.com/lock").0, 200)
        try FileManager.default.createDirectory(atPath: mount.1 + "/secret-project", withIntermediateDirectories: true)
        XCTAssertEqual(try api("POST", "/v1/files/protect", #"{"path": "\#(mount.1)/secret-project", "identity": "alice@contoso.com"}"#).0, 200)
        usleep(200_000)
        let lines = log.split(separator: "\n")
        XCTAssertFalse(lines.isEmpty)
        XCTAssertTrue(lines.allSatisfy { $0.hasPrefix("<") && $0.dropFirst().first?.isNumber == true }, "journal priorities: \(lines.prefix(3))")
        XCTAssertTrue(lines.contains { $0.hasPrefix("<6>lockRequested") }, log)
        XCTAssertFalse(log.lowercased().contains("alice@contoso.com"), log)
        XCTAssertFalse(log.contains("alice-oid"), log)
        XCTAssertTrue(log.contains("[scrubbed:"), log)

        // The support bundle is scrubbed the same way, configuration included.
        let bundle = try runCommand([MountedDaemon.tool("custodyctl"), "diagnose", "--socket", root + "/control.sock", "--out", "-"])
        XCTAssertEqual(bundle.status, 0, bundle.error)
        XCTAssertTrue(bundle.output.contains("\"configuration\""), bundle.output)
        XCTAssertTrue(bundle.output.contains("ScrubAccountIdentities"), "the configuration is in it")
        XCTAssertTrue(bundle.output.contains("lockRequested"), "recent events are in it")
        XCTAssertTrue(bundle.output.contains("\"custodyctl\""), "the client's version is in it")
        XCTAssertFalse(bundle.output.lowercased().contains("alice@contoso.com"), bundle.output)
        XCTAssertFalse(bundle.output.contains("secret-project"), "configured values are scrubbed, the configuration's own included")
        XCTAssertNotNil(try? JSONSerialization.jsonObject(with: Data(bundle.output.utf8)), "the bundle is JSON")
    }
}
