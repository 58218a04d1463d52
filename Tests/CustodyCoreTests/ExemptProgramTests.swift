@testable import CustodyCore
import CustodySystem
import Foundation
import XCTest
import CustodyTestSupport

/// Which processes are the exempt program: each way a process might pass for it fails, with a
/// reason; the genuine program passes, also after an upgrade replaced its file.
final class ExemptProgramTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-exempt").path
        XCTAssertEqual(chmod(directory, 0o755), 0)
    }

    override func tearDown() { TemporaryDirectory.removeTree(directory) }

    /// Copies /usr/bin/md5sum to `name` in the temporary directory (root's, like the directory).
    func install(_ name: String) throws -> String {
        let path = directory + "/" + name
        try? FileManager.default.removeItem(atPath: path)
        try FileManager.default.copyItem(atPath: "/usr/bin/md5sum", toPath: path)
        XCTAssertEqual(chmod(path, 0o755), 0)
        return path
    }

    func testTheGenuineProgramIsExempt() throws {
        let path = try install("agent")
        XCTAssertEqual(ExemptPrograms.match(program(path), among: ["/usr/bin/sha1sum", path]), .exempt(path))
        // Named through a symlink that root owns: the real path counts.
        XCTAssertEqual(symlink(path, directory + "/link"), 0)
        XCTAssertEqual(ExemptPrograms.match(program(path), among: [directory + "/link"]), .exempt(path))
        XCTAssertEqual(ExemptPrograms.match(program("/usr/bin/cat"), among: [path]), .none, "another program")
    }

    func testEachWayOfPassingForItFails() throws {
        let path = try install("agent")
        func refused(_ faked: RunningProgram, _ expected: String, file: StaticString = #filePath, line: UInt = #line) {
            guard case .impostor(let why) = ExemptPrograms.match(faked, among: [path]) else {
                return XCTFail("not refused: \(ExemptPrograms.match(faked, among: [path]))", file: file, line: line)
            }
            XCTAssertTrue(why.contains(expected), why, file: file, line: line)
        }
        // Another program bind-mounted over the path in a namespace of the caller's own.
        var bound = program("/usr/bin/cat")
        bound.path = path
        bound.sharesNamespaces = false
        refused(bound, "namespace of its own")
        // The same file run from another namespace.
        var elsewhere = program(path)
        elsewhere.sharesNamespaces = false
        refused(elsewhere, "namespace of its own")
        // A hard link elsewhere: the same file under another name.
        XCTAssertEqual(link(path, directory + "/other-name"), 0)
        var linked = program(path)
        linked.path = directory + "/other-name"
        refused(linked, "under another name")
        // The path leads to another file than the one running (replaced meanwhile, or faked).
        var replaced = program("/usr/bin/cat")
        replaced.path = path
        refused(replaced, "is not the file")
        // Traced, or with a library only its owner may change (LD_PRELOAD), or unreadable maps.
        var traced = program(path)
        traced.tracer = 4242
        refused(traced, "traced by process 4242")
        var preloaded = program(path)
        preloaded.executableMappings?.append(MappedFile(file: FileIdentity(device: 1, inode: 99), owner: 1000, mode: 0o100644))
        refused(preloaded, "preloaded library")
        var writable = program(path)
        writable.executableMappings?.append(MappedFile(file: FileIdentity(device: 1, inode: 98), owner: 0, mode: 0o100666))
        refused(writable, "preloaded library")
        var unreadable = program(path)
        unreadable.executableMappings = nil
        refused(unreadable, "cannot be read")
        // A copy elsewhere is just another program.
        let copy = try install("copy")
        XCTAssertEqual(ExemptPrograms.match(program(copy), among: [path]), .none)
    }

    /// An exemption by a path others can redirect holds for nobody.
    func testAPathOthersCanRedirectExemptsNobody() throws {
        let path = try install("agent")
        XCTAssertEqual(chown(directory, 1000, 1000), 0)
        guard case .impostor(let why) = ExemptPrograms.match(program(path), among: [path]) else { return XCTFail() }
        XCTAssertTrue(why.contains("owned by uid 1000"), why)
        XCTAssertEqual(chown(directory, 0, 0), 0)
        XCTAssertEqual(chmod(path, 0o757), 0)
        guard case .impostor(let writable) = ExemptPrograms.match(program(path), among: [path]) else { return XCTFail() }
        XCTAssertTrue(writable.contains("writable by its group or others"), writable)
    }

    /// An upgrade replaces the program's file (a new inode under the same name): the exemption
    /// follows the path; the old process, still running the removed file, is not it any more.
    func testAnUpgradeMovesTheExemptionToTheNewFile() throws {
        let path = try install("agent")
        let old = program(path)
        // As a package manager does: the new file beside the old, renamed over it.
        let upgraded = try install("agent.new")
        XCTAssertEqual(rename(upgraded, path), 0)
        XCTAssertNotEqual(program(path).file, old.file)
        XCTAssertEqual(ExemptPrograms.match(program(path), among: [path]), .exempt(path))
        guard case .impostor = ExemptPrograms.match(old, among: [path]) else { return XCTFail("the old file is not exempt") }
    }
}
