import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Selective wipe over the control socket, through a real mount.
final class WipeTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testWipeDeletesExactlyTheIdentitysFilesAndKeysGoFirst() throws {
        // Root (the test) reads Alice's files, exempt from the transfer rules.
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--allow-other", "--default-identity", "65534=bob@personal.example",
                                                    "--transfer-exempt-uid", "0"]) { state in
            let engine = try Engine(stateDirectory: state, settings: { var s = Settings(); s.multiIdentity = true; return s }())
            try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
            try engine.register(id: "bob-oid", upn: "bob@personal.example")
        }
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        // Alice's tree (protected by setting the owner on the directory), with others' files inside.
        for directory in ["work", "work/deep", "work/only-alice"] {
            XCTAssertEqual(mkdir(daemon.mnt(directory), 0o777), 0)
            XCTAssertEqual(chmod(daemon.mnt(directory), 0o777), 0)
        }
        for (index, name) in ["work/a1.txt", "work/deep/a2.txt", "work/only-alice/a3.txt", "work/deep/a4.bin"].enumerated() {
            try writeFile(daemon.mnt(name), bytes("alice file \(index)\n"))
        }
        try mustRun(["setfattr", "-n", "user.custody.owner", "-v", "alice@contoso.com", daemon.mnt("work")])
        // Others: Bob (unmanaged) inside and outside Alice's directories, root (no identity) outside.
        // (Root's files inside them would inherit Alice as owner: the directory rule.)
        try writeFile(daemon.mnt("top.txt"), bytes("top\n"))
        let bob = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                  "echo bob > '\(daemon.mnt("work/bob.txt"))' && echo bob2 > '\(daemon.mnt("bob-top.txt"))' && echo deep > '\(daemon.mnt("work/deep/bob-deep.txt"))'"])
        XCTAssertEqual(bob.status, 0, bob.error)
        // An exported copy, and an open handle with cached pages.
        try mustRun(["cp", daemon.back("work/a1.txt"), daemon.root + "/exported.custody"])
        let open = try Syscall.open(daemon.mnt("work/deep/a2.txt"), O_RDONLY)
        var buffer = [UInt8](repeating: 0, count: 32)
        XCTAssertGreaterThan(try Syscall.pread(open, &buffer, 32, 0), 0)

        let response = try daemon.api("POST", "/v1/accounts/alice@contoso.com/wipe")
        XCTAssertEqual(response.status, 200, response.body)
        XCTAssertTrue(response.body.contains(#""deleted":4"#), response.body)
        XCTAssertTrue(response.body.contains(#""code":104"#), response.body)

        // Exactly Alice's files are gone; directories holding others' files stay, under names nobody
        // can read any more (hers since the directory was given to her).
        let remaining = try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && find . | sort"]).split(separator: "\n").map(String.init)
        let hidden = remaining.map { $0.split(separator: "/", omittingEmptySubsequences: false).map { $0.hasPrefix("~c3") ? "KEPT" : String($0) }.joined(separator: "/") }
        XCTAssertEqual(hidden.sorted(), [".", "./bob-top.txt", "./top.txt", "./KEPT", "./KEPT/bob.txt", "./KEPT/KEPT", "./KEPT/KEPT/bob-deep.txt"].sorted(), "\(remaining)")
        let deep = try XCTUnwrap(remaining.first { $0.hasSuffix("/bob-deep.txt") })
        let bobs = try XCTUnwrap(remaining.first { $0.hasSuffix("/bob.txt") })
        XCTAssertEqual(try readFile(daemon.mnt(String(deep.dropFirst(2)))), bytes("deep\n"))
        XCTAssertEqual(try readFile(daemon.mnt(String(bobs.dropFirst(2)))), bytes("bob\n"))
        XCTAssertEqual(try mustRun(["find", daemon.backing, "-type", "f"]).split(separator: "\n").count, 4, "the backing store agrees")
        // The handle opened before the wipe fails; nothing is served from the cache.
        XCTAssertEqual(errnoOf { _ = try Syscall.pread(open, &buffer, 32, 0) }, EACCES)
        close(open)
        // The account is gone, and so are its keys.
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice@contoso.com").status, 404)
        XCTAssertEqual(try runCommand(["sh", "-c", "ls '\(daemon.state)/keybags' | wc -l"]).output.trimmingCharacters(in: .whitespacesAndNewlines), "0")
        let events = daemon.log
        XCTAssertFalse(events.contains("alice file"), "no plaintext in the log")

        // The exported copy stays unreadable, even if the same account enrolls again.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        daemon.stop()
        let engine = try Engine(stateDirectory: daemon.state)
        let exported = Array(try Data(contentsOf: URL(fileURLWithPath: daemon.root + "/exported.custody")))
        XCTAssertThrowsError(try ProtectedData.unprotect(exported) { (header) throws(FormatError) -> ClassKey in
            do throws(EngineError) { return try engine.classKey(for: "alice@contoso.com", header.protectionClass, purpose: .open) } catch { throw FormatError.unsupported("\(error)") }
        }) { error in
            XCTAssertEqual(error as? FormatError, .wrongKey(keyID: (try? exported.withUnsafeBytes { try FileHeader.decode($0) })?.classKeyID ?? []))
        }
    }

    func testDeregisterWithoutWipeKeepsFilesAndReEnrollmentRestoresAccess() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        try writeFile(daemon.mnt("kept.txt"), bytes("kept sealed\n"))
        XCTAssertEqual(try daemon.api("DELETE", "/v1/accounts/alice@contoso.com").status, 204)
        // The file stays, encrypted, under a name nobody can read meanwhile (the name key went with
        // the others): the mount lists it as stored, and refuses its content.
        let stored = try FileManager.default.contentsOfDirectory(atPath: daemon.backing)
        XCTAssertEqual(stored.count, 1)
        XCTAssertTrue(stored.allSatisfy { $0.hasPrefix("~c3") }, "\(stored)")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint), stored)
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(self.daemon.mnt("kept.txt")) }, ENOENT)
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt(stored[0])) }, EACCES, "nobody can read it meanwhile")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        // Its name shows again in listings at once; a lookup that found nothing is believed for
        // up to the negative timeout (1 s).
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint), ["kept.txt"])
        usleep(1_100_000)
        XCTAssertEqual(try readFile(daemon.mnt("kept.txt")), bytes("kept sealed\n"), "re-enrolling restores access")
    }

    /// SIGKILL right after the wipe is journaled (before keys and files are gone); the restarted
    /// daemon finishes it before serving, with the exact result.
    func testAWipeKilledMidwayFinishesWhenTheDaemonRestarts() throws {
        let arguments = ["--multi-identity", "--allow-other", "--default-identity", "0=alice@contoso.com", "--default-identity", "65534=bob@personal.example"]
        daemon = try MountedDaemon(extraArguments: arguments)
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@personal.example", "enroll": false}"#).status, 201)
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && for d in 1 2 3 4 5 6 7 8; do mkdir -m 777 d$d; for i in $(seq 150); do echo alice $d $i > d$d/a$i; done; done"])
        let bob = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                  "cd '\(daemon.mountPoint)' && for d in 1 2 3 4 5 6 7 8; do for i in $(seq 10); do echo bob $d $i > d$d/b$i; done; done"])
        XCTAssertEqual(bob.status, 0, bob.error)
        XCTAssertEqual(try mustRun(["find", daemon.backing, "-type", "f"]).split(separator: "\n").count, 1280)

        let journal = daemon.state + "/wipes"
        let curl = try spawn("curl", ["-s", "--unix-socket", daemon.socket, "-X", "POST", "http://localhost/v1/accounts/alice@contoso.com/wipe"])
        var sawJournal = false
        for _ in 0..<20_000 {
            if let entries = try? FileManager.default.contentsOfDirectory(atPath: journal), entries.contains(where: { $0.hasSuffix(".json") }) {
                sawJournal = true
                break
            }
            usleep(100)
        }
        daemon.killHard()
        waitForExit(curl, seconds: 10)
        XCTAssertTrue(sawJournal, "the wipe was journaled before the daemon died")
        let left = try mustRun(["find", daemon.backing, "-type", "f"]).split(separator: "\n").count
        print("files left when the daemon was killed: \(left)")

        try daemon.start(extraArguments: arguments)
        let files = try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && find . -type f | sort"]).split(separator: "\n").map(String.init)
        XCTAssertEqual(files.count, 80, "only Bob's 80 files remain")
        XCTAssertTrue(files.allSatisfy { $0.split(separator: "/").last?.hasPrefix("b") == true }, "\(files.prefix(5))")
        // Alice's directories stay (they hold Bob's files) under names nobody can read any more.
        let directories = Set(files.compactMap { $0.split(separator: "/").dropLast().last.map(String.init) })
        XCTAssertEqual(directories.count, 8)
        XCTAssertTrue(directories.allSatisfy { $0.hasPrefix("~c3") }, "\(directories)")
        let bobs = try directories.map { (directory) throws -> [UInt8] in try readFile(daemon.mnt(directory + "/b7")) }
        XCTAssertEqual(Set(bobs), Set((1...8).map { bytes("bob \($0) 7\n") }))
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice@contoso.com").status, 404)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: journal).filter { $0.hasSuffix(".json") }, [], "the journal is done")
        XCTAssertEqual(try runCommand(["sh", "-c", "ls '\(daemon.state)/keybags' | wc -l"]).output.trimmingCharacters(in: .whitespacesAndNewlines), "0")
    }
    /// Names are bytes: a wipe reaches the identity's files and directories whatever their names
    /// hold (bytes that are not UTF-8, a combining mark or an emoji modifier right after the
    /// slash), and leaves everyone else's alone.
    func testWipeReachesNamesThatAreNotText() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--allow-other", "--default-identity", "0=alice@contoso.com",
                                                    "--default-identity", "65534=bob@personal.example"])
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@personal.example", "enroll": false}"#).status, 201)
        let names = #"latin1=$(printf 'caf\351'); mark=$(printf '\314\201x'); tone=$(printf '\360\237\217\273y')"#
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && \(names) && mkdir -m 777 \"$latin1\" \"$mark\" && "
                     + "for d in \"$latin1\" \"$mark\" .; do for n in \"$latin1\" \"$mark\" \"$tone\" plain; do echo alice > \"$d/$n.txt\"; done; done && "
                     + "setfattr -n user.custody.owner -v alice@contoso.com \"$latin1\" \"$mark\""])
        let bob = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                  "cd '\(daemon.mountPoint)' && \(names) && echo bob > \"$latin1/bob-$latin1\" && echo bob > \"bob-$mark\""])
        XCTAssertEqual(bob.status, 0, bob.error)
        XCTAssertEqual(try mustRun(["find", daemon.backing, "-type", "f"]).split(separator: "\n").count, 14)

        let response = try daemon.api("POST", "/v1/accounts/alice@contoso.com/wipe")
        XCTAssertEqual(response.status, 200, response.body)
        XCTAssertTrue(response.body.contains(#""deleted":12"#), response.body)
        // Bob's two files stay, and Alice's directory that holds one of them (under a name nobody
        // can read any more); her other one goes.
        let left = try mustRun(["sh", "-c", "cd '\(daemon.backing)' && for p in * */*; do [ -e \"$p\" ] && printf '%s\\n' \"$p\"; done | sed 's/^~c3[^/]*/KEPT/' | od -An -c | tr -s ' '"])
        let expected = try mustRun(["sh", "-c", "\(names) && printf '%s\\n' \"bob-$mark\" \"KEPT\" \"KEPT/bob-$latin1\" | od -An -c | tr -s ' '"])
        XCTAssertEqual(left, expected)
    }
}
