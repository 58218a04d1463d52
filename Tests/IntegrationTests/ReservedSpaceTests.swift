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

    /// Writes 100 MiB as nobody: in 1 MiB writes, or in 4 KiB direct writes (the last few blocks:
    /// an encrypted file's 1 MiB write that does not fit is taken back whole).
    private func fillAsNobody(_ path: String, small: Bool = false) throws -> CommandResult {
        let size = small ? ["bs=4k", "count=25600", "oflag=direct"] : ["bs=1M", "count=100"]
        return try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                               "dd", "if=/dev/zero", "of=\(path)"] + size + ["conv=fsync", "status=none"])
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

    /// Makes `count` things of one `kind` as nobody in `directory` (each directory, symlink,
    /// attribute or encrypted file needs a block of its own; links and renames grow a directory),
    /// and returns how many were made and the errors of the others (errno: count).
    private func createAsNobody(_ kind: String, in directory: String, count: Int = 1000) throws -> (made: Int, errors: [String: Int]) {
        let script = #"""
        import errno, json, os, sys
        kind, directory, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
        made, errors = 0, {}
        for i in range(count):
            path = os.path.join(directory, f"{kind}-{i}")
            try:
                if kind == "directory":
                    os.mkdir(path)
                elif kind == "symlink":
                    os.symlink("t" * 200 + str(i), path)     # beyond the inode's 60 bytes: a block
                elif kind == "attribute":
                    # Distinct values: ext4 shares the block of an identical attribute set.
                    os.setxattr(os.path.join(directory, f"empty-{i}"), "user.note", (f"{directory}:{i}" * 600)[:600].encode())
                elif kind == "link":                            # a directory grows
                    os.link(os.path.join(directory, "empty-0"), path)
                elif kind == "rename":
                    os.rename(os.path.join(directory, f"empty-{i}"),
                              os.path.join(directory, "moved", f"renamed-with-a-name-long-enough-to-fill-blocks-{i:04}"))
                elif kind == "file":
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                made += 1
            except OSError as error:
                name = errno.errorcode.get(error.errno, str(error.errno))
                errors[name] = errors.get(name, 0) + 1
        print(json.dumps({"made": made, "errors": errors}))
        """#
        let result = try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                                     "/usr/bin/python3", "-c", script, kind, directory, String(count)])
        XCTAssertEqual(result.status, 0, result.error)
        let answer = try JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [String: Any]
        return (answer?["made"] as? Int ?? -1, answer?["errors"] as? [String: Int] ?? [:])
    }

    /// How many more blocks users may take, once what is written has settled (ext4 gives back
    /// what it held for delayed allocation), with a few to spare for directory growth.
    private func blocksLeftForUsers(_ daemon: MountedDaemon) throws -> Int {
        _ = try mustRun(["sync"])
        var info = statvfs()
        XCTAssertEqual(statvfs(daemon.backing, &info), 0)
        return Int(info.f_bavail) + 8
    }

    /// Fills what users may use, as nobody, through the mount: again while ext4 gives back blocks
    /// it had held for delayed allocation.
    private func exhaustUsersSpace(_ daemon: MountedDaemon) throws {
        for round in 0..<5 {
            XCTAssertNotEqual(try fillAsNobody(daemon.mnt("fill-\(round)"), small: round > 0).status, 0)
            if try blocksLeftForUsers(daemon) <= 16 { return }
        }
        XCTFail("users still have \(try blocksLeftForUsers(daemon)) blocks")
    }

    /// Makes a directory of nobody's at `path`, with `empties` empty files and a directory
    /// `moved` in it.
    private func nobodysDirectory(_ path: String, empties: Int = 0) throws {
        XCTAssertEqual(mkdir(path, 0o755), 0)
        XCTAssertEqual(mkdir(path + "/moved", 0o755), 0)
        for i in 0..<empties { try writeFile(path + "/empty-\(i)", []) }
        _ = try mustRun(["chown", "-R", "\(nobody):\(nobody)", path])
    }

    /// Once users' space is used up, nobody's directories, long symlinks, attribute blocks and
    /// directories grown by links and renames fail with ENOSPC through the mount, as on the ext4
    /// itself, and root keeps its reserve.
    func testCreationsByAUserStopAtRootsReserve() throws {
        let daemon = try start([])
        try nobodysDirectory(daemon.mnt("nobody"), empties: 1000)
        try nobodysDirectory(daemon.back("direct"), empties: 1000)
        let before = free(daemon)
        let reserved = before.root - before.users
        try exhaustUsersSpace(daemon)
        for kind in ["directory", "symlink", "attribute", "link", "rename"] {
            let growsADirectory = kind == "link" || kind == "rename"
            let room = try blocksLeftForUsers(daemon)
            let count = kind == "link" ? 5000 : 1000
            // On the ext4 first: it takes whatever blocks are still free, so that the mount has
            // no more room than the names that fit in its directory's last blocks.
            let direct = try createAsNobody(kind, in: daemon.back("direct"), count: count)
            XCTAssertEqual(direct.errors.keys.sorted(), ["ENOSPC"], "\(kind)")
            let mounted = try createAsNobody(kind, in: daemon.mnt("nobody"), count: count)
            XCTAssertEqual(mounted.errors.keys.sorted(), ["ENOSPC"], "\(kind)")
            // The two directories are alike, but for what earlier kinds left in their last
            // blocks: at most one block's worth of this kind's names (ext4's entry: 8 bytes and
            // the name, in steps of 4) more.
            let shortestName = kind == "rename" ? "renamed-with-a-name-long-enough-to-fill-blocks-0000" : "\(kind)-0"
            let namesPerBlock = 4096 / ((8 + shortestName.utf8.count + 3) & ~3)
            XCTAssertLessThanOrEqual(mounted.made, direct.made + namesPerBlock, "\(kind): nobody made \(mounted.made) through the mount, \(direct.made) on the ext4")
            if !growsADirectory {
                // A block for each directory, symlink and attribute.
                XCTAssertLessThanOrEqual(mounted.made, room, "\(kind): nobody made \(mounted.made) through the mount")
            }
        }
        let after = free(daemon)
        XCTAssertGreaterThanOrEqual(after.root, reserved * 9 / 10, "root's reserve: \(after.root) of \(reserved) bytes left")
        // Root still may: a directory and a long symlink through the mount.
        XCTAssertEqual(mkdir(daemon.mnt("roots"), 0o755), 0, String(cString: strerror(errno)))
        XCTAssertEqual(symlink(String(repeating: "r", count: 300), daemon.mnt("roots/link")), 0, String(cString: strerror(errno)))
        XCTAssertEqual(try Syscall.lstat(daemon.back("roots/link")).st_size, 300)
    }

    /// An encrypted file's header takes a block when the file is made: once users' space is used
    /// up, nobody's new encrypted files fail with ENOSPC and leave nothing behind.
    func testEncryptedFilesOfAUserStopAtRootsReserve() throws {
        let daemon = try start(["--multi-identity", "--default-identity", "\(nobody)=nobody@contoso.com"])
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "nobody-oid", "upn": "nobody@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
        try nobodysDirectory(daemon.mnt("nobody"))
        let before = free(daemon)
        let reserved = before.root - before.users
        try exhaustUsersSpace(daemon)
        let room = try blocksLeftForUsers(daemon)
        let made = try createAsNobody("file", in: daemon.mnt("nobody"))
        XCTAssertLessThanOrEqual(made.made, room, "nobody made \(made.made) encrypted files")
        XCTAssertEqual(made.errors.keys.sorted(), ["ENOSPC"])
        let left = try FileManager.default.contentsOfDirectory(atPath: daemon.back("nobody"))
        XCTAssertEqual(left.count, made.made + 1, "a file whose header could not be written is removed (\(left.sorted()))")
        let after = free(daemon)
        XCTAssertGreaterThanOrEqual(after.root, reserved * 9 / 10, "root's reserve: \(after.root) of \(reserved) bytes left")
        try writeFile(daemon.mnt("root-file"), Array("root's".utf8))
        XCTAssertEqual(try readFile(daemon.mnt("root-file")), Array("root's".utf8))
    }

    /// Protecting a file rewrites it into a new encrypted copy: a user's copy is made as the
    /// user, so once users' space is used up it fails with ENOSPC and the file stays as it was.
    func testAUserProtectingAFileStopsAtRootsReserve() throws {
        let daemon = try start(["--multi-identity"])
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
        try nobodysDirectory(daemon.mnt("nobody"))
        let content = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
        try writeFile(daemon.mnt("nobody/big"), content)
        _ = try mustRun(["chown", "\(nobody):\(nobody)", daemon.mnt("nobody/big")])
        // With room left, nobody's protection of a file of its own succeeds (made as nobody).
        try writeFile(daemon.mnt("nobody/small"), Array("small".utf8))
        _ = try mustRun(["chown", "\(nobody):\(nobody)", daemon.mnt("nobody/small")])
        let small = try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                                    "setfattr", "-n", "user.custody.owner", "-v", "alice@contoso.com", daemon.mnt("nobody/small")])
        XCTAssertEqual(small.status, 0, small.error)
        XCTAssertEqual(xattr(daemon.mnt("nobody/small"), "user.custody.encrypted"), "1")
        XCTAssertEqual(try Syscall.lstat(daemon.back("nobody/small")).st_uid, nobody)
        XCTAssertFalse(try readFile(daemon.back("nobody/small")).starts(with: Array("small".utf8)))
        let before = free(daemon)
        let reserved = before.root - before.users
        try exhaustUsersSpace(daemon)
        let protect = try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                                      "setfattr", "-n", "user.custody.owner", "-v", "alice@contoso.com", daemon.mnt("nobody/big")])
        XCTAssertNotEqual(protect.status, 0)
        XCTAssertTrue(protect.error.contains("No space left"), protect.error)
        XCTAssertGreaterThanOrEqual(free(daemon).root, reserved * 9 / 10, "root's reserve is left")
        XCTAssertNil(xattr(daemon.mnt("nobody/big"), "user.custody.owner"), "the file is not protected")
        XCTAssertTrue(try readFile(daemon.mnt("nobody/big")) == content, "and has its content")
        // (The protected file's name is stored encrypted, as a managed identity's.)
        let storedSmall = String(daemon.back("nobody/small").split(separator: "/").last ?? "")
        XCTAssertTrue(storedSmall.hasPrefix("~c3"), storedSmall)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.back("nobody")).sorted(), ["big", "moved", storedSmall].sorted(), "no copy is left")
        // Root's own protection of the same file may use the reserve.
        XCTAssertNil(errnoOf { try Syscall.setxattr(daemon.mnt("nobody/big"), "user.custody.owner", "alice@contoso.com", 17, 0) })
        XCTAssertEqual(xattr(daemon.mnt("nobody/big"), "user.custody.encrypted"), "1")
        XCTAssertFalse(try readFile(daemon.back("nobody/big")).starts(with: content.prefix(4096)), "stored encrypted")
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
