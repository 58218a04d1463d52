@testable import CustodySystem
import Glibc
import XCTest

final class SyscallTests: TemporaryDirectoryTestCase {
    func testErrnoCarriesNumberAndMessage() {
        XCTAssertEqual(Errno.noSuchFile.rawValue, ENOENT)
        XCTAssertTrue(Errno.noSuchFile.description.contains("No such file"))
        XCTAssertTrue(Errno.noSuchFile.description.contains("errno 2"))
    }

    func testValueOrErrnoThrowsCurrentErrno() {
        XCTAssertThrowsError(try Syscall.open(directory + "/missing", O_RDONLY)) { error in
            XCTAssertEqual(error as? Errno, .noSuchFile)
        }
        XCTAssertEqual(try valueOrErrno(Int32(5)), 5)
    }

    func testPreadAllStopsAtTheEndOfTheFile() throws {
        let bytes = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let fd = try Syscall.open(directory + "/data", O_RDWR | O_CREAT, 0o600)
        defer { close(fd) }
        try Syscall.pwriteAll(fd, bytes, bytes.count, 0)
        var buffer = [UInt8](repeating: 0xAA, count: 16_384)
        XCTAssertEqual(try Syscall.preadAll(fd, &buffer, buffer.count, 0), 10_000)
        XCTAssertEqual(Array(buffer[0..<10_000]), bytes)
        XCTAssertEqual(buffer[10_000], 0xAA, "nothing is written past what was read")
        XCTAssertEqual(try Syscall.preadAll(fd, &buffer, buffer.count, 9_000), 1_000)
        XCTAssertEqual(Array(buffer[0..<1_000]), Array(bytes[9_000...]))
        XCTAssertEqual(try Syscall.preadAll(fd, &buffer, 100, 20_000), 0)
        XCTAssertThrowsError(try Syscall.preadAll(-1, &buffer, 1, 0)) { XCTAssertEqual($0 as? Errno, Errno(EBADF)) }
    }

