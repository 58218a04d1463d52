import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Damage to encrypted files on the backing store, seen through the mount: a zeroed block is an
/// error (not a hole of zeros), while real holes read as zeros and stay sparse.
final class IntegrityTests: XCTestCase {
    var daemon: MountedDaemon!

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=alice@contoso.com"])
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func dropCaches() throws { _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"]) }

    func cat(_ path: String) throws -> CommandResult { try runCommand(["sh", "-c", "cat '\(path)' > /dev/null"]) }

    func testAZeroedBlockIsAnErrorAndHolesStaySparseAndReadAsZeros() throws {
        let layout = BlockLayout()
        // A written file, one of its middle blocks zeroed on the backing store.
        let data = (0..<(16 * 4096)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        try writeFile(daemon.mnt("written"), data)
        XCTAssertEqual(xattr(daemon.mnt("written"), "user.custody.encrypted"), "1")
        XCTAssertEqual(try cat(daemon.mnt("written")).status, 0)
        _ = try mustRun(["dd", "if=/dev/zero", "of=\(daemon.back("written"))", "bs=1", "seek=\(layout.storedOffset(ofBlock: 5))",
                         "count=\(layout.storedBlockSize)", "conv=notrunc", "status=none"])
        try dropCaches()
        let damaged = try cat(daemon.mnt("written"))
        XCTAssertNotEqual(damaged.status, 0, "reading the zeroed block fails")
        XCTAssertTrue(damaged.error.contains("Input/output error"), damaged.error)
        XCTAssertTrue(daemon.log.contains("content block 5 failed authentication"), daemon.log)
        // Blocks before it still read.
        let head = try runCommand(["dd", "if=\(daemon.mnt("written"))", "bs=4096", "count=5", "status=none"])
        XCTAssertEqual(head.status, 0, head.error)

        // A sparse file: written at both ends, and grown by truncate.
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("sparse"))", "bs=4096", "count=1", "status=none"])
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("sparse"))", "bs=4096", "count=1", "seek=8191", "conv=notrunc", "status=none"])
        _ = try mustRun(["truncate", "-s", "64M", daemon.mnt("sparse")])
        try dropCaches()
        XCTAssertEqual(try cat(daemon.mnt("sparse")).status, 0, "holes read as zeros")
        let middle = try runCommand(["sh", "-c", "dd if='\(daemon.mnt("sparse"))' bs=4096 skip=100 count=16 status=none | od -v -An -tx1 | sort -u"])
        XCTAssertEqual(middle.output.trimmingCharacters(in: " \n"), "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00")
        let stored = try Syscall.lstat(daemon.back("sparse"))
        XCTAssertGreaterThan(stored.st_size, 64 << 20)
        XCTAssertLessThan(stored.st_blocks * 512, 1 << 20, "the holes take no space on the backing store")
        // Filling a hole, then zeroing it on the backing store: an error again.
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("sparse"))", "bs=4096", "count=1", "seek=4000", "conv=notrunc", "status=none"])
        try dropCaches()
        XCTAssertEqual(try cat(daemon.mnt("sparse")).status, 0)
        _ = try mustRun(["dd", "if=/dev/zero", "of=\(daemon.back("sparse"))", "bs=1", "seek=\(layout.storedOffset(ofBlock: 4000))",
                         "count=\(layout.storedBlockSize)", "conv=notrunc", "status=none"])
        try dropCaches()
        XCTAssertNotEqual(try cat(daemon.mnt("sparse")).status, 0, "a filled hole zeroed again is damage")
        XCTAssertTrue(daemon.isMounted)
    }
}
