import CustodySystem
import Foundation
import Glibc
import XCTest

/// One backing directory served by two daemons at once (`--shared-store`), each with its own
/// state (its own machine key, its own keybag for alice, whose keys the second imported from the
/// first), as two hosts serve one NFS export. Each step changes the store through one mount and
/// reads it through the other right away, after the other has looked at the same thing: nothing
/// the reading mount cached (names, missing names, listings, file pages and sizes, a
/// directory's lack of a tweak, an owner) may answer for what the store holds now.
final class SharedStoreTests: HostsTestCase {
    override var hostArguments: [String] { Self.baseArguments + ["--shared-store"] }

    /// Two daemons on one backing directory; alice enrolled on the first (her policy lets her
    /// files become personal ones) and carried to the second.
    private func twoHosts() throws -> (MountedDaemon, MountedDaemon) {
        let first = try host()
        let second = try host(sharingStoreOf: first)
        let enrolled = try first.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "\#(Self.alice)", "policy": {"protectionLevel": "untilFirstAuth", "sendToOtherIdentities": "all"}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        let key = try XCTUnwrap(try second.apiJSON("GET", "/v1/host-key").json["publicKey"] as? String)
        let export = try first.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(key)"}"#)
        XCTAssertEqual(export.status, 200, export.body)
        let imported = try second.api("POST", "/v1/identities/import", #"{"export": \#(export.body)}"#)
        XCTAssertEqual(imported.status, 201, imported.body)
        return (first, second)
    }

    private func text(_ path: String) throws -> String { String(decoding: try readFile(path), as: UTF8.self) }

    private func append(_ path: String, _ text: String) throws {
        try writeFile(path, bytes(text), flags: O_WRONLY | O_APPEND)
    }

    private func listing(_ path: String) throws -> Set<String> {
        Set(try FileManager.default.contentsOfDirectory(atPath: path))
    }

    func testWhatOneHostWritesAndClosesTheOtherReadsAtItsNextOpen() throws {
        let (first, second) = try twoHosts()
        XCTAssertEqual(mkdir(first.mnt("Project Falcon"), 0o755), 0)
        try writeFile(first.mnt("Project Falcon/plan.txt"), bytes("first draft"))
        XCTAssertEqual(try text(second.mnt("Project Falcon/plan.txt")), "first draft")
        // The name and the content are alice's on the store, whichever host wrote them.
        XCTAssertEqual(xattr(second.mnt("Project Falcon/plan.txt"), "user.custody.encrypted"), "1")
        XCTAssertFalse(try listing(first.backing).contains("Project Falcon"), "the directory's name is stored encrypted")
        let info = try second.apiJSON("POST", "/v1/files/info", #"{"path": "\#(second.mnt("Project Falcon/plan.txt"))"}"#)
        XCTAssertEqual(info.json["owner"] as? String, Self.alice, "\(info.json)")
        XCTAssertEqual(info.json["size"] as? Int, 11, "\(info.json)")

        // Read on the first host (its pages cached), rewritten longer on the second, read again.
        XCTAssertEqual(try text(first.mnt("Project Falcon/plan.txt")), "first draft")
        try writeFile(second.mnt("Project Falcon/plan.txt"), bytes("second draft, longer than the first"))
        XCTAssertEqual(try text(first.mnt("Project Falcon/plan.txt")), "second draft, longer than the first")
        // Appended on the first host, read on the second, which knew the shorter size.
        try append(first.mnt("Project Falcon/plan.txt"), "; appended")
        XCTAssertEqual(try text(second.mnt("Project Falcon/plan.txt")), "second draft, longer than the first; appended")
        // Cut shorter on the second host: the first reads no stale tail.
        XCTAssertEqual(truncate(second.mnt("Project Falcon/plan.txt"), 6), 0)
        XCTAssertEqual(try text(first.mnt("Project Falcon/plan.txt")), "second")

        // A file with a hole, written on the first host: the second reads the zeros and the end,
        // its size the same (the hole record travels with the file).
        let sparse = first.mnt("Project Falcon/sparse.bin")
        let fd = try Syscall.open(sparse, O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        XCTAssertEqual(bytes("tail").withUnsafeBytes { pwrite(fd, $0.baseAddress, 4, 1 << 20) }, 4)
        close(fd)
        let read = try readFile(second.mnt("Project Falcon/sparse.bin"))
        XCTAssertEqual(read.count, (1 << 20) + 4)
        XCTAssertTrue(read.prefix(1 << 20).allSatisfy { $0 == 0 })
        XCTAssertEqual(Array(read.suffix(4)), bytes("tail"))
    }

    func testNamesChangedOnOneHostAreFoundOnTheOtherAtOnce() throws {
        let (first, second) = try twoHosts()
        // A directory the first host made (it would know every name it stored there).
        XCTAssertEqual(mkdir(first.mnt("Team"), 0o755), 0)
        try writeFile(first.mnt("Team/agenda.txt"), bytes("agenda"))
        XCTAssertEqual(try listing(first.mnt("Team")), ["agenda.txt"])
        // Looked for on the first host before it exists (a missing name, cached elsewhere).
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(first.mnt("Team/notes.txt")) }, ENOENT)

        try writeFile(second.mnt("Team/notes.txt"), bytes("notes from the second host"))
        XCTAssertEqual(try text(first.mnt("Team/notes.txt")), "notes from the second host")
        XCTAssertEqual(try listing(first.mnt("Team")), ["agenda.txt", "notes.txt"])

        // Renamed on the second host: the first finds the new name and not the old.
        XCTAssertEqual(rename(second.mnt("Team/notes.txt"), second.mnt("Team/minutes.txt")), 0)
        XCTAssertEqual(errnoOf { _ = try readFile(first.mnt("Team/notes.txt")) }, ENOENT)
        XCTAssertEqual(try text(first.mnt("Team/minutes.txt")), "notes from the second host")
        XCTAssertEqual(try listing(first.mnt("Team")), ["agenda.txt", "minutes.txt"])

        // Removed on the first host, and another file made under the old name on the second.
        XCTAssertEqual(unlink(first.mnt("Team/minutes.txt")), 0)
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(second.mnt("Team/minutes.txt")) }, ENOENT)
        try writeFile(second.mnt("Team/minutes.txt"), bytes("new minutes"))
        XCTAssertEqual(try text(first.mnt("Team/minutes.txt")), "new minutes")

