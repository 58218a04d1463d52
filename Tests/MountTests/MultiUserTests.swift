import CustodySystem
import Foundation
import Glibc
import XCTest

/// A mount with --allow-other, used by an unprivileged user (nobody): new files belong to the
/// caller, and the kernel checks permissions from the modes.
final class MultiUserTests: XCTestCase {
    var daemon: MountedDaemon!
    let nobody: uid_t = 65534

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--allow-other"])
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    private func asNobody(_ script: String) throws -> CommandResult {
        try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", "sh", "-c", script])
    }

    func testFilesCreatedByAUserBelongToThatUser() throws {
        let result = try asNobody("mkdir '\(daemon.mnt("d"))' && echo hi > '\(daemon.mnt("d/f"))' && ln -s f '\(daemon.mnt("d/l"))' && mkfifo '\(daemon.mnt("d/p"))'")
        XCTAssertEqual(result.status, 0, result.error)
        for name in ["d", "d/f", "d/l", "d/p"] {
            let st = try Syscall.lstat(daemon.back(name))
            XCTAssertEqual(st.st_uid, nobody, "\(name) is owned by its creator on the backing store")
            XCTAssertEqual(st.st_gid, nobody, name)
        }
        XCTAssertEqual(try readFile(daemon.back("d/f")), bytes("hi\n"))
    }

    func testPermissionsAreEnforcedForOtherUsers() throws {
        try writeFile(daemon.mnt("roots"), bytes("root only"), mode: 0o600)
        var result = try asNobody("cat '\(daemon.mnt("roots"))'")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("Permission denied"), result.error)
        result = try asNobody("echo x >> '\(daemon.mnt("roots"))'")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertEqual(try readFile(daemon.back("roots")), bytes("root only"))
        XCTAssertEqual(chmod(daemon.mnt("roots"), 0o644), 0)
        result = try asNobody("cat '\(daemon.mnt("roots"))'")
        XCTAssertEqual(result.output, "root only")
    }
}
