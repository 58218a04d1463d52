import CustodySystem
import Foundation
import Glibc
import XCTest

/// `custodyctl identity rotate` on a real mount: alice's tree (files, a directory in a
/// directory, a symlink, a personal file among hers) is brought to her new keys in the
/// background, a copy taken before still opens, and a host that had her keys before the
/// rotation opens what she writes after it only once it imported the new ones.
final class KeyRotationMountTests: HostsTestCase {
    /// alice's export from `first`, sealed to `second`.
    private func export(from first: MountedDaemon, to second: MountedDaemon) throws -> String {
        let key = try XCTUnwrap(try second.apiJSON("GET", "/v1/host-key").json["publicKey"] as? String)
        let export = try first.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(key)"}"#)
        XCTAssertEqual(export.status, 200, export.body)
        return export.body
    }

    private func carryAlice(from first: MountedDaemon, to second: MountedDaemon) throws -> (status: Int, json: [String: Any]) {
        try second.apiJSON("POST", "/v1/identities/import", #"{"export": \#(try export(from: first, to: second))}"#)
    }

    /// Every stored name below `directory` (relative), and the key tags of those encrypted.
    private func storedTree(_ directory: String) throws -> (names: Set<String>, tags: Set<String>) {
        let names = Set(try mustRun(["find", directory, "-mindepth", "1", "-printf", "%P\n"]).split(separator: "\n").map(String.init))
        var tags = Set<String>()
        for path in names {
            for part in path.split(separator: "/") where part.hasPrefix("~c3") { tags.insert(String(part.dropFirst(3).prefix(6))) }
        }
        return (names, tags)
    }

    private func rawAttribute(_ path: String, _ name: String) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 512)
        guard let count = try? Syscall.lgetxattr(path, name, &buffer, buffer.count) else { return nil }
        return Array(buffer[0..<count])
    }

    private func waitUntilBroughtOver(_ daemon: MountedDaemon) throws {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if try daemon.apiJSON("GET", "/v1/accounts/alice-oid").json["reprotectPending"] as? Bool == false { return }
            usleep(50_000)
        }
        XCTFail("alice's files were not brought to her new keys within 30 s: \(daemon.log)")
    }

    func testATreeIsBroughtToTheNewKeysAndTheOtherHostFollowsByImport() throws {
        let first = try host(), second = try host()
        let enrolled = try first.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "\#(Self.alice)", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        XCTAssertEqual(try carryAlice(from: first, to: second).status, 201)
        let outside = try scratchDirectory("rotation")

        XCTAssertEqual(mkdir(first.mnt("Falcon"), 0o755), 0)
        XCTAssertEqual(mkdir(first.mnt("Falcon/deep"), 0o755), 0)
        try writeFile(first.mnt("Falcon/plan.txt"), bytes("the plan"))
        try writeFile(first.mnt("Falcon/deep/notes.txt"), bytes(String(repeating: "notes ", count: 3000)))
        XCTAssertEqual(symlink("plan.txt", first.mnt("Falcon/link")), 0)
        // A personal file among hers (no owner), put in the store directly.
        let falconStored = first.back("Falcon")
        try writeFile(falconStored + "/handout.txt", bytes("nobody's"))
        let plan = first.back("Falcon/plan.txt"), notes = first.back("Falcon/deep/notes.txt")
        let headerBefore = Array(try readFile(plan).prefix(512)), recordBefore = rawAttribute(plan, "trusted.custody.owner")
        // A directory given to her (protect): it has an owner record of its own.
        XCTAssertEqual(mkdir(first.mnt("Given"), 0o755), 0)
        try writeFile(first.mnt("Given/inside.txt"), bytes("given"))
        let given = try first.api("POST", "/v1/files/protect", #"{"path": "\#(first.mnt("Given"))", "identity": "\#(Self.alice)"}"#)
        XCTAssertEqual(given.status, 200, given.body)
        let directoryRecordBefore = rawAttribute(first.back("Given"), "trusted.custody.owner")
        XCTAssertNotNil(recordBefore)
        XCTAssertNotNil(directoryRecordBefore)
        let (namesBefore, tagsBefore) = try storedTree(first.backing)
        XCTAssertEqual(tagsBefore.count, 1, "\(namesBefore)")
        let copyBefore = outside + "/plan-before.custody"
        _ = try mustRun(["cp", plan, copyBefore])
        // Held open in the kernel: the names it knows must still work after their stored names change.
        let held = try Syscall.open(first.mnt("Falcon/deep/notes.txt"), O_RDONLY)
        defer { close(held) }

        let said = try first.ctl(["identity", "rotate", Self.alice])
        XCTAssertEqual(said.status, 0, said.error)
        XCTAssertTrue(said.output.contains("generation 2"), said.output)
        close(held)
        try waitUntilBroughtOver(first)
        let account = try first.apiJSON("GET", "/v1/accounts/alice-oid").json
        XCTAssertEqual(account["keyGenerations"] as? Int, 2, "\(account)")

        // On the disk: every name of hers under the new key's tag, none under the old; her files
        // written anew (another header, another record), her directory's record too; the
        // personal file as it was.
        let (namesAfter, tagsAfter) = try storedTree(first.backing)
        XCTAssertEqual(tagsAfter.count, 1, "\(namesAfter)")
        XCTAssertTrue(tagsAfter.isDisjoint(with: tagsBefore), "\(namesAfter)")
        XCTAssertEqual(namesAfter.count, namesBefore.count)
        let planAfter = first.back("Falcon/plan.txt")
        XCTAssertNotEqual(Array(try readFile(planAfter).prefix(512)), headerBefore)
        XCTAssertNotEqual(rawAttribute(planAfter, "trusted.custody.owner"), recordBefore)
        XCTAssertNotNil(rawAttribute(first.back("Given"), "trusted.custody.owner"))
        XCTAssertNotEqual(rawAttribute(first.back("Given"), "trusted.custody.owner"), directoryRecordBefore)
        XCTAssertEqual(try readFile(first.mnt("Given/inside.txt")), bytes("given"))
        XCTAssertEqual(try readFile(first.back("Falcon") + "/handout.txt"), bytes("nobody's"))
        XCTAssertNotEqual(first.back("Falcon/deep/notes.txt"), notes)
        let storedLink = try Syscall.readlink(first.back("Falcon/link"))
        XCTAssertTrue(storedLink.hasPrefix("~c3" + (tagsAfter.first ?? "")), storedLink)

        // Through the mount nothing changed.
        XCTAssertEqual(try readFile(first.mnt("Falcon/plan.txt")), bytes("the plan"))
        XCTAssertEqual(try readFile(first.mnt("Falcon/deep/notes.txt")), bytes(String(repeating: "notes ", count: 3000)))
        XCTAssertEqual(try Syscall.readlink(first.mnt("Falcon/link")), "plan.txt")
        XCTAssertEqual(try readFile(first.mnt("Falcon/link")), bytes("the plan"))
        XCTAssertEqual(Set(try FileManager.default.contentsOfDirectory(atPath: first.mnt("Falcon"))), ["deep", "plan.txt", "link", "handout.txt"])
        try writeFile(first.mnt("Falcon/after.txt"), bytes("written after"))

        // The copy taken before the rotation opens here (the earlier keys stay); on the second
        // host, a copy written after does not, until it imports the new keys.
        let opened = try first.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copyBefore)", "copyPath": "\#(outside)/before.txt"}"#)
        XCTAssertEqual(opened.status, 200, "\(opened.json)")
        XCTAssertEqual(try readFile(outside + "/before.txt"), bytes("the plan"))
        let copyAfter = outside + "/after.custody"
        _ = try mustRun(["cp", first.back("Falcon/after.txt"), copyAfter])
        let refused = try second.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copyAfter)", "copyPath": "\#(outside)/never.txt"}"#)
        XCTAssertNotEqual(refused.status, 200, "\(refused.json)")
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(outside + "/never.txt") }, ENOENT)

        let check = try second.api("POST", "/v1/identities/import?check=true", #"{"export": \#(try export(from: first, to: second))}"#)
        XCTAssertEqual(check.status, 204, check.body)
        let imported = try carryAlice(from: first, to: second)
        XCTAssertEqual(imported.status, 200, "\(imported.json)")
        XCTAssertEqual(imported.json["keyGenerations"] as? Int, 2, "\(imported.json)")
        let after = try second.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copyAfter)", "copyPath": "\#(outside)/after.txt"}"#)
        XCTAssertEqual(after.status, 200, "\(after.json)")
        XCTAssertEqual(try readFile(outside + "/after.txt"), bytes("written after"))
        XCTAssertEqual(try carryAlice(from: first, to: second).status, 200, "nothing more to do")
    }

    func testALockedIdentityIsNotRotatedAndOnlyAnAdministratorRotates() throws {
        let daemon = try host()
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "\#(Self.alice)", "passphrase": "her passphrase"}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/\(Self.alice)/lock").status, 200)
        let locked = try daemon.apiJSON("POST", "/v1/accounts/\(Self.alice)/rotate")
        XCTAssertEqual(locked.status, 423, "\(locked.json)")
        XCTAssertEqual(try daemon.apiJSON("GET", "/v1/accounts/alice-oid").json["keyGenerations"] as? Int, 1)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/nobody@contoso.com/rotate").status, 404)
    }
}
