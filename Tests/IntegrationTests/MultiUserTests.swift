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

    // MARK: POSIX ACLs and the umask, as on a local file system

    /// A directory beside the backing one, on the same file system: what a local file system does.
    private func reference() throws -> String {
        let path = daemon.root + "/reference"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        XCTAssertEqual(chmod(path, 0o1777), 0)
        return path
    }

    @discardableResult
    private func setfacl(_ arguments: String...) throws -> CommandResult {
        let result = try runCommand(["setfacl"] + arguments)
        XCTAssertEqual(result.status, 0, "setfacl \(arguments): \(result.error)")
        return result
    }

    func testAccessACLsAreEnforcedNotOnlyShown() throws {
        for directory in [daemon.mnt(""), try reference()] {
            let denied = directory + "/denied", granted = directory + "/granted"
            try writeFile(denied, bytes("for others, but not nobody"), mode: 0o644)
            XCTAssertEqual(chmod(denied, 0o644), 0)
            try setfacl("-m", "u:nobody:---", denied)
            var result = try asNobody("cat '\(denied)'")
            XCTAssertNotEqual(result.status, 0, "\(directory): an ACL entry refusing nobody holds")
            XCTAssertEqual(result.output, "")
            XCTAssertTrue(result.error.contains("Permission denied"), result.error)
            // Taking the entry away is seen at once (the kernel's cached ACL is dropped).
            try setfacl("-x", "u:nobody", denied)
            result = try asNobody("cat '\(denied)'")
            XCTAssertEqual(result.status, 0, "\(directory): \(result.error)")
            XCTAssertEqual(result.output, "for others, but not nobody")

            try writeFile(granted, bytes("owner only, and nobody may read"), mode: 0o600)
            XCTAssertEqual(chmod(granted, 0o600), 0)
            try setfacl("-m", "u:nobody:r", granted)
            result = try asNobody("cat '\(granted)'")
            XCTAssertEqual(result.status, 0, "\(directory): an ACL entry granting nobody holds: \(result.error)")
            XCTAssertEqual(result.output, "owner only, and nobody may read")
            result = try asNobody("echo more >> '\(granted)'")
            XCTAssertNotEqual(result.status, 0, "\(directory): read, not write")
            XCTAssertEqual(try readFile(granted), bytes("owner only, and nobody may read"))
            // chmod narrows the ACL's mask: the entry no longer grants anything.
            XCTAssertEqual(chmod(granted, 0o600), 0)
            try setfacl("-m", "m::---", granted)
            result = try asNobody("cat '\(granted)'")
            XCTAssertNotEqual(result.status, 0, "\(directory): a mask of --- leaves the entry nothing")
        }
        XCTAssertEqual(try readFile(daemon.back("granted")), bytes("owner only, and nobody may read"))
        // The mount's root too (the kernel asks the daemon for its ACL at every walk through it).
        try setfacl("-m", "u:nobody:---", daemon.mnt(""))
        var result = try asNobody("cat '\(daemon.mnt("denied"))'")
        XCTAssertNotEqual(result.status, 0, "the root's ACL entry keeps nobody out")
        XCTAssertTrue(result.error.contains("Permission denied"), result.error)
        XCTAssertTrue(try runCommand(["getfacl", "-cp", daemon.mnt("")]).output.contains("user:nobody:---"))
        try setfacl("-b", daemon.mnt(""))
        result = try asNobody("cat '\(daemon.mnt("denied"))'")
        XCTAssertEqual(result.output, "for others, but not nobody", result.error)
    }

    func testNewObjectsTakeTheUmaskOrTheDirectorysDefaultACL() throws {
        /// What nobody's creations under umask 077 in a directory with a default ACL, and under
        /// umask 027 in one without, look like: mode and ACL of each.
        func create(in directory: String) throws -> [String] {
            let inherit = directory + "/inherit", plain = directory + "/plain"
            for path in [inherit, plain] {
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
                XCTAssertEqual(chmod(path, 0o777), 0)
            }
            try setfacl("-d", "-m", "u::rwx,u:root:rw,g::r-x,m::rwx,o::---", inherit)
            let result = try asNobody("""
                umask 077; echo a > '\(inherit)/file'; mkdir '\(inherit)/dir'; mkfifo '\(inherit)/fifo'
                umask 027; echo b > '\(plain)/file'; mkdir '\(plain)/dir'; mkfifo '\(plain)/fifo'; python3 -c "import os; os.close(os.open('\(plain)/made', os.O_CREAT | os.O_WRONLY, 0o666))"
                """)
            XCTAssertEqual(result.status, 0, result.error)
            var seen: [String] = []
            for name in ["inherit/file", "inherit/dir", "inherit/fifo", "plain/file", "plain/dir", "plain/fifo", "plain/made"] {
                let path = directory + "/" + name
                let mode = try Syscall.lstat(path).st_mode & 0o7777
                let acl = try runCommand(["getfacl", "-cp", path])
                XCTAssertEqual(acl.status, 0, acl.error)
                seen.append("\(name) \(String(mode, radix: 8)) " + acl.output.split(separator: "\n").joined(separator: ","))
            }
            return seen
        }
        let mounted = try create(in: daemon.mnt(""))
        let local = try create(in: try reference())
        XCTAssertEqual(mounted, local, "the mount creates as the backing file system does directly")
        // The same through /dev/fuse, where libfuse's threads serve the requests.
        daemon.destroy()
        daemon = try MountedDaemon(extraArguments: ["--allow-other", "--no-request-rings"])
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        XCTAssertEqual(try create(in: daemon.mnt("")), local, "through /dev/fuse too")
        // And what that is: the default ACL, not the umask, shapes the inherited objects.
        XCTAssertEqual(mounted.first, "inherit/file 660 user::rw-,user:root:rw-,group::r-x\t#effective:r--,mask::rw-,other::---")
        XCTAssertTrue(mounted.contains { $0.hasPrefix("inherit/dir 770 ") && $0.contains("default:user:root:rw-") }, "\(mounted)")
        XCTAssertTrue(mounted.contains("plain/file 640 user::rw-,group::r--,other::---"), "\(mounted)")
        XCTAssertTrue(mounted.contains("plain/dir 750 user::rwx,group::r-x,other::---"), "\(mounted)")
        XCTAssertTrue(mounted.contains("plain/fifo 640 user::rw-,group::r--,other::---"), "\(mounted)")
        XCTAssertTrue(mounted.contains("plain/made 640 user::rw-,group::r--,other::---"), "\(mounted)")
        XCTAssertEqual(try Syscall.lstat(daemon.back("plain/made")).st_mode & 0o7777, 0o640, "on the backing store too")
    }

    /// A set-group-ID script of nobody's, in `group`.
    private func setGroupIDScript(_ path: String, group: gid_t) throws {
        try writeFile(path, bytes("#!/bin/sh\n"), mode: 0o755)
        XCTAssertEqual(chown(path, nobody, group), 0)   // first: a chown clears set-group-ID
        XCTAssertEqual(chmod(path, 0o2775), 0)
    }

    func testSettingAnACLOutsideTheFilesGroupDropsSetGroupID() throws {
        for directory in [daemon.mnt(""), try reference()] {
            let foreign = directory + "/foreign-group", own = directory + "/own-group"
            for (path, group) in [(foreign, gid_t(0)), (own, gid_t(nobody))] {
                try setGroupIDScript(path, group: group)
                let result = try asNobody("setfacl -m u:root:rwx '\(path)'")
                XCTAssertEqual(result.status, 0, result.error)
            }
            XCTAssertEqual(try Syscall.lstat(foreign).st_mode & 0o7777, 0o775,
                           "\(directory): set-group-ID goes when the group is not the caller's")
            XCTAssertEqual(try Syscall.lstat(own).st_mode & 0o7777, 0o2775, "\(directory): and stays when it is")
        }
        XCTAssertEqual(try Syscall.lstat(daemon.back("foreign-group")).st_mode & 0o7777, 0o775)
    }

    /// CAP_FSETID, not being root, keeps set-group-ID on an ACL change outside the file's group:
    /// nobody given the capability keeps it, root without it loses it, as on ext4.
    func testTheCapabilityToKeepSetIDDecidesAfterAnACLChange() throws {
        for directory in [daemon.mnt(""), try reference()] {
            let capable = directory + "/capable", incapable = directory + "/incapable"
            try setGroupIDScript(capable, group: 0)
            try setGroupIDScript(incapable, group: gid_t(nobody))
            let withCapability = try runCommand(["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                                                 "--inh-caps=+fsetid", "--ambient-caps=+fsetid", "setfacl", "-m", "u:root:rwx", capable])
            XCTAssertEqual(withCapability.status, 0, withCapability.error)
            let rootWithout = try runCommand(["setpriv", "--clear-groups", "--inh-caps=-fsetid", "--bounding-set=-fsetid",
                                              "setfacl", "-m", "u:root:rwx", incapable])
            XCTAssertEqual(rootWithout.status, 0, rootWithout.error)
            XCTAssertEqual(try Syscall.lstat(capable).st_mode & 0o7777, 0o2775, "\(directory): kept with CAP_FSETID")
            XCTAssertEqual(try Syscall.lstat(incapable).st_mode & 0o7777, 0o775, "\(directory): root without it loses it")
        }
    }
}
