import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// The command line and lifecycle of `custodyd`: clear errors and exit codes before mounting,
/// clean unmounts on signals and on `fusermount3 -u`.
final class DaemonLifecycleTests: XCTestCase {
    var root = ""

    override func setUpWithError() throws {
        try MountedDaemon.requireFUSE()
        root = try makeTemporaryDirectory("custody-life")
        for dir in ["backing", "mnt", "state"] {
            XCTAssertEqual(mkdir(root + "/" + dir, 0o700), 0)
        }
    }

    override func tearDown() {
        if MountTable.entry(at: root + "/mnt") != nil { _ = try? runCommand(["fusermount3", "-uz", root + "/mnt"]) }
        _ = try? runCommand(["rm", "-rf", root])
    }

    private func custodyd(_ arguments: [String]) throws -> CommandResult {
        try runCommand([MountedDaemon.binary] + arguments)
    }

    func testRefusesToStartWithAClearErrorAndExitCode() throws {
        var result = try custodyd(["--state", root + "/state", root + "/missing", root + "/mnt"])
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.error.contains("backing directory \(root)/missing does not exist"), result.error)

        result = try custodyd(["--state", root + "/state", root + "/backing", root + "/nomount"])
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.error.contains("mount point \(root)/nomount does not exist"), result.error)

        XCTAssertTrue(FileManager.default.createFile(atPath: root + "/mnt/occupied", contents: Data()))
        result = try custodyd(["--state", root + "/state", root + "/backing", root + "/mnt"])
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.error.contains("is not empty"), result.error)
        XCTAssertNil(MountTable.entry(at: root + "/mnt"), "nothing was mounted")

        result = try custodyd(["--state", root + "/state", root + "/backing", root + "/backing/inner"])
        XCTAssertEqual(result.status, 1)

        XCTAssertEqual(chmod(root + "/state", 0o755), 0)
        try FileManager.default.removeItem(atPath: root + "/mnt/occupied")
        result = try custodyd(["--state", root + "/state", root + "/backing", root + "/mnt"])
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.error.contains("group or others have access"), result.error)

        result = try custodyd(["--threads", "0", root + "/backing", root + "/mnt"])
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("--threads"), result.error)

        result = try custodyd(["--version"])
        XCTAssertEqual(result.status, 0)
        XCTAssertFalse(result.output.isEmpty)
    }

    func testAlreadyMountedIsRefused() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        let second = try custodyd(["--state", daemon.state, daemon.backing, daemon.mountPoint])
        XCTAssertEqual(second.status, 1)
        XCTAssertTrue(second.error.contains("already a mount point"), second.error)
        XCTAssertTrue(daemon.isMounted, "the first mount is untouched")
        try writeFile(daemon.mnt("still-works"), bytes("yes"))
        XCTAssertEqual(try readFile(daemon.back("still-works")), bytes("yes"))
    }

    func testStateDirectoryIsCreatedPrivate() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        XCTAssertEqual(try Syscall.lstat(daemon.state).st_mode & 0o777, 0o700)
    }

    func testSignalsAndFusermountUnmountCleanly() throws {
        for way in ["SIGTERM", "SIGINT", "fusermount3"] {
            let daemon = try MountedDaemon()
            defer { daemon.destroy() }
            try writeFile(daemon.mnt("f"), bytes("x"))
            switch way {
            case "SIGTERM": kill(daemon.pid, SIGTERM)
            case "SIGINT": kill(daemon.pid, SIGINT)
            default: try mustRun(["fusermount3", "-u", daemon.mountPoint])
            }
            var status: Int32 = 0
            XCTAssertTrue(waitForExit(daemon.pid, seconds: 10, status: &status), "\(way): the daemon exits")
            XCTAssertEqual(status, 0, "\(way): exit status 0; log: \(daemon.log)")
            XCTAssertFalse(daemon.isMounted, "\(way): the mount is gone")
            XCTAssertTrue(daemon.log.contains("unmounted"), daemon.log)
            XCTAssertEqual(try readFile(daemon.back("f")), bytes("x"))
        }
    }

    /// Descriptors the daemon holds on objects below the backing root (not the root itself).
    private func backingDescriptors(_ daemon: MountedDaemon) throws -> [String] {
        let directory = "/proc/\(daemon.pid)/fd"
        return try FileManager.default.contentsOfDirectory(atPath: directory).compactMap { fd in
            let target = (try? FileManager.default.destinationOfSymbolicLink(atPath: directory + "/" + fd)) ?? ""
            return target.hasPrefix(daemon.backing + "/") ? target : nil
        }
    }

    func testForgottenInodesAndClosedFilesLeaveNoDescriptors() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        XCTAssertEqual(mkdir(daemon.mnt("d"), 0o755), 0)
        var open: [Int32] = []
        for i in 0..<300 {
            try writeFile(daemon.mnt("d/f\(i)"), bytes("\(i)"))
            XCTAssertEqual(try readFile(daemon.mnt("d/f\(i)")), bytes("\(i)"))
        }
        for i in 0..<10 { open.append(try Syscall.open(daemon.mnt("d/f\(i)"), O_RDONLY)) }
        XCTAssertGreaterThanOrEqual(try backingDescriptors(daemon).count, 300, "the kernel holds the inodes it looked up")
        for fd in open { close(fd) }
        for i in 0..<300 { XCTAssertEqual(unlink(daemon.mnt("d/f\(i)")), 0) }
        XCTAssertEqual(rmdir(daemon.mnt("d")), 0)
        // Make the kernel forget what it looked up; every descriptor below the root must close.
        try mustRun(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"])
        var remaining = try backingDescriptors(daemon)
        _ = try? eventually("the descriptors to close", timeout: 5, interval: 0.05) {
            remaining = try backingDescriptors(daemon)
            return remaining.isEmpty
        }
        XCTAssertEqual(remaining, [], "descriptors left open after forget and release")
    }

    /// More files than the daemon may have descriptors: the kernel is asked to drop the least
    /// recently used names, so creating, reading and listing never fails with EMFILE.
    func testMoreFilesThanTheDescriptorLimit() throws {
        let daemon = try MountedDaemon(wrapper: ["prlimit", "--nofile=256:256"])
        defer { daemon.destroy() }
        XCTAssertEqual(mkdir(daemon.mnt("many"), 0o755), 0)
        for i in 0..<1500 {
            try writeFile(daemon.mnt("many/f\(i)"), bytes("file \(i)"))
        }
        var peak = 0
        for i in stride(from: 0, to: 1500, by: 7) {
            XCTAssertEqual(try readFile(daemon.mnt("many/f\(i)")), bytes("file \(i)"))
            peak = max(peak, try backingDescriptors(daemon).count)
        }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("many")).count, 1500)
        let all = try runCommand(["sh", "-c", "cat \(daemon.mnt("many"))/* | wc -c"])
        XCTAssertEqual(all.error, "", "every file read")
        XCTAssertEqual(all.output, "\((0..<1500).reduce(0) { $0 + "file \($1)".utf8.count })\n")
        XCTAssertLessThan(peak, 256, "descriptors stay under the limit")
        XCTAssertFalse(daemon.log.contains("Too many open files"), daemon.log)
    }
}
