import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Protection that follows the login session: a private `dbus-daemon` stands in for the system
/// bus and python3-dbusmock's logind template for logind; the daemon follows it over sd-bus.
final class SessionLockTests: XCTestCase {
    var daemon: MountedDaemon!
    var processes: [pid_t] = []
    var work: String!
    var address = ""

    static let alice = "alice@contoso.com"   // class A, a passphrase, custody-test's
    static let bob = "bob@contoso.com"       // class C, custody-test's
    static let carol = "carol@contoso.com"   // class A, custody-test2's (no session)
    static let dave = "dave@contoso.com"     // class B, custody-test's

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
        for process in processes.reversed() { kill(process, SIGTERM); if !waitForExit(process, seconds: 5) { kill(process, SIGKILL); waitForExit(process, seconds: 5) } }
        unsetenv("DBUS_SYSTEM_BUS_ADDRESS")
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    /// A bus of the test's own, with logind's mock on it.
    func startLogind() throws {
        work = try makeTemporaryDirectory("custody-sessions")
        let socket = work + "/system_bus_socket"
        address = "unix:path=" + socket
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>system</type>
              <listen>\(address)</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow user="*"/>
                <allow own="*"/>
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
              </policy>
            </busconfig>
            """.write(toFile: work + "/bus.conf", atomically: true, encoding: .utf8)
        processes.append(try spawn("dbus-daemon", ["--config-file=\(work!)/bus.conf", "--nofork", "--nopidfile"], stderrPath: work + "/bus.log"))
        try eventually("the bus") { access(socket, F_OK) == 0 }
        processes.append(try spawn("/usr/bin/python3", ["-m", "dbusmock", "--system", "--template", "logind"],
                                   stdoutPath: work + "/logind.log", stderrPath: work + "/logind.log",
                                   environment: ["DBUS_SYSTEM_BUS_ADDRESS": address]))
        try eventually("logind's mock") { (try? self.call("/org/freedesktop/login1", "org.freedesktop.login1.Manager.ListSessions"))?.status == 0 }
        setenv("DBUS_SYSTEM_BUS_ADDRESS", address, 1)
    }

    @discardableResult
    func call(_ path: String, _ method: String, _ arguments: [String] = []) throws -> CommandResult {
        try runCommand(["gdbus", "call", "--address", address, "--dest", "org.freedesktop.login1", "--object-path", path, "--method", method] + arguments)
    }

    func mustCall(_ path: String, _ method: String, _ arguments: [String] = []) throws {
        let result = try call(path, method, arguments)
        XCTAssertEqual(result.status, 0, "\(method): \(result.error)")
    }

    func inhibitors() throws -> String { try call("/org/freedesktop/login1", "org.freedesktop.login1.Manager.ListInhibitors").output }

    func lockState(_ identity: String) throws -> String { try daemon.lockState(identity) }

    func waitForLock(_ identity: String, _ state: String, seconds: Double = 5) throws {
        try eventually("\(identity) \(state)", timeout: seconds) { (try? self.lockState(identity)) == state }
    }

    func start() throws -> (owner: UInt32, other: UInt32) {
        let owner = try testUser("custody-test")
        let other = try testUser("custody-test2")
        try startLogind()
        try mustCall("/org/freedesktop/login1", "org.freedesktop.DBus.Mock.AddSession", ["c1", "seat0", "\(owner)", "custody-test", "true"])
        // The test reads the users' files back as root, exempt from the transfer rules.
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--allow-other", "--lock-grace-period", "1", "--transfer-exempt-uid", "0"])
        try eventually("the daemon to follow logind") { self.daemon.log.contains("following logind") }
        let passphrase = #""passphrase": "correct horse""#
        for (id, upn, level, user, secret) in [("alice-oid", Self.alice, "complete", "custody-test", true), ("bob-oid", Self.bob, "untilFirstAuth", "custody-test", false),
                                               ("carol-oid", Self.carol, "complete", "custody-test2", false),
                                               ("dave-oid", Self.dave, "completeUnlessOpen", "custody-test", false)] {
            let body = #"{"id": "\#(id)", "upn": "\#(upn)", "user": "\#(user)", "policy": {"protectionLevel": "\#(level)"}\#(secret ? ", " + passphrase : "")}"#
            let enrolled = try daemon.api("POST", "/v1/accounts", body)
            XCTAssertEqual(enrolled.status, 201, enrolled.body)
        }
        for (identity, name) in [(Self.alice, "a.txt"), (Self.bob, "c.txt"), (Self.carol, "carol.txt"), (Self.dave, "b.txt")] {
            let result = try daemon.ctl(["run", "--identity", identity, "--", "sh", "-c", "echo \(identity) > '\(daemon.mnt(name))'"])
            XCTAssertEqual(result.status, 0, result.error)
        }
        return (owner, other)
    }

    func readable(_ name: String) -> Bool { (try? readFile(daemon.mnt(name))) != nil }

    func testTheScreenLockLocksTheUsersIdentitiesAndUnlockingCallsOffAPendingLock() throws {
        _ = try start()
        XCTAssertTrue(readable("a.txt"))
        // Handles open across the lock: class A's fail, class B's keep writing.
        let classA = try Syscall.open(daemon.mnt("a.txt"), O_RDONLY)
        let classB = try Syscall.open(daemon.mnt("b.txt"), O_WRONLY | O_APPEND)
        defer { close(classA); close(classB) }
        var byte: UInt8 = 0
        XCTAssertEqual(pread(classA, &byte, 1, 0), 1)
        try mustCall("/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.Lock")
        try waitForLock(Self.alice, "locked")
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt("a.txt")) }, EACCES, "class A is unreadable once locked")
        usleep(200_000)
        XCTAssertEqual(pread(classA, &byte, 1, 0), -1, "the open class A handle is refused")
        XCTAssertEqual(errno, EACCES)
        XCTAssertEqual("more\n".withCString { write(classB, $0, 5) }, 5, "an open class B handle keeps writing")
        XCTAssertEqual(fsync(classB), 0)
        XCTAssertTrue(readable("c.txt"), "class C stays readable after the first unlock")
        XCTAssertEqual(try lockState(Self.carol), "unlocked", "another user's identity is not touched")
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains(#""cause":"sessionLock""#), events)

        // Unlocking the screen does not unlock an identity with a passphrase …
        try mustCall("/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.Unlock")
        usleep(300_000)
        XCTAssertEqual(try lockState(Self.alice), "locked", "the screen's password is not Alice's passphrase")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.alice)/unlock", #"{"passphrase": "correct horse"}"#).status, 200)
        XCTAssertTrue(readable("a.txt"))

        // … but coming back within the grace period calls the lock off: the keys never left.
        try mustCall("/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.Lock")
        try waitForLock(Self.alice, "locking", seconds: 2)
        try mustCall("/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.Unlock")
        try waitForLock(Self.alice, "unlocked", seconds: 2)
        usleep(1_300_000)
        XCTAssertEqual(try lockState(Self.alice), "unlocked")
        XCTAssertTrue(readable("a.txt"))

        // A screen locker's LockedHint counts as a lock too.
        try mustCall("/org/freedesktop/login1/session/c1", "org.freedesktop.login1.Session.SetLockedHint", ["true"])
        try waitForLock(Self.alice, "locked")
    }

    func testSuspendLocksAtOnceUnderADelayInhibitor() throws {
        _ = try start()
        XCTAssertTrue(try inhibitors().contains("custodyd"), "a delay inhibitor is held while awake")
        XCTAssertTrue(try inhibitors().contains("delay"))
        try mustCall("/org/freedesktop/login1", "org.freedesktop.DBus.Mock.EmitSignal",
                     ["org.freedesktop.login1.Manager", "PrepareForSleep", "b", "[<true>]"])
        // No grace period before a suspend: locked, and the inhibitor released, at once.
        try eventually("the inhibitor to be released", timeout: 2) { (try? self.inhibitors())?.contains("custodyd") == false }
        XCTAssertEqual(try lockState(Self.alice), "locked", "keys are gone before the inhibitor is released")
        XCTAssertEqual(try lockState(Self.carol), "locked", "suspend locks every identity")
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt("a.txt")) }, EACCES)
        XCTAssertTrue(try daemon.api("GET", "/v1/events?follow=false").body.contains(#""cause":"suspend""#))
        try mustCall("/org/freedesktop/login1", "org.freedesktop.DBus.Mock.EmitSignal",
                     ["org.freedesktop.login1.Manager", "PrepareForSleep", "b", "[<false>]"])
        try eventually("the inhibitor to be taken again", timeout: 2) { (try? self.inhibitors())?.contains("custodyd") == true }
    }

    func testTheLastLogoutLocks() throws {
        _ = try start()
        try mustCall("/org/freedesktop/login1", "org.freedesktop.DBus.Mock.RemoveObject", ["/org/freedesktop/login1/session/c1"])
        try mustCall("/org/freedesktop/login1", "org.freedesktop.DBus.Mock.EmitSignal",
                     ["org.freedesktop.login1.Manager", "SessionRemoved", "so", "[<'c1'>, <objectpath '/org/freedesktop/login1/session/c1'>]"])
        try waitForLock(Self.alice, "locked")
        XCTAssertEqual(try lockState(Self.carol), "unlocked")
        XCTAssertTrue(try daemon.api("GET", "/v1/events?follow=false").body.contains(#""cause":"logout""#))
    }

    func testWithoutABusTheDaemonSaysSoOnceAndLocksByHand() throws {
        setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/custody-test-bus", 1)
        daemon = try MountedDaemon(extraArguments: ["--multi-identity"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "a", "upn": "\#(Self.alice)"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.alice)/lock").status, 200)
        XCTAssertEqual(daemon.log.components(separatedBy: "no system bus").count - 1, 1, daemon.log)
    }
}
