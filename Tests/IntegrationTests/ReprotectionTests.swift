import CustodyCore
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Protecting, re-owning and unprotecting existing files and directories with the virtual
/// attribute `user.custody.owner` (setfattr / setfattr -x).
final class ReprotectionTests: XCTestCase {
    var daemon: MountedDaemon!
    static let marker = "MARKER-REPROTECT-90d1"

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "0"]) { state in
            let engine = try Engine(stateDirectory: state, settings: { var s = Settings(); s.multiIdentity = true; return s }())
            try engine.enroll(id: "alice-oid", upn: "alice@contoso.com",
                              policy: Policy(protectionLevel: .untilFirstAuthentication, canShareWithOtherIdentities: true))
            try engine.enroll(id: "frank-oid", upn: "frank@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
            try engine.register(id: "bob-oid", upn: "bob@personal.example")
        }
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func setOwner(_ path: String, _ owner: String) -> Int32? {
        errnoOf { try Syscall.setxattr(path, "user.custody.owner", owner, owner.utf8.count, 0) }
    }

    func storedInClear(_ marker: String) throws -> Bool {
        !(try runCommand(["grep", "-rl", marker, daemon.backing]).output.isEmpty)
    }

    func testProtectReownAndUnprotectAFile() throws {
        let path = daemon.mnt("plain.txt")
        let content = bytes(Self.marker + "\n" + String(repeating: "body ", count: 3000))
        try writeFile(path, content, mode: 0o640)
        try Syscall.setxattr(path, "user.note", "kept", 4, 0)
        var times = [timespec(tv_sec: 1_500_000_000, tv_nsec: 0), timespec(tv_sec: 1_600_000_000, tv_nsec: 0)]
        XCTAssertEqual(utimensat(AT_FDCWD, path, &times, 0), 0)
        XCTAssertTrue(try storedInClear(Self.marker))

        // Protect: the file becomes Alice's and is encrypted on disk; everything else stays.
        XCTAssertNil(setOwner(path, "Alice@Contoso.com"))
        XCTAssertEqual(xattr(path, "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(xattr(path, "user.custody.encrypted"), "1")
        XCTAssertEqual(xattr(path, "user.custody.class"), "untilFirstAuth")
        XCTAssertFalse(try storedInClear(Self.marker))
        XCTAssertEqual(Array(try readFile(daemon.back("plain.txt")).prefix(8)), FileHeader.magic)
        XCTAssertTrue(try readFile(path) == content, "same content through the mount")
        XCTAssertEqual(xattr(path, "user.note"), "kept")
        let attributes = try Syscall.lstat(path)
        XCTAssertEqual(attributes.st_mode & 0o777, 0o640)
        XCTAssertEqual(attributes.st_mtim.tv_sec, 1_600_000_000)
        XCTAssertEqual(attributes.st_size, content.count)

        // Re-own to an unmanaged identity: decrypted, the owner recorded.
        XCTAssertNil(setOwner(path, "bob@personal.example"))
        XCTAssertEqual(xattr(path, "user.custody.owner"), "bob@personal.example")
        XCTAssertEqual(xattr(path, "user.custody.encrypted"), "0")
        XCTAssertTrue(try storedInClear(Self.marker))
        XCTAssertTrue(try readFile(daemon.back("plain.txt")) == content, "stored plain again")

        // Unprotect: untracked again.
        XCTAssertEqual(errnoOf { try Syscall.removexattr(path, "user.custody.owner") }, nil)
        XCTAssertNil(xattr(path, "user.custody.owner"))
        XCTAssertNil(try OwnerRecord.load(from: daemon.back("plain.txt")))
        XCTAssertTrue(try readFile(path) == content, "same content after unprotect")
        XCTAssertEqual(try runCommand(["find", daemon.backing, "-name", ".custody-reprotect-*"]).output, "", "no staging files are left")
    }

    func testProtectADirectoryTreeAndInheritance() throws {
        XCTAssertEqual(mkdir(daemon.mnt("project"), 0o755), 0)
        XCTAssertEqual(mkdir(daemon.mnt("project/sub"), 0o755), 0)
        try writeFile(daemon.mnt("project/a.txt"), bytes(Self.marker + "-a"))
        try writeFile(daemon.mnt("project/sub/b.txt"), bytes(Self.marker + "-b"))
        _ = try readFile(daemon.mnt("project/a.txt"))
        try mustRun(["setfattr", "-n", "user.custody.owner", "-v", "alice@contoso.com", daemon.mnt("project")])
        XCTAssertEqual(xattr(daemon.mnt("project"), "user.custody.owner"), "alice@contoso.com")
        for file in ["project/a.txt", "project/sub/b.txt"] {
            XCTAssertEqual(xattr(daemon.mnt(file), "user.custody.encrypted"), "1", file)
        }
        XCTAssertFalse(try storedInClear(Self.marker))
        XCTAssertEqual(try readFile(daemon.mnt("project/sub/b.txt")), bytes(Self.marker + "-b"))
        // New files made there by a caller with no identity inherit the directory's owner.
        try writeFile(daemon.mnt("project/sub/new.txt"), bytes(Self.marker + "-new"))
        XCTAssertEqual(xattr(daemon.mnt("project/sub/new.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertFalse(try storedInClear(Self.marker))
        // And unprotecting the directory unprotects the tree.
        try mustRun(["setfattr", "-x", "user.custody.owner", daemon.mnt("project")])
        XCTAssertNil(xattr(daemon.mnt("project/sub/new.txt"), "user.custody.owner"))
        XCTAssertEqual(try readFile(daemon.back("project/sub/new.txt")), bytes(Self.marker + "-new"))
        try mustRun(["diff", "-r", daemon.backing + "/project", daemon.mnt("project")])
    }

    func testRefusalsBusyHardLinksLockedAndUnknownValues() throws {
        let path = daemon.mnt("f.txt")
        try writeFile(path, bytes("data"))
        let fd = try Syscall.open(path, O_RDONLY)
        XCTAssertEqual(setOwner(path, "alice@contoso.com"), EBUSY, "not while the file is open")
        close(fd)
        usleep(100_000)
        XCTAssertNil(setOwner(path, "alice@contoso.com"))

        try writeFile(daemon.mnt("linked.txt"), bytes("data"))
        XCTAssertEqual(link(daemon.mnt("linked.txt"), daemon.mnt("other-name.txt")), 0)
        XCTAssertEqual(setOwner(daemon.mnt("linked.txt"), "alice@contoso.com"), EMLINK, "hard links would split")

        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "carol-oid", "upn": "carol@contoso.com", "policy": {"protectionLevel": "complete"}, "passphrase": "pw"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/carol@contoso.com/lock").status, 200)
        try writeFile(daemon.mnt("c.txt"), bytes("data"))
        XCTAssertEqual(setOwner(daemon.mnt("c.txt"), "carol@contoso.com"), EACCES, "class A keys are locked away")
        XCTAssertNil(xattr(daemon.mnt("c.txt"), "user.custody.owner"), "nothing changed")
        XCTAssertEqual(try readFile(daemon.mnt("c.txt")), bytes("data"))

        // Frank's policy does not let other identities receive his files: no re-owning, no unprotecting.
        try writeFile(daemon.mnt("frank.txt"), bytes(Self.marker + "-frank"))
        XCTAssertNil(setOwner(daemon.mnt("frank.txt"), "frank@contoso.com"))
        XCTAssertEqual(setOwner(daemon.mnt("frank.txt"), "bob@personal.example"), EPERM)
        XCTAssertEqual(errnoOf { try Syscall.removexattr(self.daemon.mnt("frank.txt"), "user.custody.owner") }, EPERM)
        XCTAssertEqual(xattr(daemon.mnt("frank.txt"), "user.custody.owner"), "frank@contoso.com")
        XCTAssertFalse(try storedInClear(Self.marker + "-frank"))
        XCTAssertNil(setOwner(daemon.mnt("frank.txt"), "FRANK@contoso.com"), "the same owner in another spelling is fine")

        XCTAssertEqual(errnoOf { try Syscall.setxattr(path, "user.custody.class", "none", 4, 0) }, EOPNOTSUPP)
        XCTAssertEqual(errnoOf { try Syscall.setxattr(path, "user.custody.class", "untilFirstAuth", 14, 0) }, nil, "the current value is accepted")
    }
}
