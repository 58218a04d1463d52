@testable import CustodySystem
import Glibc
import XCTest

final class SyscallTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        var template = Array("/tmp/custody-sys.XXXXXX".utf8CString)
        directory = String(cString: try XCTUnwrap(mkdtemp(&template)))
    }

    override func tearDown() {
        _ = system("rm -rf '\(directory)'")
    }

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
