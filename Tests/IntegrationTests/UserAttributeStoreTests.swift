import CustodySystem
import Foundation
import Glibc
import XCTest

/// A store that keeps Custody's records in `user.custody.store.*` attributes
/// (`--store-attributes user`), as one on NFS must: everything a mount does with its records
/// (owners, holes, tweaks, long names, owner changes, re-protection, a wipe) works as with
/// `trusted.*` ones, no `trusted.custody.*` attribute is written, and the records are neither
/// shown nor settable through the mount.
final class UserAttributeStoreTests: HostsTestCase {
    override var hostArguments: [String] { Self.baseArguments + ["--store-attributes", "user"] }

    /// Every extended attribute name below `directory`, by path (getfattr's view, as root).
    private func attributeNames(below directory: String) throws -> [String: Set<String>] {
        let output = try mustRun(["getfattr", "-R", "-P", "-h", "-m", "-", "--absolute-names", directory])
        var names: [String: Set<String>] = [:], current = ""
        for line in output.split(separator: "\n").map(String.init) {
            if line.hasPrefix("# file: ") { current = String(line.dropFirst(8)) } else if !line.isEmpty { names[current, default: []].insert(line) }
        }
        return names
    }

    private func enrollAlice(_ daemon: MountedDaemon, policy: String = #"{"protectionLevel": "untilFirstAuth", "sendToOtherIdentities": "all"}"#) throws {
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "\#(Self.alice)", "policy": \#(policy)}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
    }

