import CustodySystem
import Foundation
import Glibc
import XCTest

/// Each FUSE operation of the plaintext passthrough, through a real mount: content and errno as
/// seen through the mount, and what lands on the backing store.
final class PassthroughOperationTests: XCTestCase {
    var daemon: MountedDaemon!

    override func setUpWithError() throws {
        daemon = try MountedDaemon()
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testCreateWriteReadAndAttributes() throws {
        try writeFile(daemon.mnt("a.txt"), bytes("hello custody\n"), mode: 0o640)
        XCTAssertEqual(try readFile(daemon.back("a.txt")), bytes("hello custody\n"))
        XCTAssertEqual(try readFile(daemon.mnt("a.txt")), bytes("hello custody\n"))
        let through = try Syscall.lstat(daemon.mnt("a.txt"))
        let backing = try Syscall.lstat(daemon.back("a.txt"))
        XCTAssertEqual(through.st_size, 14)
        XCTAssertEqual(through.st_mode, backing.st_mode)
        XCTAssertEqual(through.st_mode & 0o777, 0o640, "mode is exactly what was asked (daemon umask is 0)")
        XCTAssertEqual(through.st_uid, backing.st_uid)
        XCTAssertEqual(through.st_mtim.tv_sec, backing.st_mtim.tv_sec)
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(daemon.mnt("missing")) }, ENOENT)
        // A file created on the backing store directly shows through.
        try writeFile(daemon.back("direct"), bytes("from below"))
        XCTAssertEqual(try readFile(daemon.mnt("direct")), bytes("from below"))
    }

    func testOpenFlagsTruncAppendExcl() throws {
        let path = daemon.mnt("flags")
        try writeFile(path, bytes("0123456789"))
        try writeFile(path, bytes("ab"), flags: O_WRONLY | O_TRUNC)
        XCTAssertEqual(try readFile(daemon.back("flags")), bytes("ab"), "O_TRUNC empties the file")
        try writeFile(path, bytes("cd"), flags: O_WRONLY | O_APPEND)
        try writeFile(path, bytes("ef"), flags: O_RDWR | O_APPEND)
        XCTAssertEqual(try readFile(daemon.back("flags")), bytes("abcdef"), "O_APPEND writes at the end")
        XCTAssertEqual(errnoOf { try writeFile(path, bytes("x"), flags: O_WRONLY | O_CREAT | O_EXCL) }, EEXIST)
        try writeFile(daemon.mnt("fresh"), bytes("x"), flags: O_WRONLY | O_CREAT | O_EXCL)
        XCTAssertEqual(try readFile(daemon.back("fresh")), bytes("x"))
        // A write-only handle, then a read-only one.
        let fd = try Syscall.open(path, O_WRONLY)
        XCTAssertEqual(errnoOf { var b = [UInt8](repeating: 0, count: 4); _ = try b.withUnsafeMutableBytes { p in try Syscall.pread(fd, p.baseAddress!, 4, 0) } }, EBADF)
        close(fd)
        XCTAssertEqual(errnoOf { try writeFile(daemon.mnt("nodir/x"), bytes("x")) }, ENOENT)
    }

    func testSetattrChmodChownTruncateUtimens() throws {
        let path = daemon.mnt("f")
        try writeFile(path, bytes("some content here"))
        XCTAssertEqual(chmod(path, 0o600), 0)
        XCTAssertEqual(try Syscall.lstat(daemon.back("f")).st_mode & 0o7777, 0o600)
        XCTAssertEqual(chown(path, 1234, 5678), 0)
        let owned = try Syscall.lstat(daemon.back("f"))
        XCTAssertEqual(owned.st_uid, 1234)
        XCTAssertEqual(owned.st_gid, 5678)
        XCTAssertEqual(try Syscall.lstat(path).st_uid, 1234)

        XCTAssertEqual(truncate(path, 4), 0)
        XCTAssertEqual(try readFile(daemon.back("f")), bytes("some"))
        XCTAssertEqual(truncate(path, 10), 0)
        XCTAssertEqual(try readFile(path), bytes("some") + [UInt8](repeating: 0, count: 6))
        // ftruncate on an open handle.
        let fd = try Syscall.open(path, O_RDWR)
        XCTAssertEqual(ftruncate(fd, 2), 0)
        close(fd)
        XCTAssertEqual(try Syscall.lstat(daemon.back("f")).st_size, 2)

        // Explicit times, then UTIME_OMIT for atime and UTIME_NOW for mtime.
        var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 123_456_789), timespec(tv_sec: 1_200_000_000, tv_nsec: 5)]
        XCTAssertEqual(utimensat(AT_FDCWD, path, &times, 0), 0)
        var st = try Syscall.lstat(daemon.back("f"))
        XCTAssertEqual(st.st_atim.tv_sec, 1_000_000_000)
        XCTAssertEqual(st.st_atim.tv_nsec, 123_456_789)
        XCTAssertEqual(st.st_mtim.tv_sec, 1_200_000_000)
        times = [timespec(tv_sec: 0, tv_nsec: Linux.UTIME_OMIT), timespec(tv_sec: 0, tv_nsec: Linux.UTIME_NOW)]
        XCTAssertEqual(utimensat(AT_FDCWD, path, &times, 0), 0)
        st = try Syscall.lstat(daemon.back("f"))
        XCTAssertEqual(st.st_atim.tv_sec, 1_000_000_000, "UTIME_OMIT leaves atime")
        XCTAssertGreaterThan(st.st_mtim.tv_sec, Int(time(nil)) - 60, "UTIME_NOW sets mtime to now")
        // Times on a symlink itself.
        XCTAssertEqual(symlink("f", daemon.mnt("lnk")), 0)
        times = [timespec(tv_sec: 1_100_000_000, tv_nsec: 0), timespec(tv_sec: 1_100_000_000, tv_nsec: 0)]
        XCTAssertEqual(utimensat(AT_FDCWD, daemon.mnt("lnk"), &times, AT_SYMLINK_NOFOLLOW), 0)
        XCTAssertEqual(try Syscall.lstat(daemon.back("lnk")).st_mtim.tv_sec, 1_100_000_000)
        XCTAssertEqual(try Syscall.lstat(daemon.back("f")).st_mtim.tv_sec != 1_100_000_000, true)
    }

    func testDirectoriesMkdirRmdirReaddir() throws {
        XCTAssertEqual(mkdir(daemon.mnt("d"), 0o750), 0)
        XCTAssertEqual(try Syscall.lstat(daemon.back("d")).st_mode & 0o777, 0o750)
        XCTAssertEqual(mkdir(daemon.mnt("d"), 0o750), -1)
        XCTAssertEqual(errno, EEXIST)
        // Enough entries that the listing takes several readdir requests.
        var expected = Set<String>()
        for i in 0..<1500 {
            let name = "entry-\(i)-" + String(repeating: "x", count: i % 40)
            expected.insert(name)
            try writeFile(daemon.mnt("d/" + name), [])
        }
        XCTAssertEqual(Set(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("d"))), expected)
        // readdir again after the kernel dropped its caches: the listing is the same.
        try mustRun(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"])
        let listing = try mustRun(["ls", "-la", daemon.mnt("d")])
        XCTAssertEqual(listing.split(separator: "\n").count, 1500 + 3, "total, ., .. and every entry")
        XCTAssertEqual(rmdir(daemon.mnt("d")), -1)
        XCTAssertEqual(errno, ENOTEMPTY)
        for name in expected { XCTAssertEqual(unlink(daemon.mnt("d/" + name)), 0) }
        XCTAssertEqual(rmdir(daemon.mnt("d")), 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.back("d")))
        XCTAssertEqual(rmdir(daemon.mnt("d")), -1)
        XCTAssertEqual(errno, ENOENT)
    }

    func testUnlinkAndRename() throws {
        try writeFile(daemon.mnt("a"), bytes("A"))
        try writeFile(daemon.mnt("b"), bytes("B"))
        XCTAssertEqual(rename(daemon.mnt("a"), daemon.mnt("b")), 0, "rename over an existing file")
        XCTAssertEqual(try readFile(daemon.mnt("b")), bytes("A"))
        XCTAssertEqual(try readFile(daemon.back("b")), bytes("A"))
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.back("a")))
        XCTAssertEqual(errnoOf { _ = try readFile(daemon.mnt("a")) }, ENOENT)

        try writeFile(daemon.mnt("c"), bytes("C"))
        XCTAssertEqual(errnoOf { try Syscall.renameat2(AT_FDCWD, daemon.mnt("c"), AT_FDCWD, daemon.mnt("b"), Linux.RENAME_NOREPLACE) }, EEXIST)
        XCTAssertEqual(try readFile(daemon.back("b")), bytes("A"), "RENAME_NOREPLACE left the target alone")
        try Syscall.renameat2(AT_FDCWD, daemon.mnt("c"), AT_FDCWD, daemon.mnt("b"), Linux.RENAME_EXCHANGE)
        XCTAssertEqual(try readFile(daemon.back("b")), bytes("C"))
        XCTAssertEqual(try readFile(daemon.back("c")), bytes("A"))
        XCTAssertEqual(try readFile(daemon.mnt("c")), bytes("A"), "RENAME_EXCHANGE swapped the names")

        XCTAssertEqual(mkdir(daemon.mnt("sub"), 0o755), 0)
        XCTAssertEqual(rename(daemon.mnt("c"), daemon.mnt("sub/moved")), 0)
        XCTAssertEqual(try readFile(daemon.back("sub/moved")), bytes("A"))
        XCTAssertEqual(unlink(daemon.mnt("sub/moved")), 0)
        XCTAssertEqual(unlink(daemon.mnt("sub/moved")), -1)
        XCTAssertEqual(errno, ENOENT)
        XCTAssertEqual(unlink(daemon.mnt("sub")), -1)
        XCTAssertEqual(errno, EISDIR)
    }

    func testSymlinkReadlinkHardLinkFifo() throws {
        try writeFile(daemon.mnt("target"), bytes("data"))
        XCTAssertEqual(symlink("target", daemon.mnt("sl")), 0)
        XCTAssertEqual(linkText(try Syscall.readlinkat(AT_FDCWD, daemon.mnt("sl"))), "target")
        XCTAssertEqual(linkText(try Syscall.readlinkat(AT_FDCWD, daemon.back("sl"))), "target")
        XCTAssertEqual(try readFile(daemon.mnt("sl")), bytes("data"))
        let longTarget = String(repeating: "t/", count: 1000) + "end"
        XCTAssertEqual(symlink(longTarget, daemon.mnt("long")), 0)
        XCTAssertEqual(linkText(try Syscall.readlinkat(AT_FDCWD, daemon.mnt("long"))), longTarget)

        XCTAssertEqual(link(daemon.mnt("target"), daemon.mnt("hard")), 0)
        let a = try Syscall.lstat(daemon.mnt("target")), b = try Syscall.lstat(daemon.mnt("hard"))
        XCTAssertEqual(a.st_ino, b.st_ino, "hard links are one inode through the mount")
        XCTAssertEqual(b.st_nlink, 2)
        XCTAssertEqual(try Syscall.lstat(daemon.back("target")).st_ino, try Syscall.lstat(daemon.back("hard")).st_ino)
        try writeFile(daemon.mnt("hard"), bytes("shared!"), flags: O_WRONLY | O_TRUNC)
        XCTAssertEqual(try readFile(daemon.mnt("target")), bytes("shared!"), "hard links share data")
        XCTAssertEqual(unlink(daemon.mnt("target")), 0)
        XCTAssertEqual(try Syscall.lstat(daemon.mnt("hard")).st_nlink, 1)

        XCTAssertEqual(mkfifo(daemon.mnt("fifo"), 0o600), 0)
        XCTAssertEqual(try Syscall.lstat(daemon.back("fifo")).st_mode & S_IFMT, S_IFIFO)
        XCTAssertEqual(try Syscall.lstat(daemon.mnt("fifo")).st_mode & S_IFMT, S_IFIFO)
    }

    func testStatfsAccessFsync() throws {
        var through = statvfs(), backing = statvfs()
        XCTAssertEqual(statvfs(daemon.mountPoint, &through), 0)
        XCTAssertEqual(statvfs(daemon.backing, &backing), 0)
        XCTAssertEqual(through.f_blocks, backing.f_blocks)
        XCTAssertEqual(through.f_bsize, backing.f_bsize)

        try writeFile(daemon.mnt("x"), bytes("x"), mode: 0o644)
        XCTAssertEqual(access(daemon.mnt("x"), R_OK | W_OK), 0)
        XCTAssertEqual(access(daemon.mnt("nope"), F_OK), -1)
        XCTAssertEqual(errno, ENOENT)

        let fd = try Syscall.open(daemon.mnt("x"), O_RDWR)
        XCTAssertEqual(fsync(fd), 0)
        XCTAssertEqual(fdatasync(fd), 0)
        close(fd)
        let dir = try Syscall.open(daemon.mountPoint, O_RDONLY | O_DIRECTORY)
        XCTAssertEqual(fsync(dir), 0, "fsyncdir")
        close(dir)
    }

    /// Attribute reads while `path` is open (the daemon then answers through the open descriptor)
    /// agree with the backing file, before and after changes and after the last close.
    private func checkAttributesWhileOpen(_ path: String, backing: String, file: StaticString = #filePath, line: UInt = #line) throws {
        try Syscall.setxattr(path, "user.color", "blue", 4, 0)
        let first = try Syscall.open(path, O_WRONLY)
        XCTAssertEqual(xattr(path, "user.color"), "blue", file: file, line: line)
        XCTAssertEqual(try Syscall.getxattr(path, "user.color", nil, 0), 4, "size query", file: file, line: line)
        var small = [UInt8](repeating: 0, count: 2)
        XCTAssertEqual(errnoOf { _ = try Syscall.getxattr(path, "user.color", &small, 2) }, ERANGE, file: file, line: line)
        XCTAssertEqual(errnoOf { _ = try Syscall.getxattr(path, "security.capability", nil, 0) }, ENODATA, file: file, line: line)
        try Syscall.pwriteAll(first, "data", 4, 0)
        try Syscall.setxattr(path, "user.color", "green", 5, 0)
        let second = try Syscall.open(path, O_RDONLY)
        close(second)
        // The latest handle is closed, the first is still open.
        XCTAssertEqual(xattr(path, "user.color"), "green", file: file, line: line)
        XCTAssertEqual(xattr(backing, "user.color"), "green", file: file, line: line)
        close(first)
        try Syscall.removexattr(backing, "user.color")
        XCTAssertNil(xattr(path, "user.color"), "after the last close the backing file answers", file: file, line: line)
        XCTAssertEqual(try readFile(path), bytes("data"), file: file, line: line)
    }

    func testExtendedAttributesWhileTheFileIsOpen() throws {
        try writeFile(daemon.mnt("open.txt"), bytes("x"))
        try checkAttributesWhileOpen(daemon.mnt("open.txt"), backing: daemon.back("open.txt"))
        // An encrypted file: the descriptor is its content's.
        let encrypted = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { encrypted.destroy() }
        XCTAssertEqual(try encrypted.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        try writeFile(encrypted.mnt("open.txt"), bytes("x"))
        XCTAssertEqual(xattr(encrypted.mnt("open.txt"), "user.custody.encrypted"), "1")
        try checkAttributesWhileOpen(encrypted.mnt("open.txt"), backing: encrypted.back("open.txt"))
    }

    func testExtendedAttributes() throws {
        let path = daemon.mnt("x")
        try writeFile(path, bytes("x"))
        let value = bytes("a value with\0a nul")
        XCTAssertEqual(errnoOf { try Syscall.setxattr(path, "user.test", value, value.count, 0) }, nil)
        XCTAssertEqual(errnoOf { try Syscall.setxattr(path, "user.test", value, value.count, Linux.XATTR_CREATE) }, EEXIST)
        XCTAssertEqual(errnoOf { try Syscall.setxattr(path, "user.none", value, value.count, Linux.XATTR_REPLACE) }, ENODATA)
        // Size query, then the value, through the mount and on the backing file.
        XCTAssertEqual(try Syscall.getxattr(path, "user.test", nil, 0), value.count)
        for file in [path, daemon.back("x")] {
            var buffer = [UInt8](repeating: 0, count: 64)
            let n = try Syscall.getxattr(file, "user.test", &buffer, buffer.count)
            XCTAssertEqual(Array(buffer[0..<n]), value)
        }
        var small = [UInt8](repeating: 0, count: 2)
        XCTAssertEqual(errnoOf { _ = try Syscall.getxattr(path, "user.test", &small, 2) }, ERANGE)
        let listing = try mustRun(["getfattr", "-d", "--absolute-names", path])
        XCTAssertTrue(listing.contains("user.test="), listing)
        try Syscall.removexattr(path, "user.test")
        XCTAssertEqual(errnoOf { _ = try Syscall.getxattr(daemon.back("x"), "user.test", nil, 0) }, ENODATA)
        XCTAssertEqual(errnoOf { try Syscall.removexattr(path, "user.test") }, ENODATA)
        XCTAssertEqual(try Syscall.listxattr(path, nil, 0), 0)
        // Directories carry them too; setfattr and getfattr work.
        XCTAssertEqual(mkdir(daemon.mnt("d"), 0o755), 0)
        try mustRun(["setfattr", "-n", "user.dir", "-v", "yes", daemon.mnt("d")])
        XCTAssertEqual(try mustRun(["getfattr", "--only-values", "-n", "user.dir", daemon.back("d")]), "yes")
    }

    /// Attributes are read by the name a file was looked up by when that name still leads to it:
    /// after the names of two files are swapped through the mount (the kernel moves its cached
    /// entries and asks nothing), each still shows its own value and its own missing attributes.
    func testExtendedAttributesAfterNamesAreSwapped() throws {
        for (name, value) in [("a", "first"), ("b", "other")] {
            try writeFile(daemon.mnt(name), bytes(name))
            try Syscall.setxattr(daemon.mnt(name), "user.k", value, value.utf8.count, 0)
        }
        try Syscall.setxattr(daemon.mnt("b"), "user.only-b", "x", 1, 0)
        XCTAssertEqual(xattr(daemon.mnt("a"), "user.k"), "first")
        XCTAssertEqual(rename(daemon.mnt("a"), daemon.mnt("c")), 0)
        XCTAssertEqual(rename(daemon.mnt("b"), daemon.mnt("a")), 0)
        XCTAssertEqual(xattr(daemon.mnt("c"), "user.k"), "first")
        XCTAssertEqual(errnoOf { _ = try Syscall.getxattr(daemon.mnt("c"), "user.only-b", nil, 0) }, ENODATA)
        XCTAssertEqual(xattr(daemon.mnt("a"), "user.k"), "other")
        XCTAssertEqual(try readFile(daemon.mnt("c")), bytes("a"))
    }

    func testSparseFilesFallocateAndSeekHole() throws {
        let path = daemon.mnt("sparse")
        let fd = try Syscall.open(path, O_RDWR | O_CREAT, 0o644)
        defer { close(fd) }
        let mib = 1 << 20
        let chunk = [UInt8](repeating: 0xAB, count: 4096)
        try chunk.withUnsafeBytes { p in try Syscall.pwriteAll(fd, p.baseAddress!, p.count, Int64(4 * mib)) }
        XCTAssertEqual(fsync(fd), 0)
        XCTAssertEqual(try Syscall.fstat(fd).st_size, 4 * mib + 4096)
        XCTAssertLessThan(try Syscall.lstat(daemon.back("sparse")).st_blocks, 64, "the hole is not allocated on the backing file")
        XCTAssertEqual(try Syscall.lseek(fd, 0, Linux.SEEK_DATA), Int64(4 * mib))
        XCTAssertEqual(try Syscall.lseek(fd, 0, Linux.SEEK_HOLE), 0)
        XCTAssertEqual(try Syscall.lseek(fd, Int64(4 * mib), Linux.SEEK_HOLE), Int64(4 * mib + 4096))
        XCTAssertEqual(errnoOf { _ = try Syscall.lseek(fd, Int64(5 * mib), Linux.SEEK_DATA) }, ENXIO)
        var head = [UInt8](repeating: 1, count: 16)
        XCTAssertEqual(try head.withUnsafeMutableBytes { p in try Syscall.pread(fd, p.baseAddress!, 16, 1000) }, 16)
        XCTAssertEqual(head, [UInt8](repeating: 0, count: 16), "holes read as zeros")

        try Syscall.fallocate(fd, 0, 0, Int64(mib))
        XCTAssertGreaterThanOrEqual(try Syscall.lstat(daemon.back("sparse")).st_blocks, 2048, "fallocate allocated 1 MiB")
        try Syscall.fallocate(fd, Linux.FALLOC_FL_KEEP_SIZE, Int64(8 * mib), Int64(mib))
        XCTAssertEqual(try Syscall.fstat(fd).st_size, 4 * mib + 4096, "KEEP_SIZE does not grow the file")
        try Syscall.fallocate(fd, Linux.FALLOC_FL_PUNCH_HOLE | Linux.FALLOC_FL_KEEP_SIZE, Int64(4 * mib), 4096)
        var punched = [UInt8](repeating: 1, count: 4096)
        _ = try punched.withUnsafeMutableBytes { p in try Syscall.pread(fd, p.baseAddress!, 4096, Int64(4 * mib)) }
        XCTAssertEqual(punched, [UInt8](repeating: 0, count: 4096), "a punched hole reads as zeros")
    }

    func testOpenUnlinkedFileKeepsWorking() throws {
        let path = daemon.mnt("tmp")
        let fd = try Syscall.open(path, O_RDWR | O_CREAT, 0o600)
        defer { close(fd) }
        let data = bytes("still here after unlink")
        try data.withUnsafeBytes { p in try Syscall.pwriteAll(fd, p.baseAddress!, p.count, 0) }
        XCTAssertEqual(unlink(path), 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.back("tmp")))
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(path) }, ENOENT)
        try data.withUnsafeBytes { p in try Syscall.pwriteAll(fd, p.baseAddress!, p.count, Int64(data.count)) }
        XCTAssertEqual(fsync(fd), 0)
        XCTAssertEqual(try readAll(fd), data + data)
        let st = try Syscall.fstat(fd)
        XCTAssertEqual(st.st_nlink, 0)
        XCTAssertEqual(st.st_size, Int(data.count * 2))
        XCTAssertEqual(ftruncate(fd, 5), 0)
        XCTAssertEqual(try readAll(fd), bytes("still"))
    }

    func testCopyFileRangeAndSharedMmap() throws {
        let source = [UInt8]((0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try writeFile(daemon.mnt("src"), source)
        let input = try Syscall.open(daemon.mnt("src"), O_RDONLY)
        let output = try Syscall.open(daemon.mnt("dst"), O_RDWR | O_CREAT, 0o644)
        var inOffset: Int64 = 1000, outOffset: Int64 = 0
        var total = 0
        while total < 200_000 {
            let n = try Syscall.copyFileRange(input, &inOffset, output, &outOffset, 200_000 - total, 0)
            if n == 0 { break }
            total += n
        }
        close(input)
        XCTAssertEqual(total, 200_000)
        XCTAssertEqual(try readFile(daemon.back("dst")), Array(source[1000..<201_000]))

        // A shared writable mapping writes through to the backing file.
        let length = 8192
        guard let map = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, output, 0), map != MAP_FAILED else {
            close(output)
            return XCTFail("mmap: \(Errno.current)")
        }
        map.storeBytes(of: 0x5A, toByteOffset: 100, as: UInt8.self)
        map.storeBytes(of: 0xA5, toByteOffset: 5000, as: UInt8.self)
        XCTAssertEqual(msync(map, length, MS_SYNC), 0)
        munmap(map, length)
        close(output)
        let stored = try readFile(daemon.back("dst"))
        XCTAssertEqual(stored[100], 0x5A)
        XCTAssertEqual(stored[5000], 0xA5)
        XCTAssertEqual(stored[101], source[1101])
    }

    func testLargeRandomFileRoundTrip() throws {
        try mustRun(["dd", "if=/dev/urandom", "of=\(daemon.mnt("big"))", "bs=1M", "count=64", "status=none"])
        let mounted = try mustRun(["sha256sum", daemon.mnt("big")]).prefix(64)
        let stored = try mustRun(["sha256sum", daemon.back("big")]).prefix(64)
        XCTAssertEqual(mounted, stored)
        XCTAssertEqual(try Syscall.lstat(daemon.back("big")).st_size, 64 << 20)
        // Cold read: drop the page cache and read back through the mount.
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        XCTAssertEqual(try mustRun(["sha256sum", daemon.mnt("big")]).prefix(64), stored)
    }
}

/// A link's target as text (`readlinkat` answers it NUL-terminated).
private func linkText(_ target: [CChar]) -> String {
    String(decoding: target.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
