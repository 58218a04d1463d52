import CustodyCore
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Re-protection of existing files when an identity's policy changes.
final class PolicyReprotectionTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func putPolicy(_ json: String) throws {
        let response = try daemon.api("PUT", "/v1/accounts/alice@contoso.com/policy", json)
        XCTAssertEqual(response.status, 200, response.body)
    }

    func testEncryptionOnLevelChangeAndOffWithAConcurrentWriter() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"fileEncryptionRequired": false}}"#).status, 201)
        let names = (0..<20).map { "doc\($0).txt" }
        for name in names { try writeFile(daemon.mnt(name), bytes("MARKER-POLICY \(name)\n")) }
        XCTAssertEqual(xattr(daemon.mnt("doc0.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(xattr(daemon.mnt("doc0.txt"), "user.custody.encrypted"), "0")
        // A writer keeps one file open across the policy change.
        let writer = try Syscall.open(daemon.mnt("doc7.txt"), O_WRONLY | O_APPEND)
        try Syscall.pwriteAll(writer, "before\n", 7, 0)

        try putPolicy(#"{"fileEncryptionRequired": true, "protectionLevel": "untilFirstAuth"}"#)
        let others = names.filter { $0 != "doc7.txt" }
        try eventually("the files not in use are encrypted", timeout: 30) { others.allSatisfy { xattr(daemon.mnt($0), "user.custody.encrypted") == "1" } }
        XCTAssertEqual(xattr(daemon.mnt("doc7.txt"), "user.custody.encrypted"), "0", "the open file waits")
        try Syscall.pwriteAll(writer, "after\n", 6, 0)
        close(writer)
        try eventually("the file in use is encrypted once closed", timeout: 30) { xattr(daemon.mnt("doc7.txt"), "user.custody.encrypted") == "1" }
        XCTAssertEqual(try readFile(daemon.mnt("doc7.txt")), bytes("MARKER-POLICY doc7.txt\nbefore\nafter\n"), "no write was lost")
        XCTAssertEqual(try runCommand(["grep", "-rl", "MARKER-POLICY", daemon.backing]).output, "")
        try eventually("the account is no longer marked", timeout: 30) { (try? self.daemon.api("GET", "/v1/accounts/alice@contoso.com").body.contains(#""reprotectPending":false"#)) == true }

        // Another level: the key is rewrapped, the content is not re-encrypted.
        let before = try readFile(daemon.back("doc3.txt"))
        try putPolicy(#"{"fileEncryptionRequired": true, "protectionLevel": "none"}"#)
        try eventually("the class changed", timeout: 30) { names.allSatisfy { xattr(daemon.mnt($0), "user.custody.class") == "none" } }
        let after = try readFile(daemon.back("doc3.txt"))
        XCTAssertTrue(Array(before[512...]) == Array(after[512...]), "the ciphertext after the header is unchanged")
        XCTAssertFalse(Array(before[0..<512]) == Array(after[0..<512]), "the header is new")
        XCTAssertEqual(try (after.withUnsafeBytes { try FileHeader.decode($0) }).protectionClass, ProtectionClass.none)
        XCTAssertEqual(try readFile(daemon.mnt("doc3.txt")), bytes("MARKER-POLICY doc3.txt\n"))

        // Encryption off: everything plain again, still Alice's.
        try putPolicy(#"{"fileEncryptionRequired": false}"#)
        try eventually("the files are plain", timeout: 30) { names.allSatisfy { xattr(daemon.mnt($0), "user.custody.encrypted") == "0" } }
        XCTAssertEqual(try readFile(daemon.back("doc7.txt")), bytes("MARKER-POLICY doc7.txt\nbefore\nafter\n"))
        XCTAssertEqual(xattr(daemon.mnt("doc7.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(try runCommand(["find", daemon.backing, "-name", ".custody-reprotect-*"]).output, "")
    }
    /// Names are bytes: files whose names (or whose directories' names) are not UTF-8, or hold a
    /// combining mark right after the slash, are encrypted when the policy asks, under their own
    /// names, with nothing left in clear and no stray copy.
    func testEncryptionReachesNamesThatAreNotText() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"fileEncryptionRequired": false}}"#).status, 201)
        let names = #"latin1=$(printf 'caf\351'); mark=$(printf '\314\201x')"#
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && \(names) && mkdir \"$latin1\" \"$mark\" && "
                     + "for d in \"$latin1\" \"$mark\" .; do for n in \"$latin1\" \"$mark\" plain; do echo MARKER-BYTES > \"$d/$n.txt\"; done; done"])
        let listing = try mustRun(["sh", "-c", "cd '\(daemon.backing)' && find . | sort | od -An -c"])
        XCTAssertEqual(try runCommand(["grep", "-rl", "MARKER-BYTES", daemon.backing]).output.split(separator: "\n").count, 9)

        try putPolicy(#"{"fileEncryptionRequired": true, "protectionLevel": "untilFirstAuth"}"#)
        try eventually("every file is encrypted", timeout: 30) { (try? runCommand(["grep", "-rl", "MARKER-BYTES", daemon.backing]).output) == "" }
        try eventually("the account is no longer marked", timeout: 30) { (try? self.daemon.api("GET", "/v1/accounts/alice@contoso.com").body.contains(#""reprotectPending":false"#)) == true }
        XCTAssertEqual(try mustRun(["sh", "-c", "cd '\(daemon.backing)' && find . | sort | od -An -c"]), listing, "the same names, nothing more")
        let contents = try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && \(names) && cat \"$latin1/$mark.txt\" \"$mark/$latin1.txt\" \"$latin1.txt\""])
        XCTAssertEqual(contents, "MARKER-BYTES\nMARKER-BYTES\nMARKER-BYTES\n")
    }

    /// A policy that needs keys the lock withholds (class A, made while locked): the files wait,
    /// the account stays marked, and the unlock brings them over.
    func testFilesThatNeedLockedKeysWaitForTheUnlock() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com", "--lock-grace-period", "0"])
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "passphrase": "her passphrase", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        let names = (0..<5).map { "doc\($0).txt" }
        for name in names { try writeFile(daemon.mnt(name), bytes("content of \(name)")) }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)

        try putPolicy(#"{"protectionLevel": "complete"}"#)
        try eventually("the pass ran and could not bring the files over", timeout: 30) {
            (try? self.daemon.api("GET", "/v1/events?follow=false").body.contains(#""failed":"5""#)) == true
        }
        XCTAssertTrue(try daemon.api("GET", "/v1/accounts/alice@contoso.com").body.contains(#""reprotectPending":true"#), "still marked")
        XCTAssertTrue(names.allSatisfy { xattr(daemon.mnt($0), "user.custody.class") == "untilFirstAuth" }, "nothing changed while locked")

        let unlocked = try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "her passphrase"}"#)
        XCTAssertEqual(unlocked.status, 200, unlocked.body)
        try eventually("the unlock brings them over", timeout: 30) { names.allSatisfy { xattr(self.daemon.mnt($0), "user.custody.class") == "complete" } }
        try eventually("the account is no longer marked", timeout: 30) { (try? self.daemon.api("GET", "/v1/accounts/alice@contoso.com").body.contains(#""reprotectPending":false"#)) == true }
        for name in names { XCTAssertEqual(try readFile(daemon.mnt(name)), bytes("content of \(name)")) }
    }
}
