import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Every custodyctl subcommand against a running daemon, in text and --json, with its exit codes.
final class CustodyctlTests: XCTestCase {
    var daemon: MountedDaemon!
    var work: String!
    var children: [pid_t] = []

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "0", "--socket-mode", "0666", "--allow-other"])
        work = try makeTemporaryDirectory("custodyctl")
    }

    override func tearDown() {
        for child in children { kill(child, SIGKILL); waitForExit(child, seconds: 5) }
        daemon?.destroy()
        daemon = nil
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    /// Runs custodyctl and asserts its exit code; returns stdout.
    @discardableResult
    func ctl(_ arguments: [String], exit expected: Int32 = 0, input: String? = nil, asUser uid: UInt32? = nil,
             file: StaticString = #filePath, line: UInt = #line) throws -> String {
        let result = try daemon.ctl(arguments, input: input, asUser: uid)
        XCTAssertEqual(result.status, expected, "custodyctl \(arguments.joined(separator: " ")): \(result.output) \(result.error)", file: file, line: line)
        return result.output
    }

    func json(_ text: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }

    func testGlobalOptionsBeforeTheSubcommandUsersByNameAndPassphrases() throws {
        // --socket and --json before the subcommand.
        let tool = MountedDaemon.tool("custodyctl")
        let early = try runCommand([tool, "--socket", daemon.socket, "--json", "status"])
        XCTAssertEqual(early.status, 0, early.error)
        XCTAssertTrue(early.output.hasPrefix("{"), early.output)
        XCTAssertEqual(try runCommand([tool, "--socket=\(daemon.socket)", "accounts"]).status, 0)
        XCTAssertEqual(try runCommand([tool, "status"], environment: ["CUSTODY_SOCKET": daemon.socket]).status, 0)

        // An account for a local user by name: that user's processes act as it.
        try daemon.openToOtherUsers()
        try mustRun(["chmod", "0755", work])
        let user = try testUser()
        let name = String(cString: try XCTUnwrap(getpwuid(user)).pointee.pw_name)
        XCTAssertEqual(field(json(try ctl(["enroll", "pat-oid", "pat@contoso.com", "--user", name, "--level", "untilFirstAuth", "--json"])), "uid"), "\(user)")
        XCTAssertEqual(try daemon.ctl(["enroll", "nobody-oid", "n@contoso.com", "--user", "no-such-user-here"]).status, 1)
        try mustRun(["chmod", "1777", daemon.mountPoint])
        try mustRun(["setpriv", "--reuid=\(user)", "--regid=\(user)", "--clear-groups", "sh", "-c", "echo mine > '\(daemon.mnt("pat.txt"))'"])
        XCTAssertEqual(xattr(daemon.mnt("pat.txt"), "user.custody.owner"), "pat@contoso.com", "the user's processes act as its account")
        XCTAssertEqual(xattr(daemon.mnt("pat.txt"), "user.custody.encrypted"), "1")

        // Its owner sets, changes and removes the passphrase.
        let first = work + "/first", second = work + "/second"
        try writeFile(first, bytes("first passphrase\n"), mode: 0o644)
        try writeFile(second, bytes("second passphrase\n"), mode: 0o644)
        try ctl(["passphrase", "pat@contoso.com", "--new-file", first], asUser: user)
        XCTAssertEqual(field(json(try ctl(["accounts", "pat@contoso.com", "--json"])), "hasPassphrase"), "1")
        try ctl(["passphrase", "pat@contoso.com", "--old-file", second, "--new-file", second], exit: 77, asUser: user)
        try ctl(["passphrase", "pat@contoso.com", "--old-file", first, "--new-file", second], asUser: user)
        try ctl(["lock", "pat@contoso.com"], asUser: user)
        try ctl(["unlock", "pat@contoso.com", "--passphrase-file", first], exit: 77, asUser: user)
        try ctl(["unlock", "pat@contoso.com", "--passphrase-file", second], asUser: user)
        let other = try testUser("custody-test2")
        try ctl(["passphrase", "pat@contoso.com", "--old-file", second, "--remove"], exit: 77, asUser: other)
        try ctl(["passphrase", "pat@contoso.com", "--old-file", second, "--remove"], asUser: user)
        XCTAssertEqual(field(json(try ctl(["accounts", "pat@contoso.com", "--json"])), "hasPassphrase"), "0")
    }

    func testRecoveryKeysEscrowAndWipe() throws {
        let passphrase = work + "/passphrase", newPassphrase = work + "/new"
        try writeFile(passphrase, bytes("forgotten\n"), mode: 0o600)
        try writeFile(newPassphrase, bytes("brand new\n"), mode: 0o600)
        try ctl(["enroll", "alice-oid", "alice@contoso.com", "--level", "complete", "--passphrase-file", passphrase])
        // The administrator's key pair, and an escrow only it opens (the key is never printed).
        try ctl(["recovery-key", "keypair", work + "/admin"])
        XCTAssertEqual(try Syscall.lstat(work + "/admin.key").st_mode & 0o777, 0o600)
        let exported = try ctl(["recovery-key", "export", "alice@contoso.com", "--to", work + "/admin.pub", "--out", work + "/escrow.json"])
        XCTAssertTrue(exported.contains("escrow.json"), exported)
        let escrow = try String(contentsOfFile: work + "/escrow.json", encoding: .utf8)
        XCTAssertTrue(escrow.contains("custody-recovery-escrow") && escrow.contains("alice@contoso.com"), escrow)
        let key = try ctl(["recovery-key", "unseal", work + "/escrow.json", "--key", work + "/admin.key"]).trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(key.split(separator: "-").count, 8, key)
        XCTAssertFalse(escrow.contains(key))
        try writeFile(work + "/recovery", bytes(key + "\n"), mode: 0o600)

        // The passphrase is lost: the recovery key unlocks and sets a new one.
        try ctl(["lock", "alice@contoso.com"])
        try ctl(["recover", "alice@contoso.com", "--recovery-key-file", work + "/recovery", "--new-passphrase-file", newPassphrase])
        try ctl(["lock", "alice@contoso.com"])
        try ctl(["unlock", "alice@contoso.com", "--passphrase-file", passphrase], exit: 77)
        let status = try ctl(["status"])
        XCTAssertTrue(status.contains("1 wrong passphrase") && status.contains("recovery key"), status)
        try ctl(["unlock", "alice@contoso.com", "--passphrase-file", newPassphrase])
        XCTAssertFalse(try ctl(["status"]).contains("wrong passphrase"), "a right one clears the count")
        XCTAssertTrue(try ctl(["policy", "alice@contoso.com", "--lock-on-suspend", "false"]).contains("locks on suspend: false"))

        // A typo is named; an altered escrow is refused clearly; another key does not open it.
        var typo = Array(key)
        typo[0] = typo[0] == "1" ? "2" : "1"
        try writeFile(work + "/typo", bytes(String(typo) + "\n"), mode: 0o600)
        let mistyped = try daemon.ctl(["recover", "alice@contoso.com", "--recovery-key-file", work + "/typo"])
        XCTAssertEqual(mistyped.status, 77, "a mistyped key is refused (403), as a wrong passphrase is")
        XCTAssertTrue(mistyped.error.contains("314 InvalidRecoveryKey") && mistyped.error.contains("group 1"), mistyped.error)
        try escrow.replacingOccurrences(of: "alice@contoso.com", with: "mallory@contoso.com").write(toFile: work + "/altered.json", atomically: true, encoding: .utf8)
        let altered = try daemon.ctl(["recovery-key", "unseal", work + "/altered.json", "--key", work + "/admin.key"])
        XCTAssertEqual(altered.status, 1)
        XCTAssertTrue(altered.error.contains("altered"), altered.error)
        try ctl(["recovery-key", "keypair", work + "/other"])
        XCTAssertEqual(try daemon.ctl(["recovery-key", "unseal", work + "/escrow.json", "--key", work + "/other.key"]).status, 1)

        // After a wipe the escrowed key opens nothing.
        try ctl(["wipe", "alice@contoso.com"])
        let gone = try daemon.ctl(["recover", "alice@contoso.com", "--recovery-key-file", work + "/recovery"])
        XCTAssertEqual(gone.status, 1)
        XCTAssertTrue(gone.error.contains("300 UnknownAccount"), gone.error)
    }

    func testAccountLockAndIdentityCommands() throws {
        let passphrase = work + "/passphrase"
        try writeFile(passphrase, bytes("correct horse\n"), mode: 0o600)
        XCTAssertTrue(try ctl(["enroll", "alice-oid", "alice@contoso.com", "--level", "complete", "--passphrase-file", passphrase]).contains("enrolled alice@contoso.com"))
        XCTAssertEqual(field(json(try ctl(["enroll", "bob-oid", "bob@fabrikam.com", "--register-only", "--json"])), "enrolled"), "0")
        let again = try daemon.ctl(["enroll", "alice-oid", "alice@contoso.com"])
        XCTAssertEqual(again.status, 1)
        XCTAssertTrue(again.error.contains("208 AlreadyEnrolled"), again.error)

        let status = try ctl(["status"])
        XCTAssertTrue(status.contains(daemon.mountPoint) && status.contains("alice@contoso.com") && status.contains("unlocked"), status)
        XCTAssertEqual((json(try ctl(["status", "--json"]))["accounts"] as? [Any])?.count, 2)
        XCTAssertTrue(try ctl(["accounts"]).contains("bob@fabrikam.com  id bob-oid  registered (unmanaged)"))
        XCTAssertEqual(field(json(try ctl(["accounts", "ALICE@contoso.com", "--json"])), "id"), "alice-oid")

        XCTAssertTrue(try ctl(["policy", "alice@contoso.com"]).contains("protection level: complete"))
        XCTAssertTrue(try ctl(["policy", "alice@contoso.com", "--share", "true", "--level", "NSFileProtectionCompleteUnlessOpen"]).contains("other identities may receive its files: true"))
        XCTAssertEqual(field(json(try ctl(["policy", "alice@contoso.com", "--json"])), "protectionLevel"), "completeUnlessOpen")

        XCTAssertTrue(try ctl(["lock", "alice@contoso.com"]).contains("alice@contoso.com: locked"))
        let wrong = try daemon.ctl(["unlock", "alice@contoso.com", "--passphrase-stdin"], input: "wrong\n")
        XCTAssertEqual(wrong.status, 77, "a wrong passphrase is refused (403): \(wrong.error)")
        XCTAssertTrue(wrong.error.contains("303 WrongPassphrase"), wrong.error)
        XCTAssertTrue(try ctl(["unlock", "alice@contoso.com", "--passphrase-stdin"], input: "correct horse\n").contains("unlocked"))
        XCTAssertTrue(try ctl(["lock", "--all"]).contains("locking every account"))
        XCTAssertTrue(try ctl(["unlock", "--all"]).contains("alice@contoso.com"), "alice needs her passphrase")
        try ctl(["lock"], exit: 64)

        // Bindings and identities.
        let sleeper = try spawnSleeper()
        children.append(sleeper)
        XCTAssertTrue(try ctl(["bind", "\(sleeper)", "bob@fabrikam.com"]).contains("acts as bob@fabrikam.com"))
        XCTAssertTrue(try ctl(["identity", "\(sleeper)"]).contains("bob@fabrikam.com"))
        XCTAssertEqual(field(json(try ctl(["identity", "\(sleeper)", "--json"])), "identity"), "bob@fabrikam.com")
        XCTAssertTrue(try ctl(["unbind", "\(sleeper)"]).contains("unbound"))
        XCTAssertTrue(try ctl(["identity", "\(sleeper)"]).contains("no identity"))

        // run: the command and what it spawns write as the identity.
        XCTAssertTrue(try ctl(["unlock", "alice@contoso.com", "--passphrase-file", passphrase]).contains("unlocked"))
        try ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", "echo from run > '\(daemon.mnt("ran.txt"))'"])
        XCTAssertEqual(xattr(daemon.mnt("ran.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(Array(try readFile(daemon.back("ran.txt")).prefix(8)), FileHeader.magic)
        try ctl(["run", "--identity", "alice@contoso.com", "--", "/nonexistent/program"], exit: 127)

        XCTAssertTrue(try ctl(["deregister", "bob@fabrikam.com"]).contains("deregistered bob@fabrikam.com"))
        let gone = try daemon.ctl(["accounts", "bob@fabrikam.com"])
        XCTAssertEqual(gone.status, 1)
        XCTAssertTrue(gone.error.contains("300 UnknownAccount"), gone.error)
    }

    func testFileAndDataCommands() throws {
        try ctl(["enroll", "alice-oid", "alice@contoso.com", "--level", "untilFirstAuth", "--share"])
        try FileManager.default.createDirectory(atPath: daemon.mnt("project/src"), withIntermediateDirectories: true)
        for name in ["a", "src/b", "src/c"] { try writeFile(daemon.mnt("project/" + name), bytes("content of \(name)")) }

        // protect (recursive), info, is-encrypted.
        let protected = try ctl(["protect", daemon.mnt("project"), "alice@contoso.com"])
        XCTAssertTrue(protected.contains("owner: alice@contoso.com (managed)"), protected)
        XCTAssertTrue(try ctl(["info", daemon.mnt("project/src/b")]).contains("encrypted: yes, class untilFirstAuth"))
        XCTAssertEqual(field(json(try ctl(["info", daemon.mnt("project/src/b"), "--json"])), "size"), "16")
        try ctl(["is-encrypted", daemon.mnt("project/src/c")])
        XCTAssertEqual(Array(try readFile(daemon.back("project/src/c")).prefix(8)), FileHeader.magic)

        // encrypt-file / decrypt-file outside the mount, relative paths from the working directory.
        let export = work + "/export.txt"
        try writeFile(export, bytes("quarterly numbers"))
        try ctl(["is-encrypted", export], exit: 2)
        XCTAssertTrue(try ctl(["encrypt-file", export, "alice@contoso.com"]).contains("encrypted: yes"))
        try ctl(["is-encrypted", export])
        XCTAssertEqual(field(json(try ctl(["is-encrypted", export, "--json"])), "encrypted"), "1")
        XCTAssertTrue(try ctl(["decrypt-file", export, work + "/copy.txt"]).contains("decrypted to"))
        XCTAssertEqual(try readFile(work + "/copy.txt"), bytes("quarterly numbers"))
        let notEncrypted = try daemon.ctl(["decrypt-file", work + "/copy.txt", "--in-place"])
        XCTAssertEqual(notEncrypted.status, 1)
        XCTAssertTrue(notEncrypted.error.contains("104 FileNotEncrypted"), notEncrypted.error)
        try ctl(["decrypt-file", export, "--in-place"])
        XCTAssertEqual(try readFile(export), bytes("quarterly numbers"))
        try ctl(["decrypt-file", export], exit: 64)

        // can-receive: 0 yes, 2 no.
        try ctl(["can-receive", daemon.mnt("project/a"), "bob@fabrikam.com"])
        try ctl(["policy", "alice@contoso.com", "--share", "false"])
        XCTAssertTrue(try ctl(["can-receive", daemon.mnt("project/a"), "bob@fabrikam.com"], exit: 2).hasPrefix("no:"))

        // protect-data / unprotect-data / data-info through files and pipes.
        let sealed = work + "/sealed.bin"
        try ctl(["protect-data", "alice@contoso.com", "--string", "meet at noon", "--out", sealed])
        XCTAssertEqual(Array(try readFile(sealed).prefix(8)), FileHeader.magic)
        XCTAssertTrue(try ctl(["data-info", "--in", sealed]).contains("encrypted: yes, class untilFirstAuth"))
        XCTAssertEqual(try ctl(["unprotect-data", "--in", sealed]), "meet at noon")
        let base64 = try ctl(["protect-data", "someone@gmail.com", "--base64"], input: "tagged bytes")
        XCTAssertEqual(try ctl(["unprotect-data", "--base64"], input: base64), "tagged bytes")
        XCTAssertEqual(try ctl(["unprotect-data"], input: "never protected"), "never protected")
        XCTAssertEqual(field(json(try ctl(["data-info", "--json"], input: "never protected")), "isProtected"), "0")

        // A policy change re-protects existing files; --wait follows it to the end.
        let reprotected = try ctl(["policy", "alice@contoso.com", "--encryption", "false", "--wait"])
        XCTAssertTrue(reprotected.contains("re-protected alice@contoso.com's files"), reprotected)
        XCTAssertEqual(try readFile(daemon.back("project/src/c")), bytes("content of src/c"), "stored plain now")
        XCTAssertTrue(try ctl(["policy", "alice@contoso.com", "--encryption", "false", "--wait"]).contains("have not changed"))
        try ctl(["policy", "alice@contoso.com", "--encryption", "true", "--wait"])
        XCTAssertEqual(Array(try readFile(daemon.back("project/src/c")).prefix(8)), FileHeader.magic, "encrypted again")

        // On a terminal (script(1) gives it one) a recursive protect draws a progress bar.
        let terminal = try runCommand(["script", "-qec", "\(MountedDaemon.tool("custodyctl")) protect --socket \(daemon.socket) \(daemon.mnt("project")) alice@contoso.com", "/dev/null"])
        XCTAssertEqual(terminal.status, 0, terminal.output)
        XCTAssertTrue(terminal.output.contains("\r\u{1B}[K[") && terminal.output.contains("100% 5/5 files and directories"), terminal.output)

        // protect --remove makes the tree plain (alice shares again).
        try ctl(["policy", "alice@contoso.com", "--share", "true"])
        XCTAssertTrue(try ctl(["protect", daemon.mnt("project"), "--remove"]).contains("owner: none"))
        XCTAssertEqual(try readFile(daemon.back("project/src/b")), bytes("content of src/b"))
    }

    func testWipeJobsAndEvents() throws {
        try ctl(["enroll", "alice-oid", "alice@contoso.com", "--level", "untilFirstAuth"])
        try ctl(["enroll", "carol-oid", "carol@contoso.com", "--level", "untilFirstAuth"])
        try FileManager.default.createDirectory(atPath: daemon.mnt("w"), withIntermediateDirectories: true)
        try ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", "for i in $(seq 30); do echo $i > '\(daemon.mnt("w"))'/a$i; done"])
        try ctl(["run", "--identity", "carol@contoso.com", "--", "sh", "-c", "echo keep > '\(daemon.mnt("w/carol.txt"))'"])

        // An export of alice's, then the wipe (waiting, text).
        let export = work + "/alice-export.txt"
        try writeFile(export, bytes("alice exported this"))
        try ctl(["encrypt-file", export, "alice@contoso.com"])
        let wiped = try ctl(["wipe", "alice@contoso.com"])
        XCTAssertTrue(wiped.contains("wiped alice@contoso.com: 104 UnenrollmentSuccess"), wiped)
        XCTAssertTrue(wiped.contains("deleted 30"), wiped)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("w")), ["carol.txt"])
        // The exported copy can no longer be decrypted.
        let export2 = try daemon.ctl(["decrypt-file", export, work + "/never.txt"])
        XCTAssertEqual(export2.status, 1)
        XCTAssertTrue(export2.error.contains("103 FailedToDecryptFile"), export2.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: work + "/never.txt"))

        // --no-wait returns a job; jobs --wait follows it.
        let started = try ctl(["wipe", "carol@contoso.com", "--no-wait"])
        XCTAssertTrue(started.contains("job "), started)
        let words = started.split(separator: " ").map(String.init)
        let id = words.firstIndex(of: "job").map { words[$0 + 1] } ?? ""
        let job = json(try ctl(["jobs", id, "--wait", "--json"]))
        XCTAssertEqual(field(job, "state"), "succeeded", "\(job)")
        XCTAssertEqual(field(job, "result.code"), "104")
        XCTAssertTrue(try ctl(["jobs"]).contains("wipe carol@contoso.com succeeded"))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("w")), [], "carol's file went too; the directory (no owner) stays")

        // Events: kept ones, text and JSON, and a follower that sees a new one.
        let events = try ctl(["events", "--no-follow"])
        XCTAssertTrue(events.contains("wipeStarted [102] alice@contoso.com"), events)
        XCTAssertTrue(events.contains("deregistered [104] carol@contoso.com"), events)
        let lines = try ctl(["events", "--no-follow", "--json", "--count", "2"]).split(separator: "\n")
        XCTAssertEqual(lines.count, 2)
        XCTAssertEqual(field(json(String(lines[0])), "sequence"), "1")
        let followLog = work + "/follow.log"
        let follower = try spawn(MountedDaemon.tool("custodyctl"), ["events", "--socket", daemon.socket, "--new", "--count", "1"], stdoutPath: followLog)
        children.append(follower)
        try ctl(["enroll", "dave-oid", "dave@contoso.com"])
        // The follower may connect after any one event: keep making them until it has seen one.
        var tries = 0
        while !waitForExit(follower, seconds: 0.5), tries < 20 {
            try ctl(["lock", "dave@contoso.com"])
            tries += 1
        }
        XCTAssertLessThan(tries, 20, "the follower stopped after one event")
        let followed = (try? String(contentsOfFile: followLog, encoding: .utf8)) ?? ""
        XCTAssertEqual(followed.split(separator: "\n").count, 1, followed)
        XCTAssertTrue(followed.contains("dave@contoso.com"), followed)

        // Completion scripts.
        let completion = try runCommand([MountedDaemon.tool("custodyctl"), "--generate-completion-script", "bash"])
        XCTAssertTrue(completion.output.contains("encrypt-file") && completion.output.contains("unprotect-data"))
    }

    func testExitCodesForAnUnreachableDaemonAndANonAdmin() throws {
        let missing = try runCommand([MountedDaemon.tool("custodyctl"), "status", "--socket", work + "/no.sock"])
        XCTAssertEqual(missing.status, 69)
        XCTAssertTrue(missing.error.contains("cannot reach custodyd"), missing.error)
        let fromEnvironment = try runCommand([MountedDaemon.tool("custodyctl"), "status"], environment: ["CUSTODY_SOCKET": daemon.socket])
        XCTAssertEqual(fromEnvironment.status, 0, fromEnvironment.error)

        let user = try testUser()
        try daemon.openToOtherUsers()
        let denied = try daemon.ctl(["enroll", "x-oid", "x@y.z"], asUser: user)
        XCTAssertEqual(denied.status, 77)
        XCTAssertTrue(denied.error.contains("401 NotAuthorized"), denied.error)
        XCTAssertEqual(try daemon.ctl(["status"], asUser: user).status, 0)
        XCTAssertEqual(try daemon.ctl(["diagnose", "--out", "-"], asUser: user).status, 77, "the support bundle is for administrators")
        let bundle = work + "/bundle.json"
        XCTAssertTrue(try ctl(["diagnose", "--out", bundle]).contains("wrote \(bundle)"))
        let parsed = (try? JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: bundle)))) as? [String: Any] ?? [:]
        XCTAssertEqual(Set(parsed.keys), ["version", "identitiesScrubbed", "generatedAt", "daemon", "system", "configuration", "status", "jobs", "events", "client"])
    }
}
