import CustodyCore
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Lock enforcement through a real mount, driven over the control socket.
final class LockMountTests: XCTestCase {
    var daemon: MountedDaemon!
    var shells: [pid_t] = []

    override func tearDown() {
        for shell in shells { kill(shell, SIGKILL); waitForExit(shell, seconds: 5) }
        daemon?.destroy()
        daemon = nil
    }

    func start(grace: Double) throws {
        // The test reads the bound shells' files back as root, exempt from the transfer rules
        // (IdentityBoundaryTests covers them).
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "\(grace)", "--transfer-exempt-uid", "0"])
    }

    func enroll(_ id: String, _ upn: String, level: String, passphrase: String) throws {
        let response = try daemon.api("POST", "/v1/accounts", #"{"id": "\#(id)", "upn": "\#(upn)", "policy": {"protectionLevel": "\#(level)"}, "passphrase": "\#(passphrase)"}"#)
        XCTAssertEqual(response.status, 201, response.body)
    }

    /// Runs `script` in a shell bound to `identity`; stages are separated by waiting for the files
    /// `<root>/go1`, `<root>/go2` …, and the shell writes `<root>/ready1` … when it reaches them.
    func boundShell(_ identity: String, _ script: String) throws -> (pid_t, String) {
        try boundShell(identity) { _ in script }
    }

    func boundShell(_ identity: String, _ makeScript: (String) -> String) throws -> (pid_t, String) {
        let root = try makeTemporaryDirectory("custody-shell")
        let wrapped = "cd '\(daemon.mountPoint)' && { \(makeScript(root)) ; } > '\(root)/out' 2>&1; echo $? > '\(root)/status'"
        let shell = try spawn("/bin/sh", ["-c", "while [ ! -e '\(root)/go0' ]; do sleep 0.02; done; " + wrapped])
        shells.append(shell)
        let bound = try daemon.api("POST", "/v1/bindings", #"{"pid": \#(shell), "identity": "\#(identity)"}"#)
        XCTAssertEqual(bound.status, 201, bound.body)
        XCTAssertTrue(FileManager.default.createFile(atPath: root + "/go0", contents: Data()))
        return (shell, root)
    }

    /// Waits until the status shows `identity` locked (the grace period is over).
    func waitUntilLocked(_ identity: String, seconds: Double = 10) throws {
        try eventually("\(identity) locked", timeout: seconds) {
            let account = try daemon.api("GET", "/v1/status").body
            return account.contains(#""lock":"locked""#) && account.contains(identity)
        }
    }

    /// The errno `body` ends with once it is `expected`, or the last one after a few seconds: the
    /// mount invalidates cached pages right after the lock completes, from a queue of its own.
    func errnoEventually(_ expected: Int32?, _ body: () -> Int32?) -> Int32? {
        var last = body()
        _ = try? eventually("errno \(expected.map(String.init) ?? "none")", timeout: 3) {
            last = body()
            return last == expected
        }
        return last
    }

    func testClassAHandlesFailAfterTheGracePeriodAndNoPlaintextStaysCached() throws {
        try start(grace: 1)
        try enroll("alice-oid", "alice@contoso.com", level: "complete", passphrase: "pw")
        let (shell, root) = try boundShell("alice@contoso.com", "echo SECRET-A-4411 > secret.txt && head -c 200000 /dev/urandom > big.bin")
        XCTAssertTrue(waitForExit(shell, seconds: 30))
        XCTAssertEqual(try String(contentsOfFile: root + "/status", encoding: .utf8), "0\n", (try? String(contentsOfFile: root + "/out", encoding: .utf8)) ?? "")

        // A reader holds the file open and has its pages cached.
        let fd = try Syscall.open(daemon.mnt("secret.txt"), O_RDONLY)
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        XCTAssertEqual(try Syscall.pread(fd, &buffer, 64, 0), 14)
        let big = try Syscall.open(daemon.mnt("big.bin"), O_RDWR)
        defer { close(big) }
        XCTAssertEqual(try Syscall.pread(big, &buffer, 64, 100_000), 64)

        let lock = try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock")
        XCTAssertEqual(lock.status, 200, lock.body)
        XCTAssertTrue(lock.body.contains("locking"))
        XCTAssertEqual(try Syscall.pread(fd, &buffer, 64, 0), 14, "still readable during the grace period")

        try waitUntilLocked("alice@contoso.com")
        // The same handle, the same (previously cached) pages: refused, not served from the cache.
        XCTAssertEqual(errnoEventually(EACCES) { errnoOf { _ = try Syscall.pread(fd, &buffer, 64, 0) } }, EACCES)
        XCTAssertEqual(errnoEventually(EACCES) { errnoOf { _ = try Syscall.pread(big, &buffer, 64, 100_000) } }, EACCES)
        XCTAssertEqual(errnoOf { _ = try Syscall.open(self.daemon.mnt("secret.txt"), O_RDONLY) }, EACCES, "new opens are refused")
        XCTAssertEqual(errnoOf { try writeFile(self.daemon.mnt("new.txt"), bytes("x")) }, nil, "a caller with no identity still creates plain files")
        XCTAssertEqual(try Syscall.lstat(daemon.mnt("secret.txt")).st_size, 14, "metadata stays visible")
        XCTAssertTrue(daemon.log.contains("locked"), daemon.log)

        // Unlock: readable again, content intact.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "wrong"}"#).status, 403)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "pw"}"#).status, 200)
        XCTAssertEqual(try readFile(daemon.mnt("secret.txt")), bytes("SECRET-A-4411\n"))
        XCTAssertEqual(try Syscall.pread(fd, &buffer, 64, 0), 14, "the handle opened before the lock works again")
        XCTAssertEqual(Array(buffer[0..<14]), bytes("SECRET-A-4411\n"))
    }

    func testClassBOpenFilesKeepWorkingAndNewFilesCanBeCreatedWhileLocked() throws {
        try start(grace: 0.5)
        try enroll("carol-oid", "carol@contoso.com", level: "completeUnlessOpen", passphrase: "pw")
        let (shell, root) = try boundShell("carol@contoso.com") { root in
            """
            echo existing > existing.txt && echo first > open.txt && exec 3>>open.txt && exec 4<open.txt && \
            touch '\(root)/ready1' && while [ ! -e '\(root)/go1' ]; do sleep 0.02; done && \
            echo second >&3 && cat <&4 && echo made-while-locked > created.txt && echo CREATED && \
            { cat existing.txt 2>/dev/null && echo READ-EXISTING || echo DENIED-EXISTING; } && \
            { cat created.txt 2>/dev/null && echo REOPENED-CREATED || echo DENIED-CREATED; }
            """
        }
        try eventually("the shell to open its files", timeout: 30) { access(root + "/ready1", F_OK) == 0 }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/carol@contoso.com/lock").status, 200)
        try waitUntilLocked("carol@contoso.com")
        // The shell still holds open.txt open: its handles work on, but no new one opens.
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt("open.txt")) }, EACCES, "a new handle while another is open")
        XCTAssertTrue(FileManager.default.createFile(atPath: root + "/go1", contents: Data()))
        XCTAssertTrue(waitForExit(shell, seconds: 30))
        let output = try String(contentsOfFile: root + "/out", encoding: .utf8)
        XCTAssertTrue(output.contains("first\nsecond"), "handles opened before the lock keep reading and writing: \(output)")
        XCTAssertTrue(output.contains("CREATED"), "new class B files can be created while locked: \(output)")
        XCTAssertTrue(output.contains("DENIED-EXISTING"), "existing files cannot be opened while locked: \(output)")
        XCTAssertTrue(output.contains("DENIED-CREATED"), "nor can a file created while locked, once closed: \(output)")

        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt("open.txt")) }, EACCES)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/carol@contoso.com/unlock", #"{"passphrase": "pw"}"#).status, 200)
        XCTAssertEqual(try readFile(daemon.mnt("created.txt")), bytes("made-while-locked\n"))
        XCTAssertEqual(try readFile(daemon.mnt("open.txt")), bytes("first\nsecond\n"))
        var value = [UInt8](repeating: 0, count: 64)
        let count = try Syscall.getxattr(daemon.mnt("created.txt"), "user.custody.class", &value, 64)
        XCTAssertEqual(String(decoding: value[0..<count], as: UTF8.self), "completeUnlessOpen")
        XCTAssertEqual(try runCommand(["grep", "-rl", "made-while-locked", daemon.backing]).output, "")
    }

    func testAuthorizationFromPeerCredentials() throws {
        try start(grace: 10)
        try enroll("alice-oid", "alice@contoso.com", level: "complete", passphrase: "pw")
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.socket, 0o666), 0)
        let nobody: UInt32 = 65534
        var response = try daemon.api("POST", "/v1/accounts", #"{"id": "x", "upn": "x@y"}"#, asUser: nobody)
        XCTAssertEqual(response.status, 403, response.body)
        XCTAssertTrue(response.body.contains("NotAuthorized"), response.body)
        response = try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock", asUser: nobody)
        XCTAssertEqual(response.status, 403, "alice is not mapped to uid 65534")
        XCTAssertEqual(try daemon.api("POST", "/v1/lock", asUser: nobody).status, 403)
        XCTAssertEqual(try daemon.api("GET", "/v1/status", asUser: nobody).status, 200, "status is public")
        // An account mapped to uid 65534 may be locked by that user.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "n-oid", "upn": "n@contoso.com", "uid": 65534}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/n@contoso.com/lock", asUser: nobody).status, 200)
        // Bad requests get JSON errors and the daemon keeps serving.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", "{broken").status, 400)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": 5}"#).status, 400)
        XCTAssertEqual(try daemon.api("GET", "/v1/nowhere").status, 404)
        XCTAssertEqual(try daemon.api("DELETE", "/v1/status").status, 405)
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/nobody@nowhere").status, 404)
        let huge = daemon.root + "/huge.json"
        XCTAssertTrue(FileManager.default.createFile(atPath: huge, contents: Data(#"{"id": ""#.utf8 + [UInt8](repeating: 120, count: 2 << 20) + Array(#""}"#.utf8))))
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", "@" + huge).status, 413)
        XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200)
    }

    /// A long-running sqlite3 (bound to the identity) fed statements through a FIFO while its
    /// identity locks: returns everything it printed, after a final integrity check by root.
    func sqliteAcrossALock(level: String) throws -> (output: String, integrity: String, count: String) {
        try start(grace: 0.5)
        try enroll("dana-oid", "dana@contoso.com", level: level, passphrase: "pw")
        let fifo = daemon.root + "/statements"
        XCTAssertEqual(mkfifo(fifo, 0o600), 0)
        let output = daemon.root + "/sqlite.out"
        let database = daemon.mnt("app.db")
        let shell = try spawn("/bin/sh", ["-c", "sqlite3 '\(database)' < '\(fifo)' > '\(output)' 2>&1"])
        shells.append(shell)
        XCTAssertEqual(try daemon.api("POST", "/v1/bindings", #"{"pid": \#(shell), "identity": "dana@contoso.com"}"#).status, 201)
        let writer = open(fifo, O_WRONLY)
        XCTAssertGreaterThanOrEqual(writer, 0)
        func send(_ text: String) { _ = Array(text.utf8).withUnsafeBytes { write(writer, $0.baseAddress, $0.count) } }
        send("create table t(v text); insert into t values('before');\n")
        usleep(500_000)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/dana@contoso.com/lock").status, 200)
        try waitUntilLocked("dana@contoso.com")
        usleep(100_000)
        send("insert into t values('while locked');\nselect 'count', count(*) from t;\n")
        usleep(500_000)
        XCTAssertTrue(daemon.isMounted, "the daemon is still serving")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/dana@contoso.com/unlock", #"{"passphrase": "pw"}"#).status, 200)
        send("select 'after', count(*) from t;\n")
        close(writer)
        XCTAssertTrue(waitForExit(shell, seconds: 30), "sqlite3 finished")
        shells.removeAll { $0 == shell }
        let printed = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        let integrity = try mustRun(["sqlite3", daemon.mnt("app.db"), "pragma integrity_check;"])
        let count = try mustRun(["sqlite3", daemon.mnt("app.db"), "select count(*) from t;"])
        XCTAssertEqual(try runCommand(["grep", "-rl", "while locked", daemon.backing]).output, "", "no plaintext on the backing store")
        return (printed, integrity, count)
    }

    func testSQLiteWithClassAGetsClearErrorsWhileLockedAndStaysIntact() throws {
        let result = try sqliteAcrossALock(level: "complete")
        XCTAssertTrue(result.output.lowercased().contains("error"), "the connection sees errors while locked: \(result.output)")
        XCTAssertEqual(result.integrity, "ok\n", "the database is intact after unlock")
        XCTAssertTrue(["1\n", "2\n"].contains(result.count), "\(result.count)")
        XCTAssertTrue(daemon.isMounted)
        XCTAssertTrue(result.output.contains("after|"), "after unlock the same connection carries on: \(result.output)")
    }

    func testSQLiteWithClassBKeepsWorkingWhileLocked() throws {
        let result = try sqliteAcrossALock(level: "completeUnlessOpen")
        XCTAssertTrue(result.output.contains("count|2"), "the open connection keeps working: \(result.output)")
        XCTAssertFalse(result.output.lowercased().contains("error"), result.output)
        XCTAssertEqual(result.integrity, "ok\n")
        XCTAssertEqual(result.count, "2\n")
    }

    /// Class C: once unlocked, a lock does not affect it.
    func testClassCIsUnaffectedByLockAfterTheFirstUnlock() throws {
        try start(grace: 0)
        try enroll("erin-oid", "erin@contoso.com", level: "untilFirstAuth", passphrase: "pw")
        let (shell, _) = try boundShell("erin@contoso.com", "echo steady > c.txt")
        XCTAssertTrue(waitForExit(shell, seconds: 30))
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/erin@contoso.com/lock").status, 200)
        try waitUntilLocked("erin@contoso.com")
        XCTAssertEqual(try readFile(daemon.mnt("c.txt")), bytes("steady\n"))
        try writeFile(daemon.mnt("c.txt"), bytes("still writable\n"), flags: O_WRONLY | O_APPEND)
        XCTAssertEqual(try readFile(daemon.mnt("c.txt")), bytes("steady\nstill writable\n"))
    }

    /// Writes through a class A handle after the grace period fail at once with EACCES, whether
    /// they need an existing page or are whole new pages the writeback cache could take, and
    /// nothing reaches the disk in clear. After unlock the same handle writes again.
    func testClassAWritesAfterTheGracePeriodFail() throws {
        try start(grace: 0.3)
        try enroll("alice-oid", "alice@contoso.com", level: "complete", passphrase: "pw")
        let (shell, _) = try boundShell("alice@contoso.com", "head -c 8192 /dev/zero | tr '\\0' x > w.txt")
        XCTAssertTrue(waitForExit(shell, seconds: 30))
        let fd = try Syscall.open(daemon.mnt("w.txt"), O_RDWR)
        defer { close(fd) }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)
        try waitUntilLocked("alice@contoso.com")
        XCTAssertEqual(errnoEventually(EACCES) { errnoOf { _ = try Syscall.pwrite(fd, "zzzzzzzz", 8, 100) } }, EACCES, "a write that needs the old page fails")
        let page = [UInt8](repeating: UInt8(ascii: "q"), count: 4096)
        for offset in [4096, 8192, 65536] {
            let written = page.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, off_t(offset)) }
            XCTAssertEqual(written, -1, "a whole-page write at \(offset) is refused, not cached")
            XCTAssertEqual(errno, EACCES)
        }
        var info = stat()
        XCTAssertEqual(stat(daemon.mnt("w.txt"), &info), 0, "stat by path still works while locked")
        XCTAssertEqual(info.st_size, 8192)
        let again = page.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, 4096) }
        XCTAssertEqual(again, -1, "a path stat does not let the next write into the cache")
        XCTAssertEqual(try runCommand(["grep", "-c", "zzzzzzzz", daemon.back("w.txt")]).output, "0\n")
        XCTAssertEqual(try runCommand(["grep", "-c", "qqqq", daemon.back("w.txt")]).output, "0\n", "nothing reaches the disk in clear")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "pw"}"#).status, 200)
        let after = page.withUnsafeBytes { pwrite(fd, $0.baseAddress, 4096, 4096) }
        XCTAssertEqual(after, 4096, "the handle writes again after unlock")
        XCTAssertEqual(fsync(fd), 0)
        var content = [UInt8](repeating: UInt8(ascii: "x"), count: 8192)
        content.replaceSubrange(4096..<8192, with: page)
        XCTAssertEqual(try readFile(daemon.mnt("w.txt")) == content, true)
    }
}
