import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// A mount over a small tmpfs: filling it, removing files, filling it with an encrypted file.
final class FullDiskTests: XCTestCase {
    var daemon: MountedDaemon!
    var backingMounted: String?
    static let backingMiB = 24

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=alice@contoso.com"]) { state in
            let backing = URL(fileURLWithPath: state).deletingLastPathComponent().appendingPathComponent("backing").path
            try FileManager.default.createDirectory(atPath: backing, withIntermediateDirectories: true)
            _ = try mustRun(["mount", "-t", "tmpfs", "-o", "size=\(Self.backingMiB)m", "tmpfs", backing])
            self.backingMounted = backing
        }
    }

    override func tearDown() {
        daemon?.stop()
        if let backingMounted { _ = try? runCommand(["umount", backingMounted]) }
        daemon?.destroy()
        daemon = nil
    }

    func enrollAlice() throws {
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
    }

    /// Free space as programs on the mount see it (`df`; a STATFS request).
    var freeBytes: UInt64 {
        var info = statvfs()
        statvfs(daemon.mountPoint, &info)
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    /// Writes more than fits with `dd … conv=fsync`; the source file and dd's result.
    func overfill(_ name: String) throws -> ([UInt8], CommandResult) {
        let source = daemon.root + "/source-\(name)"
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(source)", "bs=1M", "count=\(Self.backingMiB + 8)", "status=none"])
        let result = try runCommand(["dd", "if=\(source)", "of=\(daemon.mnt(name))", "bs=1M", "conv=fsync", "status=none"])
        return (try readFile(source), result)
    }

    /// What `cat` reads: it must succeed (no EIO anywhere) and begin with what fitted. An
    /// encrypted file is then a clean prefix of `source` followed by nothing but zeros (the
    /// kernel's page cache keeps the size it was given); so is a plain file, at any byte.
    func checkCleanPrefix(_ name: String, _ source: [UInt8], blockAligned: Bool) throws -> Int {
        let cat = try runCommand(["sh", "-c", "cat '\(daemon.mnt(name))' > '\(daemon.root)/read-back'"])
        XCTAssertEqual(cat.status, 0, "cat of \(name) fails: \(cat.error)")
        let read = try readFile(daemon.root + "/read-back")
        let prefix = zip(read, source).prefix { $0 == $1 }.count
        XCTAssertGreaterThan(prefix, 0, "\(name): what fitted reads back")
        if blockAligned {
            // Where the stored data ends: a block boundary of the plaintext, no torn block on disk.
            let stored = try Syscall.lstat(daemon.back(name)).st_size
            let layout = BlockLayout()
            let plaintext = Int(try layout.plaintextSize(storedSize: UInt64(stored)))
            XCTAssertEqual(plaintext % 4096, 0, "\(name): the stored file ends at a block boundary")
            XCTAssertEqual(layout.storedSize(plaintextSize: UInt64(plaintext)), UInt64(stored))
            // The matching prefix may run on past the stored end where the source itself holds
            // zeros, so the stored end, not the first difference, is where the data must stop.
            XCTAssertGreaterThanOrEqual(prefix, plaintext, "\(name): everything stored reads back")
            XCTAssertLessThanOrEqual(plaintext, read.count, "\(name): the read is at least as long as what is stored")
            XCTAssertTrue(read[min(plaintext, read.count)...].allSatisfy { $0 == 0 }, "\(name): after what is stored only zeros, no garbage")
            return plaintext
        }
        return prefix
    }

    func testAnEncryptedFileThatFillsTheDiskReadsAsACleanPrefix() throws {
        try enrollAlice()
        let (source, dd) = try overfill("big")
        XCTAssertNotEqual(dd.status, 0, "dd must report the full disk")
        XCTAssertTrue(dd.error.contains("No space left on device"), dd.error)
        XCTAssertEqual(xattr(daemon.mnt("big"), "user.custody.encrypted"), "1")
        _ = try checkCleanPrefix("big", source, blockAligned: true)
        // The daemon's own answer for the size (a new lookup after the kernel lets the inode go).
        _ = try mustRun(["sh", "-c", "sync; echo 2 > /proc/sys/vm/drop_caches"])
        let size = try Syscall.lstat(daemon.mnt("big")).st_size
        XCTAssertEqual(size % 4096, 0, "the size says where the stored data ends")
        XCTAssertTrue(try readFile(daemon.mnt("big")) == Array(source.prefix(Int(size))), "after the kernel let go, the file is the prefix")
        // Space freed: the daemon writes again.
        try FileManager.default.removeItem(atPath: daemon.mnt("big"))
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("after"))", "bs=1M", "count=4", "conv=fsync", "status=none"])
        XCTAssertEqual(try readFile(daemon.mnt("after")).count, 4 << 20)
    }

    /// A plain file gets the same rule: what is stored is a prefix of what was written, with no
    /// run of zeros (a hole a failed write-back left) before data that was written after it.
    func testAPlainFileThatFillsTheDiskReadsAsACleanPrefix() throws {
        for round in 0..<1 {
            let name = "plain\(round)"
            let (source, dd) = try overfill(name)
            XCTAssertNotEqual(dd.status, 0)
            XCTAssertNil(xattr(daemon.mnt(name), "user.custody.encrypted").flatMap { $0 == "1" ? $0 : nil })
            _ = try checkCleanPrefix(name, source, blockAligned: false)
            // Stored: no hole inside the file.
            let fd = try Syscall.open(daemon.back(name), O_RDONLY | O_CLOEXEC)
            let stored = try Syscall.fstat(fd).st_size
            let firstHole = Glibc.lseek(fd, 0, Linux.SEEK_HOLE)
            close(fd)
            XCTAssertEqual(firstHole, stored, "round \(round): the stored file has no hole before its end")
            // After the kernel lets the inode go, the file is the prefix, and only it.
            _ = try mustRun(["sh", "-c", "sync; echo 2 > /proc/sys/vm/drop_caches"])
            let size = Int(try Syscall.lstat(daemon.mnt(name)).st_size)
            XCTAssertGreaterThan(size, 0)
            XCTAssertTrue(try readFile(daemon.mnt(name)) == Array(source.prefix(size)), "round \(round): the file is a prefix of what was written")
            try FileManager.default.removeItem(atPath: daemon.mnt(name))
        }
    }

    /// Written out of order (direct writes: each reaches the daemon as the program makes it): a
    /// range near the end first, then from the start until the disk is full. The write that fails
    /// leaves a hole below the stored end, so the file is cut where the hole begins; writes that
    /// would leave a gap then fail with ENOSPC until the file is truncated.
    func testAPlainFileWrittenOutOfOrderIsCutWhereTheFailedWriteLeftAHole() throws {
        // Space to give back later.
        _ = try mustRun(["dd", "if=/dev/zero", "of=\(daemon.mnt("filler"))", "bs=1M", "count=4", "conv=fsync", "status=none"])
        let writer = #"""
        import errno, mmap, os, sys
        path, filler, stored = sys.argv[1], sys.argv[2], sys.argv[3]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        buffer = mmap.mmap(-1, 1 << 20)
        buffer.write(bytes((i * 7 + 3) % 251 for i in range(1 << 20)))
        def write(offset):
            try:
                os.pwrite(fd, buffer, offset)
                return "written"
            except OSError as error:
                return errno.errorcode[error.errno]
        print(write(30 << 20))
        offset = 0
        while write(offset) == "written":
            offset += 1 << 20
        print(offset)
        # What the backing store holds (the kernel keeps the size it knows until it lets the inode go).
        print(os.stat(stored).st_size, os.lseek(os.open(stored, os.O_RDONLY), 0, os.SEEK_HOLE))
        # Space again: a write that would leave a gap is refused; one at the end goes through.
        os.unlink(filler)
        print(write(offset + (1 << 20)), write(offset))
        # A truncation ends the refusal.
        os.truncate(path, offset)
        print(write(offset + (1 << 20)))
        """#
        let result = try runCommand(["python3", "-c", writer, daemon.mnt("sparse"), daemon.mnt("filler"), daemon.back("sparse")])
        XCTAssertEqual(result.status, 0, result.error)
        let lines = result.output.split(separator: "\n").map(String.init)
        XCTAssertEqual(lines.count, 5, result.output)
        guard lines.count == 5 else { return }
        XCTAssertEqual(lines[0], "written", "the range near the end fits")
        let failedAt = try XCTUnwrap(Int(lines[1]))
        XCTAssertLessThan(failedAt, 30 << 20)
        XCTAssertEqual(lines[2], "\(failedAt) \(failedAt)", "cut where the hole began (the range written first, past it, is gone with it); no hole inside")
        XCTAssertEqual(lines[3], "ENOSPC written", "after the failure, a gap is refused and the end is not")
        XCTAssertEqual(lines[4], "written", "a truncation ends the refusal")
    }

    /// Writes that fail only when the kernel writes its cached pages back are reported by the
    /// close, as on the backing file system, though the mount answers no FLUSH there.
    func testACloseReportsWritesThatFailedLater() throws {
        for encrypted in [false, true] {
            if encrypted { try enrollAlice() }
            let path = daemon.mnt(encrypted ? "late-encrypted" : "late-plain")
            let fd = try Syscall.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            let chunk = [UInt8](repeating: 0x5a, count: 1 << 20)
            var written = 0
            for _ in 0..<(Self.backingMiB + 8) {
                let count = chunk.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
                if count < 0 { break }
                written += count
            }
            let closed = Glibc.close(fd)
            let error = errno
            XCTAssertEqual(closed, -1, "\(path): \(written) bytes into \(Self.backingMiB) MiB and close says nothing")
            XCTAssertEqual(error, ENOSPC, "\(path): close fails with \(Errno(error))")
            _ = try mustRun(["rm", path])
        }
    }

    /// rm gives the space back at once, as on the backing file system: the next write fits
    /// without waiting for the kernel to forget the file.
    func testRemovingAFileFreesItsSpaceAtOnce() throws {
        for encrypted in [false, true] {
            if encrypted { try enrollAlice() }
            let name = encrypted ? "fill-encrypted" : "fill-plain"
            // Fill most of the disk (without running out, so the file is whole).
            _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt(name))", "bs=1M", "count=\(Self.backingMiB - 4)", "conv=fsync", "status=none"])
            XCTAssertLessThan(freeBytes, 8 << 20)
            _ = try mustRun(["rm", daemon.mnt(name)])
            XCTAssertGreaterThan(freeBytes, UInt64(Self.backingMiB - 6) << 20, "\(name): the space is free right after rm")
            _ = try mustRun(["dd", "if=/dev/zero", "of=\(daemon.mnt("next"))", "bs=1M", "count=\(Self.backingMiB - 6)", "conv=fsync", "status=none"])
            _ = try mustRun(["rm", daemon.mnt("next")])
        }
        // Removed while open: the space stays while the file is open (as POSIX says) and comes
        // back when it is closed.
        _ = try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("held"))", "bs=1M", "count=16", "conv=fsync", "status=none"])
        let holder = try spawn("/bin/sh", ["-c", "exec sleep 30 3<'\(daemon.mnt("held"))'"])
        defer { kill(holder, SIGKILL); waitForExit(holder, seconds: 5) }
        usleep(300_000)
        _ = try mustRun(["rm", daemon.mnt("held")])
        XCTAssertLessThan(freeBytes, UInt64(Self.backingMiB - 14) << 20, "an open file keeps its space")
        kill(holder, SIGKILL)
        waitForExit(holder, seconds: 5)
        _ = try? eventually("the space to come back", timeout: 2) { freeBytes >= UInt64(Self.backingMiB - 6) << 20 }
        XCTAssertGreaterThan(freeBytes, UInt64(Self.backingMiB - 6) << 20, "the space comes back at the last close")
        XCTAssertTrue(daemon.isMounted)
    }
}