    func testAMountKeepsItsRecordsInUserAttributesAndHidesThem() throws {
        let daemon = try host()
        try enrollAlice(daemon)
        let longName = String(repeating: "n", count: 250) + ".txt"
        XCTAssertEqual(mkdir(daemon.mnt("Falcon"), 0o755), 0)
        try writeFile(daemon.mnt("Falcon/plan.txt"), bytes("the plan"))
        try writeFile(daemon.mnt("Falcon/" + longName), bytes("a long name"))
        XCTAssertEqual(symlink("plan.txt", daemon.mnt("Falcon/link")), 0)
        let fd = try Syscall.open(daemon.mnt("Falcon/sparse.bin"), O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
        XCTAssertEqual(bytes("end").withUnsafeBytes { pwrite(fd, $0.baseAddress, 3, 1 << 20) }, 3)
        close(fd)

        // On the store: records in user.custody.store.*, none in trusted.custody.*.
        let names = try attributeNames(below: daemon.backing)
        let all = names.values.reduce(into: Set<String>()) { $0.formUnion($1) }
        XCTAssertFalse(all.contains { $0.hasPrefix("trusted.custody.") }, "\(names)")
        XCTAssertTrue(all.isSuperset(of: ["user.custody.store.owner", "user.custody.store.dirid", "user.custody.store.name"]), "\(all)")
        XCTAssertEqual(names[daemon.backing].map { $0.contains("user.custody.store.namespace") }, true, "\(names)")
        XCTAssertEqual(xattr(daemon.backing, "trusted.custody.namespace"), nil)

        // Through the mount: the virtual attributes, not the records; the records cannot be set.
        XCTAssertEqual(xattr(daemon.mnt("Falcon/plan.txt"), "user.custody.encrypted"), "1")
        XCTAssertEqual(xattr(daemon.mnt("Falcon/plan.txt"), "user.custody.owner"), Self.alice)
        XCTAssertNil(xattr(daemon.mnt("Falcon/plan.txt"), "user.custody.store.owner"))
        let listed = try mustRun(["getfattr", "-m", "-", "--absolute-names", daemon.mnt("Falcon/plan.txt")])
        XCTAssertFalse(listed.contains("user.custody.store"), listed)
        let set = try runCommand(["setfattr", "-n", "user.custody.store.owner", "-v", "x", daemon.mnt("Falcon/plan.txt")])
        XCTAssertNotEqual(set.status, 0)
        XCTAssertTrue(set.error.contains("Operation not permitted"), set.error)
        // A user attribute of the user's own passes through.
        _ = try mustRun(["setfattr", "-n", "user.note", "-v", "mine", daemon.mnt("Falcon/plan.txt")])

        // Read back through a restarted daemon (the records are found again), and the hole.
        daemon.stop()
        try daemon.start(extraArguments: hostArguments)
        XCTAssertEqual(try readFile(daemon.mnt("Falcon/plan.txt")), bytes("the plan"))
        XCTAssertEqual(try readFile(daemon.mnt("Falcon/" + longName)), bytes("a long name"))
        XCTAssertEqual(try Syscall.readlink(daemon.mnt("Falcon/link")), "plan.txt")
        let sparse = try readFile(daemon.mnt("Falcon/sparse.bin"))
        XCTAssertEqual(sparse.count, (1 << 20) + 3)
        XCTAssertTrue(sparse.prefix(1 << 20).allSatisfy { $0 == 0 })
        XCTAssertEqual(xattr(daemon.mnt("Falcon/plan.txt"), "user.note"), "mine")

        // An owner change rewrites the file (its own user attribute kept, its record the new one),
        // and a wipe finds everything by its user records.
        let decrypted = try daemon.api("POST", "/v1/files/decrypt", #"{"path": "\#(daemon.mnt("Falcon/plan.txt"))"}"#)
        XCTAssertEqual(decrypted.status, 200, decrypted.body)
        XCTAssertEqual(xattr(daemon.mnt("Falcon/plan.txt"), "user.custody.encrypted"), "0")
        XCTAssertEqual(xattr(daemon.mnt("Falcon/plan.txt"), "user.note"), "mine")
        XCTAssertEqual(try readFile(daemon.backing + "/" + (try FileManager.default.contentsOfDirectory(atPath: daemon.backing).first { $0.hasPrefix("~c3") } ?? "") + "/plan.txt"),
                       bytes("the plan"))
        let wiped = try daemon.api("POST", "/v1/accounts/\(Self.alice)/wipe")
        XCTAssertEqual(wiped.status, 200, wiped.body)
        let left = try mustRun(["find", daemon.backing, "-mindepth", "1"]).split(separator: "\n").map { String($0.dropFirst(daemon.backing.utf8.count + 1)) }
        XCTAssertEqual(left.map { $0.split(separator: "/").map { $0.hasPrefix("~c3") ? "KEPT" : String($0) }.joined(separator: "/") }.sorted(),
                       ["KEPT", "KEPT/plan.txt"], "only the file that left her remains: \(left)")
    }

    func testAStoreKeepsToTheNamespaceItWasMountedWith() throws {
        let daemon = try host()
        try enrollAlice(daemon)
        try writeFile(daemon.mnt("report.txt"), bytes("report"))
        daemon.stop()
        // Asked for trusted.* records where the store's are user.* ones: refused, nothing served.
        XCTAssertThrowsError(try daemon.start(extraArguments: Self.baseArguments + ["--store-attributes", "trusted"])) {
            XCTAssertTrue("\($0)".contains("its records are in user.* attributes"), "\($0)")
        }
        XCTAssertFalse(daemon.isMounted)
        XCTAssertNil(xattr(daemon.backing, "trusted.custody.namespace"))
        // Nothing asked: the store's marker decides.
        try daemon.start(extraArguments: Self.baseArguments)
        XCTAssertEqual(try readFile(daemon.mnt("report.txt")), bytes("report"))
        XCTAssertEqual(xattr(daemon.mnt("report.txt"), "user.custody.encrypted"), "1")
    }

    func testTwoHostsShareAStoreWithUserRecords() throws {
        let first = try host()
        let second = try host(sharingStoreOf: first)
        for daemon in [first, second] { XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200) }
        try enrollAlice(first)
        let key = try XCTUnwrap(try second.apiJSON("GET", "/v1/host-key").json["publicKey"] as? String)
        let export = try first.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(key)"}"#)
        XCTAssertEqual(try second.api("POST", "/v1/identities/import", #"{"export": \#(export.body)}"#).status, 201)
        XCTAssertEqual(mkdir(first.mnt("Team"), 0o755), 0)
        try writeFile(first.mnt("Team/agenda.txt"), bytes("agenda"))
        XCTAssertEqual(try readFile(second.mnt("Team/agenda.txt")), bytes("agenda"))
        XCTAssertEqual(xattr(second.mnt("Team/agenda.txt"), "user.custody.owner"), Self.alice)
    }
}
