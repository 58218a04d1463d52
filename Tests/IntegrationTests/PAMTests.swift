import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// pam_custody.so with pamtester, against a PAM service the test writes (pam_unix + the module)
/// and a user whose password it sets with chpasswd.
final class PAMTests: XCTestCase {
    var daemon: MountedDaemon!
    var service: String?
    var work: String!
    static let user = "custody-pam"
    static let identity = "pat@contoso.com"

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
        if let service { unlink("/etc/pam.d/" + service) }
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    /// The module `make build` made, else one compiled here.
    func module() throws -> String {
        let built = MountedDaemon.tool("pam_custody.so")
        if access(built, R_OK) == 0 { return built }
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("pam/pam_custody.c").path
        let output = work + "/pam_custody.so"
        try mustRun(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-o", output, source, "-lpam"])
        return output
    }

    func setPassword(_ password: String) throws {
        try mustRun(["chpasswd"], input: Data("\(Self.user):\(password)\n".utf8))
    }

    /// pamtester as root with `input` on its standard input; the exit status and output.
    func pamtester(_ operations: [String], input: String) throws -> CommandResult {
        try runCommand(["pamtester", try XCTUnwrap(service), Self.user] + operations, input: Data(input.utf8))
    }

    func lockState() throws -> String { try daemon.lockState(Self.identity) }

    func lock() throws {
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/lock").status, 200)
        XCTAssertEqual(try lockState(), "locked")
    }

    /// The user with `password`, a daemon, and a PAM service: pam_unix and the module with the
    /// given options in each step (`password: nil` leaves the password step out).
    func start(password login: String, auth: String, session: String, password: String?) throws {
        work = try makeTemporaryDirectory("custody-pam")
        XCTAssertEqual(chmod(work, 0o755), 0)
        _ = try testUser(Self.user)
        try setPassword(login)
        let started = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "0", "--no-sessions"])
        daemon = started
        let module = try self.module()
        service = "custody-test-\(getpid())"
        var lines = ["auth     required pam_unix.so", "auth     optional \(module) socket=\(started.socket)\(auth)",
                     "account  required pam_unix.so", "session  optional \(module) socket=\(started.socket)\(session)"]
        if let password { lines += ["password required pam_unix.so", "password optional \(module) socket=\(started.socket)\(password)"] }
        try lines.joined(separator: "\n").write(toFile: "/etc/pam.d/" + service!, atomically: true, encoding: .utf8)
    }

    func testLoginUnlocksPasswordChangesRewrapAndNothingBlocksALogin() throws {
        try start(password: "Login-pass-1", auth: "", session: "", password: "")

        // Pat's identity has a passphrase of its own; the login password becomes a second key.
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "pat-oid", "upn": "\#(Self.identity)", "user": "\#(Self.user)", "policy": {"protectionLevel": "complete"}, "passphrase": "corporate passphrase"}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        let protected = try daemon.ctl(["protector", "add-login", Self.identity, "--password-stdin"], input: "Login-pass-1\n")
        XCTAssertEqual(protected.status, 0, protected.error)
        XCTAssertTrue(try daemon.api("GET", "/v1/accounts/\(Self.identity)").body.contains(#""hasLoginProtector":true"#))

        // The right password: the login goes through and the identity unlocks.
        try lock()
        let login = try pamtester(["authenticate", "open_session"], input: "Login-pass-1\n")
        XCTAssertEqual(login.status, 0, login.output + login.error)
        XCTAssertEqual(try lockState(), "unlocked", daemon.log)

        // A screen locker's unlock: authenticate, then refresh the credentials.
        try lock()
        let screen = try pamtester(["authenticate", "setcred(PAM_REINITIALIZE_CRED)"], input: "Login-pass-1\n")
        XCTAssertEqual(screen.status, 0, screen.output + screen.error)
        XCTAssertEqual(try lockState(), "unlocked", "unlocking the screen with the login password unlocks the identity")

        // A wrong one: pam_unix refuses the login, the identity stays locked.
        try lock()
        let wrong = try pamtester(["authenticate", "open_session"], input: "not the password\n")
        XCTAssertNotEqual(wrong.status, 0, "the login's result is pam_unix's")
        XCTAssertEqual(try lockState(), "locked")

        // A password change rewraps the protector: the new password unlocks, the old does not.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/unlock", #"{"passphrase": "corporate passphrase"}"#).status, 200)
        let changed = try pamtester(["chauthtok"], input: "New-pass-2\nNew-pass-2\n")
        XCTAssertEqual(changed.status, 0, changed.output + changed.error)
        try lock()
        let old = try daemon.api("POST", "/v1/login/unlock", #"{"user": "\#(Self.user)", "password": "Login-pass-1"}"#)
        XCTAssertEqual(old.status, 207, "some identities stay locked: \(old.body)")
        XCTAssertTrue(old.body.contains(#""stillLocked":["\#(Self.identity)"]"#), old.body)
        XCTAssertEqual(try lockState(), "locked", "the old password no longer unlocks")
        let relogin = try pamtester(["authenticate", "open_session"], input: "New-pass-2\n")
        XCTAssertEqual(relogin.status, 0, relogin.output + relogin.error)
        XCTAssertEqual(try lockState(), "unlocked")
        XCTAssertTrue(try daemon.api("POST", "/v1/accounts/\(Self.identity)/unlock", #"{"passphrase": "corporate passphrase"}"#).status == 200,
                      "the passphrase still unlocks as well")

        // No password in the daemon's log.
        for secret in ["Login-pass-1", "New-pass-2", "not the password", "corporate passphrase"] {
            XCTAssertFalse(daemon.log.contains(secret), "\(secret) is in the log")
        }

        // The daemon stopped: the login still goes through.
        daemon.stop()
        let unreachable = try pamtester(["authenticate", "open_session", "close_session"], input: "New-pass-2\n")
        XCTAssertEqual(unreachable.status, 0, unreachable.output + unreachable.error)
    }

    func testFirstLoginSetsUpTheProtectorAndLogoutLocks() throws {
        try start(password: "Login-pass-3", auth: " add_protector", session: " add_protector lock_on_close", password: nil)
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "pat-oid", "upn": "\#(Self.identity)", "user": "\#(Self.user)", "passphrase": "corporate passphrase"}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        XCTAssertTrue(try daemon.api("GET", "/v1/accounts/\(Self.identity)").body.contains(#""hasLoginProtector":false"#))
        // The first login, the identity unlocked: it gets a protector with the checked password.
        let first = try pamtester(["authenticate", "open_session"], input: "Login-pass-3\n")
        XCTAssertEqual(first.status, 0, first.output + first.error)
        XCTAssertTrue(try daemon.api("GET", "/v1/accounts/\(Self.identity)").body.contains(#""hasLoginProtector":true"#))
        // A session that closes locks it (lock_on_close); the next login unlocks it.
        let whole = try pamtester(["authenticate", "open_session", "close_session"], input: "Login-pass-3\n")
        XCTAssertEqual(whole.status, 0, whole.output + whole.error)
        XCTAssertEqual(try lockState(), "locked")
        XCTAssertEqual(try pamtester(["authenticate", "open_session"], input: "Login-pass-3\n").status, 0)
        XCTAssertEqual(try lockState(), "unlocked")
    }

    /// A session held open by pamtester: it opens the session, then waits for a password on its
    /// standard input (its authenticate step) before it closes the session.
    func openSession(output: String) throws -> (process: Process, input: Pipe) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/pamtester")
        process.arguments = [try XCTUnwrap(service), Self.user, "open_session", "authenticate", "close_session"]
        let input = Pipe()
        process.standardInput = input
        XCTAssertTrue(FileManager.default.createFile(atPath: output, contents: nil))
        process.standardOutput = FileHandle(forWritingAtPath: output)
        process.standardError = process.standardOutput
        try process.run()
        // Open once it asks for the password.
        _ = try? eventually("the password prompt") { ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").contains("assword") }
        XCTAssertTrue(((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").contains("assword"), "the session opened")
        return (process, input)
    }

    /// Closing one of a user's sessions locks its identities only when it was the last: an ssh
    /// logout must not lock what the user's open desktop session uses.
    func testLogoutLocksOnlyWhenTheLastSessionCloses() throws {
        try start(password: "Login-pass-4", auth: "", session: " lock_on_close", password: nil)
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "pat-oid", "upn": "\#(Self.identity)", "user": "\#(Self.user)"}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        XCTAssertEqual(try lockState(), "unlocked", "no passphrase: unlocked")

        // The desktop session stays open while an ssh session opens and closes.
        let desktop = try openSession(output: work + "/desktop.out")
        let ssh = try pamtester(["open_session", "close_session"], input: "")
        XCTAssertEqual(ssh.status, 0, ssh.output + ssh.error)
        XCTAssertEqual(try lockState(), "unlocked", "another session is open: nothing locks")
        // The desktop logs out: its last session, the identity locks.
        desktop.input.fileHandleForWriting.write(Data("Login-pass-4\n".utf8))
        try desktop.input.fileHandleForWriting.close()
        desktop.process.waitUntilExit()
        XCTAssertEqual(desktop.process.terminationStatus, 0, (try? String(contentsOfFile: work + "/desktop.out", encoding: .utf8)) ?? "")
        XCTAssertEqual(try lockState(), "locked", "the last session closed")

        // A session whose process died without closing does not count.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/unlock", "{}").status, 200)
        let killed = try openSession(output: work + "/killed.out")
        killed.process.terminate()
        kill(killed.process.processIdentifier, SIGKILL)
        killed.process.waitUntilExit()
        XCTAssertEqual(try pamtester(["open_session", "close_session"], input: "").status, 0)
        XCTAssertEqual(try lockState(), "locked", "the killed session was not still open")

        // The routes say what closing did; a close naming no session locks at once.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/unlock", "{}").status, 200)
        let open = try daemon.api("POST", "/v1/login/open", #"{"user": "\#(Self.user)", "session": \#(getpid())}"#)
        XCTAssertEqual(open.status, 204, open.body)
        let other = try daemon.apiJSON("POST", "/v1/login/lock", #"{"user": "\#(Self.user)", "session": 999999}"#)
        XCTAssertEqual(other.json["otherSessions"] as? Int, 1, "\(other.json)")
        XCTAssertEqual(other.json["locking"] as? [String], [])
        XCTAssertEqual(try lockState(), "unlocked")
        let last = try daemon.apiJSON("POST", "/v1/login/lock", #"{"user": "\#(Self.user)", "session": \#(getpid())}"#)
        XCTAssertEqual(last.json["locking"] as? [String], [Self.identity], "\(last.json)")
        XCTAssertEqual(try lockState(), "locked")
        XCTAssertEqual(try daemon.api("POST", "/v1/login/open", #"{"user": "\#(Self.user)"}"#).status, 400, "an open names its session")
    }

    func testTheLoginRoutesAuthorizeByUser() throws {
        work = try makeTemporaryDirectory("custody-pam")
        let pat = try testUser(Self.user)
        let other = try testUser("custody-test2")
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "0", "--no-sessions", "--socket-mode", "0666"])
        try daemon.openToOtherUsers()
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "pat-oid", "upn": "\#(Self.identity)", "user": "\#(Self.user)", "passphrase": "corporate passphrase"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/login-protector", #"{"password": "pw-1"}"#, asUser: other).status, 403)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.identity)/login-protector", #"{"password": "pw-1"}"#, asUser: pat).status, 200)
        try lock()
        XCTAssertEqual(try daemon.api("POST", "/v1/login/unlock", #"{"user": "\#(Self.user)", "password": "pw-1"}"#, asUser: other).status, 403,
                       "another user may not log in for Pat")
        let own = try daemon.api("POST", "/v1/login/unlock", #"{"password": "pw-1"}"#, asUser: pat)
        XCTAssertEqual(own.status, 200, own.body)
        XCTAssertTrue(own.body.contains(#""unlocked":["\#(Self.identity)"]"#), own.body)
        XCTAssertEqual(try daemon.api("POST", "/v1/login/password", #"{"new": "pw-2"}"#, asUser: pat).status, 403, "a user gives its old password")
        XCTAssertEqual(try daemon.api("POST", "/v1/login/password", #"{"old": "pw-1", "new": "pw-2"}"#, asUser: pat).status, 200)
        XCTAssertEqual(try daemon.api("POST", "/v1/login/lock", "{}", asUser: pat).status, 200)
        XCTAssertEqual(try lockState(), "locked")
        XCTAssertEqual(try daemon.api("DELETE", "/v1/accounts/\(Self.identity)/login-protector", nil, asUser: pat).status, 204)
        XCTAssertTrue(try daemon.api("POST", "/v1/login/unlock", #"{"password": "pw-2"}"#, asUser: pat).body.contains(#""unlocked":[]"#))
    }
}
