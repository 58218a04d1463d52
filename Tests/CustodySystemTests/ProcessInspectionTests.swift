@testable import CustodySystem
import Foundation
import Glibc
import XCTest

/// What the daemon reads about a process's program, and which paths only root controls.
final class ProcessInspectionTests: TemporaryDirectoryTestCase {
    func testInspectingAProcessOfTheDaemonsOwn() throws {
        let program = try XCTUnwrap(RunningProgram.inspect(getpid()))
        var attributes = stat()
        XCTAssertEqual(stat("/proc/self/exe", &attributes), 0)
        XCTAssertEqual(program.file, FileIdentity(attributes))
        XCTAssertEqual(program.path, try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
        XCTAssertTrue(program.sharesNamespaces)
        XCTAssertEqual(program.tracer, 0)
        let mappings = try XCTUnwrap(program.executableMappings)
        XCTAssertTrue(mappings.contains { $0.file == program.file }, "the program itself is mapped")
        XCTAssertGreaterThan(mappings.count, 2, "and the loader and libc")
        XCTAssertNil(RunningProgram.inspect(0))
        XCTAssertNil(RunningProgram.inspect(Int32.max))
    }

    func testOnlyExecutableMappingsOfFilesCount() {
        let maps = """
            55d0c0000000-55d0c0002000 r--p 00000000 fe:01 123 /usr/bin/md5sum
            55d0c0002000-55d0c0006000 r-xp 00002000 fe:01 123 /usr/bin/md5sum
            7f0000000000-7f0000001000 rwxp 00000000 00:00 0
            7f0000100000-7f0000120000 r-xp 00028000 fe:01 456 /tmp/evil (deleted)
            7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
            garbage
            """
        XCTAssertEqual(RunningProgram.executableFileRanges(inMaps: maps), ["55d0c0002000-55d0c0006000", "7f0000100000-7f0000120000"])
    }

    func testPathsOnlyRootControls() throws {
        XCTAssertEqual(chmod(directory, 0o755), 0)
        let file = directory + "/program"
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data([0x7f])))
        XCTAssertEqual(chmod(file, 0o755), 0)
        var attributes = stat()
        XCTAssertEqual(stat(file, &attributes), 0)
        guard case .success(let resolved) = RootControlledPath.resolve(file) else { return XCTFail() }
        XCTAssertEqual(resolved.path, file)
        XCTAssertEqual(resolved.file, FileIdentity(attributes))
        // Through symlinks (relative, absolute) and dot-dot.
        XCTAssertEqual(symlink("program", directory + "/relative"), 0)
        XCTAssertEqual(symlink(directory + "/relative", directory + "/absolute"), 0)
        XCTAssertEqual(mkdir(directory + "/sub", 0o755), 0)
        for path in [directory + "/relative", directory + "/absolute", directory + "/sub/../program", directory + "//./program"] {
            guard case .success(let through) = RootControlledPath.resolve(path) else { return XCTFail(path) }
            XCTAssertEqual(through.path, file, path)
        }
        // /tmp is sticky: its root-owned entries are safe.
        XCTAssertTrue(directory.hasPrefix("/tmp/"))
        // What others could change.
        XCTAssertEqual(chmod(file, 0o775), 0)
        XCTAssertEqual(RootControlledPath.resolve(file), .failure(.changeable(file, "writable by its group or others")))
        XCTAssertEqual(chmod(file, 0o755), 0)
        XCTAssertEqual(chown(file, 1000, 1000), 0)
        XCTAssertEqual(RootControlledPath.resolve(file), .failure(.changeable(file, "owned by uid 1000")))
        XCTAssertEqual(chown(file, 0, 0), 0)
        XCTAssertEqual(lchown(directory + "/relative", 1000, 1000), 0)
        XCTAssertEqual(RootControlledPath.resolve(directory + "/absolute"),
                       .failure(.changeable(directory + "/relative", "a symlink owned by uid 1000")))
        XCTAssertEqual(chmod(directory, 0o777), 0)
        XCTAssertEqual(RootControlledPath.resolve(file), .failure(.changeable(directory, "a directory writable by its group or others")))
        XCTAssertEqual(chmod(directory, 0o755), 0)
        // Not there, not a file, not absolute, too many links.
        XCTAssertEqual(RootControlledPath.resolve(directory + "/missing"), .failure(.missing(directory + "/missing")))
        XCTAssertEqual(RootControlledPath.resolve(directory + "/sub"), .failure(.notRegularFile(directory + "/sub")))
        XCTAssertEqual(RootControlledPath.resolve(directory + "/program/x"), .failure(.missing(directory + "/program/x")))
        XCTAssertEqual(RootControlledPath.resolve("program"), .failure(.notAbsolute))
        XCTAssertEqual(symlink("loop", directory + "/loop"), 0)
        XCTAssertEqual(RootControlledPath.resolve(directory + "/loop"), .failure(.missing(directory + "/loop")))
    }
}