        // A directory with no tweak yet (nothing encrypted in it): the first host looks a name
        // up there, then the second stores the first encrypted name in it, making the tweak.
        XCTAssertEqual(mkdir(first.backing + "/inbox", 0o755), 0)
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(first.mnt("inbox/report.txt")) }, ENOENT)
        try writeFile(second.mnt("inbox/report.txt"), bytes("report"))
        XCTAssertNotNil(xattr(first.backing + "/inbox", "trusted.custody.dirid"), "the second host made the tweak")
        XCTAssertFalse(try listing(first.backing + "/inbox").contains("report.txt"), "stored encrypted")
        XCTAssertEqual(try text(first.mnt("inbox/report.txt")), "report")

        // A whole directory removed on the second host and made again on the first.
        XCTAssertEqual(unlink(second.mnt("Team/agenda.txt")), 0)
        XCTAssertEqual(unlink(second.mnt("Team/minutes.txt")), 0)
        XCTAssertEqual(rmdir(second.mnt("Team")), 0)
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(first.mnt("Team")) }, ENOENT)
        XCTAssertEqual(mkdir(first.mnt("Team"), 0o755), 0)
        try writeFile(first.mnt("Team/again.txt"), bytes("again"))
        XCTAssertEqual(try listing(second.mnt("Team")), ["again.txt"])
        XCTAssertEqual(try text(second.mnt("Team/again.txt")), "again")
    }

    func testAnOwnerChangedInPlaceOnOneHostIsReadOnTheOther() throws {
        let (first, second) = try twoHosts()
        // A file with no owner, put in the store directly: both hosts serve it plain.
        try writeFile(first.backing + "/handout.txt", bytes("plain handout"))
        XCTAssertEqual(try text(first.mnt("handout.txt")), "plain handout")
        XCTAssertEqual(try text(second.mnt("handout.txt")), "plain handout")
        XCTAssertEqual(xattr(first.mnt("handout.txt"), "user.custody.encrypted"), "0")

        // Opened with truncation on the second host by alice's default identity: the file becomes
        // hers, encrypted in place (same inode), its name stored in her form.
        try writeFile(second.mnt("handout.txt"), bytes("alice's handout"))
        XCTAssertFalse(try listing(first.backing).contains("handout.txt"), "renamed into alice's form")
        XCTAssertNotEqual(try readFile(first.backing + "/" + (try listing(first.backing).first { $0.hasPrefix("~c3") } ?? "")), bytes("alice's handout"))
        // The first host, which knew the file as plain, reads alice's content, not the header.
        XCTAssertEqual(try text(first.mnt("handout.txt")), "alice's handout")
        XCTAssertEqual(xattr(first.mnt("handout.txt"), "user.custody.encrypted"), "1")

        // Decrypted in place on the first host (the owner removed): the second reads it plain.
        let decrypted = try first.api("POST", "/v1/files/decrypt", #"{"path": "\#(first.mnt("handout.txt"))"}"#)
        XCTAssertEqual(decrypted.status, 200, decrypted.body)
        XCTAssertEqual(try text(second.mnt("handout.txt")), "alice's handout")
        XCTAssertEqual(xattr(second.mnt("handout.txt"), "user.custody.encrypted"), "0")
        XCTAssertEqual(try readFile(first.backing + "/handout.txt"), bytes("alice's handout"), "stored plain under its plain name")
    }

    /// A wipe on one host deletes alice's files from the store both serve (docs/wipe.md): the
    /// other host shows them gone at once, keeps its own keys, and still opens a copy taken before.
    func testAWipeOnOneHostEmptiesTheStoreForBoth() throws {
        let (first, second) = try twoHosts()
        XCTAssertEqual(mkdir(first.mnt("Deal"), 0o755), 0)
        try writeFile(first.mnt("Deal/terms.txt"), bytes("terms"))
        try writeFile(second.backing + "/personal.txt", bytes("nobody's"))
        XCTAssertEqual(try listing(second.mnt("Deal")), ["terms.txt"])
        let copy = first.root + "/terms-copy"
        _ = try mustRun(["cp", first.back("Deal/terms.txt"), copy])

        let wiped = try first.api("POST", "/v1/accounts/\(Self.alice)/wipe")
        XCTAssertEqual(wiped.status, 200, wiped.body)
        XCTAssertEqual(try listing(second.mountPoint).filter { !$0.hasPrefix(".") }, ["personal.txt"])
        XCTAssertEqual(errnoOf { _ = try readFile(second.mnt("Deal/terms.txt")) }, ENOENT)
        XCTAssertEqual(try text(second.mnt("personal.txt")), "nobody's")
        XCTAssertEqual(try second.api("GET", "/v1/accounts/\(Self.alice)").status, 200, "the second host keeps its keys")
        let opened = try second.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copy)", "copyPath": "\#(copy).txt"}"#)
        XCTAssertEqual(opened.status, 200, "\(opened.json)")
        XCTAssertEqual(try text(copy + ".txt"), "terms")
    }
}
