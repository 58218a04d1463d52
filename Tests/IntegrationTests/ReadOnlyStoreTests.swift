import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// A backing store on a read-only file system (a mounted backup, a snapshot, install media), or
/// one remounted read-only while served (ext4's `errors=remount-ro`): files read, encrypted ones
/// too, and every change fails with EROFS.
final class ReadOnlyStoreTests: XCTestCase {
    var daemon: MountedDaemon?
    var backingMounted: String?

    override func tearDown() {
        daemon?.stop()
        if let backingMounted { _ = try? runCommand(["umount", backingMounted]) }
        backingMounted = nil
        daemon?.destroy()
        daemon = nil
    }

    static let alice = "alice@contoso.com"

    /// The daemon over a fresh ext4 on a loop device; alice enrolled; an encrypted and a plain file.
    func start() throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=\(Self.alice)"]) { state in
            let root = URL(fileURLWithPath: state).deletingLastPathComponent().path
            let image = root + "/ext4.img", backing = root + "/backing"
            try mustRun(["truncate", "-s", "64M", image])
            try mustRun(["mkfs.ext4", "-q", image])
            try mustRun(["mount", "-o", "loop", image, backing])
            self.backingMounted = backing
        }
        self.daemon = daemon
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        try writeFile(daemon.mnt("secret.txt"), bytes("alice's secret"))
        try writeFile(daemon.back("plain.txt"), bytes("plain"))
        XCTAssertEqual(xattr(daemon.mnt("secret.txt"), "user.custody.encrypted"), "1")
        return daemon
    }

    /// Remounts the backing store read-only (retrying while the daemon still closes handles).
    func remountReadOnly(_ daemon: MountedDaemon) throws {
        var result = try runCommand(["mount", "-o", "remount,ro", daemon.backing])
        _ = try? eventually("the store to remount read-only", interval: 0.1) {
            if result.status != 0 { result = try runCommand(["mount", "-o", "remount,ro", daemon.backing]) }
            return result.status == 0
        }
        XCTAssertEqual(result.status, 0, result.error)
    }

    func assertReadsAndRefusesChanges(_ daemon: MountedDaemon, _ when: String) {
        XCTAssertEqual(try readFile(daemon.mnt("secret.txt")), bytes("alice's secret"), "\(when): the encrypted file reads")
        XCTAssertEqual(try readFile(daemon.mnt("plain.txt")), bytes("plain"), "\(when): the plain file reads")
        XCTAssertEqual(xattr(daemon.mnt("secret.txt"), "user.custody.owner"), Self.alice, when)
        for (path, what) in [("secret.txt", "the encrypted file"), ("plain.txt", "the plain file"), ("new.txt", "a new file")] {
            XCTAssertThrowsError(try writeFile(daemon.mnt(path), bytes("x")), "\(when): writing \(what)") {
                XCTAssertEqual($0 as? Errno, .readOnlyFileSystem, "\(when): writing \(what)")
            }
        }
        XCTAssertThrowsError(try Syscall.open(daemon.mnt("secret.txt"), O_WRONLY | O_CLOEXEC), when) {
            XCTAssertEqual($0 as? Errno, .readOnlyFileSystem, when)
        }
        XCTAssertNotEqual(mkdir(daemon.mnt("dir"), 0o755), 0, when)
        XCTAssertEqual(errno, EROFS, when)
        XCTAssertNotEqual(unlink(daemon.mnt("plain.txt")), 0, when)
        XCTAssertEqual(errno, EROFS, when)
        XCTAssertEqual(try readFile(daemon.mnt("secret.txt")), bytes("alice's secret"), "\(when): nothing changed")
    }

    func testAReadOnlyStoreIsServedReadOnly() throws {
        let daemon = try start()
        daemon.stop()
        try remountReadOnly(daemon)
        try daemon.start(extraArguments: ["--default-identity", "0=\(Self.alice)"])
        var mounted = statvfs()
        XCTAssertEqual(statvfs(daemon.mountPoint, &mounted), 0)
        XCTAssertNotEqual(mounted.f_flag & UInt(ST_RDONLY), 0, "the mount itself is read-only")
        XCTAssertTrue(daemon.log.contains("is read-only"), daemon.log)
        assertReadsAndRefusesChanges(daemon, "started on a read-only store")
    }

    func testAStoreRemountedReadOnlyWhileServedStillReads() throws {
        let daemon = try start()
        // Nothing of the daemon holds a file open for writing once the handles are closed.
        try remountReadOnly(daemon)
        // The kernel's cached pages and attributes would answer without the daemon: drop them.
        _ = try runCommand(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"])
        assertReadsAndRefusesChanges(daemon, "remounted read-only")
    }
}
