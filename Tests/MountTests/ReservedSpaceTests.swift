import CustodySystem
import Foundation
import Glibc
import XCTest

/// A multi-user mount over a small ext4 that keeps a fifth of its blocks for root: a user of the
/// mount stops where the same user stops on the ext4 itself, and root can still write, although
/// the daemon writes everything as root.
final class ReservedSpaceTests: XCTestCase {
    var daemon: MountedDaemon?
    var backingMounted: String?
    let nobody: uid_t = 65534

    override func tearDown() {
        daemon?.stop()
        if let backingMounted { _ = try? runCommand(["umount", backingMounted]) }
        daemon?.destroy()
        daemon = nil
    }

    /// Mounts the daemon over a fresh 64 MiB ext4 made with `-m 20`.
    private func start(_ arguments: [String]) throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: ["--allow-other"] + arguments) { state in
            let root = URL(fileURLWithPath: state).deletingLastPathComponent().path
            let image = root + "/ext4.img", backing = root + "/backing"
            _ = try mustRun(["truncate", "-s", "64M", image])
            _ = try mustRun(["mkfs.ext4", "-q", "-m", "20", image])
            _ = try mustRun(["mount", "-o", "loop", image, backing])
            self.backingMounted = backing
            XCTAssertEqual(chmod(backing, 0o1777), 0)
        }
        self.daemon = daemon
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        return daemon
    }

    /// Free bytes on the backing file system: for root, and for everyone else.
    private func free(_ daemon: MountedDaemon) -> (root: Int, users: Int) {
        var info = statvfs()
        XCTAssertEqual(statvfs(daemon.backing, &info), 0)
        return (Int(info.f_bfree) * Int(info.f_frsize), Int(info.f_bavail) * Int(info.f_frsize))
    }

    private func fillAsNobody(_ path: String) throws -> CommandResult {
        try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                        "dd", "if=/dev/zero", "of=\(path)", "bs=1M", "count=100", "conv=fsync", "status=none"])
    }

    /// Fills the mount as nobody, then checks that root's reserve is still there and usable.
    private func checkTheReserveHolds(_ daemon: MountedDaemon, file: String) throws {
        let before = free(daemon)
        let reserved = before.root - before.users
        XCTAssertGreaterThan(reserved, 8 << 20, "mkfs kept a fifth of the blocks")
        let result = try fillAsNobody(daemon.mnt(file))
        XCTAssertNotEqual(result.status, 0, "nobody cannot write 100 MiB")
        XCTAssertTrue(result.error.contains("No space left"), result.error)
        let after = free(daemon)
        // Most of what users may use is filled (ext4 may refuse a little early while much of it
        // is still being written back, as it does for the same user directly).
        XCTAssertLessThan(after.users, before.users / 2, "nobody filled what users may use")
        XCTAssertGreaterThanOrEqual(after.root, reserved * 9 / 10, "and not root's reserve: \(after.root) of \(reserved) bytes left")
        // Root may still write into it, through the mount as on the ext4 itself.
        let rootWrite = try runCommand(["dd", "if=/dev/urandom", "of=\(daemon.mnt("root-file"))", "bs=1M", "count=4", "conv=fsync", "status=none"])
        XCTAssertEqual(rootWrite.status, 0, rootWrite.error)
        XCTAssertEqual(try readFile(daemon.mnt("root-file")).count, 4 << 20)
    }

    func testAUserOfThePlainMountStopsAtRootsReserve() throws {
        let daemon = try start([])
        try checkTheReserveHolds(daemon, file: "fill")
        XCTAssertEqual(try Syscall.lstat(daemon.back("fill")).st_uid, nobody)
        // What nobody may use on the ext4 itself, for comparison: as much as through the mount.
        XCTAssertEqual(try mustRun(["rm", daemon.mnt("fill"), daemon.mnt("root-file")]), "")
        _ = try mustRun(["sync"])
        let direct = try fillAsNobody(daemon.back("direct"))
        XCTAssertNotEqual(direct.status, 0)
        XCTAssertLessThan(free(daemon).users, 4 << 20)
    }

    func testAUserWritingEncryptedFilesStopsAtRootsReserve() throws {
        let daemon = try start(["--multi-identity", "--default-identity", "\(nobody)=nobody@contoso.com"])
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "nobody-oid", "upn": "nobody@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
        try checkTheReserveHolds(daemon, file: "fill")
        let stored = try Syscall.lstat(daemon.back("fill"))
        XCTAssertEqual(stored.st_uid, nobody)
        let encrypted = try runCommand(["getfattr", "--only-values", "-n", "user.custody.encrypted", daemon.mnt("fill")])
        XCTAssertEqual(encrypted.output, "1", encrypted.error)
    }
}