    func testRenameFlags() throws {
        let dir = try Syscall.open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(dir) }
        for (name, text) in [("a", "A"), ("b", "B")] {
            let fd = try Syscall.openat(dir, name, O_WRONLY | O_CREAT, 0o644)
            try Syscall.pwriteAll(fd, text, 1, 0)
            close(fd)
        }
        XCTAssertThrowsError(try Syscall.renameat2(dir, "a", dir, "b", Linux.RENAME_NOREPLACE)) {
            XCTAssertEqual($0 as? Errno, .exists)
        }
        try Syscall.renameat2(dir, "a", dir, "b", Linux.RENAME_EXCHANGE)
        var byte: UInt8 = 0
        let fd = try Syscall.openat(dir, "a", O_RDONLY)
        XCTAssertEqual(try Syscall.pread(fd, &byte, 1, 0), 1)
        close(fd)
        XCTAssertEqual(byte, UInt8(ascii: "B"))
    }

    func testReadlinkGrowsItsBuffer() throws {
        let target = String(repeating: "abc/", count: 300)
        XCTAssertEqual(symlink(target, directory + "/l"), 0)
        XCTAssertEqual(String(cString: try Syscall.readlinkat(AT_FDCWD, directory + "/l")), target)
    }

    /// An attribute by directory and name: the same answers with `getxattrat` and through /proc,
    /// and a symlink's own attributes, never its target's.
    func testExtendedAttributeInADirectory() throws {
        let file = directory + "/file"
        let fd = open(file, O_CREAT | O_WRONLY, 0o644)
        XCTAssertGreaterThanOrEqual(fd, 0)
        close(fd)
        try Syscall.setxattr(file, "user.k", "value", 5, 0)
        XCTAssertEqual(symlink("file", directory + "/link"), 0)
        let dir = open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(dir) }
        defer { Syscall.noGetxattrat.store(false, ordering: .relaxed) }
        for throughProc in [false, true] {
            Syscall.noGetxattrat.store(throughProc, ordering: .relaxed)
            var buffer = [UInt8](repeating: 0, count: 16)
            XCTAssertEqual(try Syscall.getxattr(in: dir, "file", "user.k", &buffer, buffer.count), 5, "through /proc: \(throughProc)")
            XCTAssertEqual(Array(buffer.prefix(5)), Array("value".utf8))
            XCTAssertEqual(try Syscall.getxattr(in: dir, "file", "user.k", nil, 0), 5, "the size alone")
            XCTAssertThrowsError(try Syscall.getxattr(in: dir, "file", "user.none", &buffer, buffer.count)) { XCTAssertEqual($0 as? Errno, .noData) }
            XCTAssertThrowsError(try Syscall.getxattr(in: dir, "link", "user.k", &buffer, buffer.count)) { XCTAssertEqual($0 as? Errno, .noData, "the link's own") }
            XCTAssertThrowsError(try Syscall.getxattr(in: dir, "missing", "user.k", &buffer, buffer.count)) { XCTAssertEqual($0 as? Errno, .noSuchFile) }
            XCTAssertThrowsError(try Syscall.getxattr(in: dir, "file", "user.k", &buffer, 2)) { XCTAssertEqual($0 as? Errno, .rangeError) }
            if !throughProc, Self.kernelVersion.lexicographicallyPrecedes([6, 13]) == false {
                XCTAssertFalse(Syscall.noGetxattrat.load(ordering: .relaxed), "getxattrat is used where the kernel has it")
            }
        }
    }

    /// Setting an attribute by name in a directory: one call where the kernel has `setxattrat`;
    /// the flags hold, a symlink's own attributes are set (not its target's), and where the call
    /// is missing the answer says so and nothing is set.
    func testSettingAnAttributeByNameInADirectory() throws {
        let file = directory + "/set"
        let fd = open(file, O_CREAT | O_WRONLY, 0o644)
        XCTAssertGreaterThanOrEqual(fd, 0)
        close(fd)
        XCTAssertEqual(symlink("set", directory + "/set-link"), 0)
        let dir = open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(dir) }
        defer { Syscall.noSetxattrat.store(false, ordering: .relaxed) }
        guard Self.kernelVersion.lexicographicallyPrecedes([6, 13]) == false else { return }
        XCTAssertTrue(try Syscall.setxattr(in: dir, "set", "user.k", "value", 5, Linux.XATTR_CREATE))
        var buffer = [UInt8](repeating: 0, count: 16)
        XCTAssertEqual(try Syscall.getxattr(file, "user.k", &buffer, buffer.count), 5)
        XCTAssertEqual(Array(buffer.prefix(5)), Array("value".utf8))
        XCTAssertThrowsError(try Syscall.setxattr(in: dir, "set", "user.k", "again", 5, Linux.XATTR_CREATE)) { XCTAssertEqual($0 as? Errno, .exists) }
        XCTAssertThrowsError(try Syscall.setxattr(in: dir, "set", "user.none", "x", 1, Linux.XATTR_REPLACE)) { XCTAssertEqual($0 as? Errno, .noData) }
        XCTAssertThrowsError(try Syscall.setxattr(in: dir, "missing", "user.k", "x", 1, 0)) { XCTAssertEqual($0 as? Errno, .noSuchFile) }
        // A symlink's own: user attributes are not allowed on symlinks (EPERM, which answers false:
        // the caller's other way reports it), and the target is untouched.
        XCTAssertFalse(try Syscall.setxattr(in: dir, "set-link", "user.other", "x", 1, 0))
        XCTAssertThrowsError(try Syscall.getxattr(file, "user.other", &buffer, buffer.count)) { XCTAssertEqual($0 as? Errno, .noData) }
        XCTAssertFalse(Syscall.noSetxattrat.load(ordering: .relaxed), "setxattrat is used where the kernel has it")
        // Where it is missing: false, nothing set.
        Syscall.noSetxattrat.store(true, ordering: .relaxed)
        XCTAssertFalse(try Syscall.setxattr(in: dir, "set", "user.later", "x", 1, 0))
        XCTAssertThrowsError(try Syscall.getxattr(file, "user.later", &buffer, buffer.count)) { XCTAssertEqual($0 as? Errno, .noData) }
    }

    /// An attribute by name, only while the name still leads to the object asked about: after a
    /// rename puts another file under the name, or removes it, the answer is nil (ask by /proc),
    /// never the other file's attribute or its "no such attribute".
    func testExtendedAttributeByNameIfStillTheSameObject() throws {
        for (name, value) in [("a", "first"), ("b", "other")] {
            let fd = open(directory + "/" + name, O_CREAT | O_WRONLY, 0o644)
            XCTAssertGreaterThanOrEqual(fd, 0)
            close(fd)
            try Syscall.setxattr(directory + "/" + name, "user.k", value, value.utf8.count, 0)
        }
        try Syscall.setxattr(directory + "/b", "user.only-b", "x", 1, 0)
        let dir = open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(dir) }
        let a = try Syscall.fstatat(dir, "a", AT_SYMLINK_NOFOLLOW)
        let (device, number) = (UInt64(a.st_dev), UInt64(a.st_ino))
        var buffer = [UInt8](repeating: 0, count: 16)
        let expectsCall = Self.kernelVersion.lexicographicallyPrecedes([6, 13]) == false
        let found = try Syscall.getxattr(in: dir, "a", ifStill: device, number, "user.k", &buffer, buffer.count)
        if expectsCall {
            XCTAssertEqual(found, 5)
            XCTAssertEqual(Array(buffer.prefix(5)), Array("first".utf8))
            XCTAssertThrowsError(try Syscall.getxattr(in: dir, "a", ifStill: device, number, "user.only-b", &buffer, buffer.count)) {
                XCTAssertEqual($0 as? Errno, .noData)
            }
        } else {
            XCTAssertNil(found, "no getxattrat: ask by /proc")
        }
        // Another file under the name: neither its value nor its absent attribute is returned.
        XCTAssertEqual(rename(directory + "/a", directory + "/c"), 0)
        XCTAssertEqual(rename(directory + "/b", directory + "/a"), 0)
        XCTAssertNil(try Syscall.getxattr(in: dir, "a", ifStill: device, number, "user.k", &buffer, buffer.count))
        XCTAssertNil(try Syscall.getxattr(in: dir, "a", ifStill: device, number, "user.none", &buffer, buffer.count))
        // The name is gone.
        XCTAssertNil(try Syscall.getxattr(in: dir, "b", ifStill: device, number, "user.k", &buffer, buffer.count))
    }

    /// Mode and times of what an O_PATH descriptor refers to, with the one-call forms and through
    /// /proc.
    func testModeAndTimesThroughPathDescriptor() throws {
        let file = directory + "/file"
        let created = open(file, O_CREAT | O_WRONLY, 0o600)
        XCTAssertGreaterThanOrEqual(created, 0)
        close(created)
        let fd = try Syscall.open(file, Linux.O_PATH | O_NOFOLLOW)
        defer { close(fd) }
        defer { Syscall.noFchmodat2.store(false, ordering: .relaxed) }
        for (index, throughProc) in [false, true].enumerated() {
            Syscall.noFchmodat2.store(throughProc, ordering: .relaxed)
            let mode: mode_t = throughProc ? 0o640 : 0o604
            try Syscall.chmod(of: fd, mode)
            XCTAssertEqual(try Syscall.fstatat(AT_FDCWD, file, 0).st_mode & 0o7777, mode, "through /proc: \(throughProc)")
            let seconds = 1_000_000 + index
            try Syscall.utimens(of: fd, [timespec(tv_sec: seconds, tv_nsec: 5), timespec(tv_sec: seconds + 1, tv_nsec: 7)])
            let st = try Syscall.fstatat(AT_FDCWD, file, 0)
            XCTAssertEqual(st.st_atim.tv_sec, seconds)
            XCTAssertEqual(st.st_mtim.tv_sec, seconds + 1)
            XCTAssertEqual(st.st_mtim.tv_nsec, 7)
        }
        if Self.kernelVersion.lexicographicallyPrecedes([6, 6]) == false {
            Syscall.noFchmodat2.store(false, ordering: .relaxed)
            try Syscall.chmod(of: fd, 0o644)
            XCTAssertFalse(Syscall.noFchmodat2.load(ordering: .relaxed), "fchmodat2 is used where the kernel has it")
        }
    }

    /// The running kernel's major and minor version.
    static var kernelVersion: [Int] {
        var name = utsname()
        uname(&name)
        let release = withUnsafeBytes(of: name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return release.split(separator: ".").prefix(2).map { Int($0.prefix { $0.isNumber }) ?? 0 }
    }

    func testStatOfPathDescriptorAndProcPath() throws {
        XCTAssertEqual(mkdir(directory + "/d", 0o700), 0)
        let fd = try Syscall.open(directory + "/d", Linux.O_PATH | O_DIRECTORY)
        defer { close(fd) }
        XCTAssertEqual(try Syscall.stat(of: fd).st_mode & S_IFMT, S_IFDIR)
        XCTAssertEqual(resolvedPath(Syscall.procPath(fd)), resolvedPath(directory + "/d"))
    }

    func testExtendedAttributeRoundTrip() throws {
        let path = directory + "/x"
        close(try Syscall.open(path, O_WRONLY | O_CREAT, 0o644))
        try Syscall.setxattr(path, "user.k", "v1", 2, 0)
        var buffer = [UInt8](repeating: 0, count: 8)
        XCTAssertEqual(try Syscall.getxattr(path, "user.k", &buffer, 8), 2)
        XCTAssertEqual(Array(buffer[0..<2]), Array("v1".utf8))
        XCTAssertGreaterThan(try Syscall.listxattr(path, nil, 0), 0)
        try Syscall.removexattr(path, "user.k")
        XCTAssertThrowsError(try Syscall.getxattr(path, "user.k", nil, 0)) { XCTAssertEqual($0 as? Errno, .noData) }
    }
}

final class MountTableTests: XCTestCase {
    func testUnescapesOctalSequences() {
        XCTAssertEqual(MountTable.unescape("/tmp/with\\040space"), "/tmp/with space")
        XCTAssertEqual(MountTable.unescape("/a\\134b\\011c"), "/a\\b\tc")
        XCTAssertEqual(MountTable.unescape("/plain"), "/plain")
        XCTAssertEqual(MountTable.unescape("/trailing\\04"), "/trailing\\04", "an incomplete escape stays as it is")
    }

    func testFindsTheRootMount() {
        let entries = MountTable.entries()
        XCTAssertFalse(entries.isEmpty)
        XCTAssertNotNil(MountTable.entry(at: "/"))
        XCTAssertNotNil(MountTable.entry(at: "/proc"))
        XCTAssertNil(MountTable.entry(at: "/surely/not/a/mount/point"))
    }
}
