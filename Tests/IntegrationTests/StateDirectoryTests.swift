import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// The daemon over a state directory that is damaged or does not match the files it protects:
/// it mounts, serves what it can, and says what it could not use (log, events, status); the
/// backbone files stop it with their name, and nothing is changed or lost.
final class StateDirectoryTests: XCTestCase {
    var daemon: MountedDaemon?

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    static let alice = "alice@contoso.com"

    func status(_ daemon: MountedDaemon) throws -> [String: Any] {
        let (code, body) = try daemon.api("GET", "/v1/status")
        XCTAssertEqual(code, 200, body)
        return (try JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:]
    }

    func problems(_ daemon: MountedDaemon) throws -> [[String: Any]] {
        try status(daemon)["stateProblems"] as? [[String: Any]] ?? []
    }

    func testDamagedAndMissingStateIsReportedAndTheMountServes() throws {
        let daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=\(Self.alice)"])
        self.daemon = daemon
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        try writeFile(daemon.mnt("report.txt"), bytes("alice's report"))
        try writeFile(daemon.back("plain.txt"), bytes("nobody's"))
        XCTAssertEqual(xattr(daemon.mnt("report.txt"), "user.custody.encrypted"), "1")
        daemon.stop()

        // Bindings and attempts unreadable; the accounts file gone.
        let garbage = Data((0..<100).map { UInt8($0 * 7 % 256) })
        for name in ["bindings.json", "attempts.json"] {
            try garbage.write(to: URL(fileURLWithPath: daemon.state + "/" + name))
            XCTAssertEqual(chmod(daemon.state + "/" + name, 0o600), 0)
        }
        try FileManager.default.removeItem(atPath: daemon.state + "/accounts.json")
        try daemon.start(extraArguments: ["--default-identity", "0=\(Self.alice)"])

        // The mount serves: plain files read, alice's file (listed under its stored name: no
        // account holds its name key) is refused, not crashed on.
        XCTAssertEqual(try readFile(daemon.mnt("plain.txt")), bytes("nobody's"))
        XCTAssertEqual(daemon.refusalUnderStoredName(), EACCES)

        // The status says what was set aside, which keybag no account names, and whose files
        // the mount holds (the owner census runs beside the mount's start).
        var found: [[String: Any]] = []
        _ = try? eventually("the owner census", interval: 0.1) {
            found = try problems(daemon)
            return found.contains(where: { $0["kind"] as? String == "unknownOwner" })
        }
        let kinds = found.compactMap { $0["kind"] as? String }
        XCTAssertEqual(kinds.filter { $0 == "setAside" }.count, 2, "\(found)")
        let orphan = try XCTUnwrap(found.first { $0["kind"] as? String == "orphanedKeybag" }, "\(found)")
        XCTAssertEqual(orphan["identity"] as? String, "alice-id")
        let unknown = try XCTUnwrap(found.first { $0["kind"] as? String == "unknownOwner" }, "\(found)")
        // The files do not name their owner: the census finds it by the key they name, in the
        // keybag no account names.
        XCTAssertEqual(unknown["identity"] as? String, "alice-id", "the owner as its keybag names it")
        XCTAssertEqual(unknown["file"] as? String, daemon.backing)
        for moved in found.compactMap({ $0["setAsideAs"] as? String }) {
            XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: daemon.state + "/" + moved)), garbage, "kept as found: \(moved)")
        }
        XCTAssertTrue(daemon.log.contains("state: "), daemon.log)
        XCTAssertTrue(daemon.log.contains("keybags/"), daemon.log)
        let (eventsStatus, events) = try daemon.api("GET", "/v1/events?follow=false")
        XCTAssertEqual(eventsStatus, 200, events)
        XCTAssertGreaterThanOrEqual(events.components(separatedBy: "\"stateProblem\"").count - 1, 4, events)
        // Others see only what concerns their accounts.
        let asNobody = try daemon.api("GET", "/v1/status", asUser: 65534)
        XCTAssertFalse(asNobody.body.contains("alice-id"), asNobody.body)

        // Enrolling the same object ID again takes up its keybag: the file opens again.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        XCTAssertEqual(try readFile(daemon.mnt("report.txt")), bytes("alice's report"))
    }

    func testAnUnusableKeybagMakesOnlyItsIdentityUnavailable() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=\(Self.alice)"])
        self.daemon = daemon
        for (id, upn) in [("alice-id", Self.alice), ("bob-id", "bob@contoso.com")] {
            XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "\#(id)", "upn": "\#(upn)"}"#).status, 201)
        }
        try writeFile(daemon.mnt("mine.txt"), bytes("alice's"))
        daemon.stop()
        try daemon.start(extraArguments: ["--multi-identity", "--default-identity", "0=bob@contoso.com"])
        try writeFile(daemon.mnt("bob.txt"), bytes("bob's"))
        XCTAssertEqual(xattr(daemon.mnt("bob.txt"), "user.custody.encrypted"), "1")
        daemon.stop()
        let keybags = try FileManager.default.contentsOfDirectory(atPath: daemon.state + "/keybags")
        XCTAssertEqual(keybags.count, 2)
        // Find alice's keybag (named by a keyed hash of her identity), and cut it short.
        let alice = String(try StateReader(daemon.state).keybagName(of: "alice-id").dropFirst("keybags/".count))
        XCTAssertTrue(keybags.contains(alice), "\(keybags)")
        let path = daemon.state + "/keybags/" + alice
        let original = try Data(contentsOf: URL(fileURLWithPath: path))
        try original.prefix(40).write(to: URL(fileURLWithPath: path))

        try daemon.start(extraArguments: ["--multi-identity", "--default-identity", "0=bob@contoso.com"])
        XCTAssertEqual(try readFile(daemon.mnt("bob.txt")), bytes("bob's"), "bob's file is served")
        // A process bound to alice cannot read her file.
        let output = daemon.root + "/cat.out"
        let reader = try spawn("/bin/sh", ["-c", "sleep 0.5; cat '\(daemon.mountPoint)'/~c3*"], stdoutPath: output, stderrPath: output)
        XCTAssertEqual(try daemon.api("POST", "/v1/bindings", #"{"pid": \#(reader), "identity": "\#(Self.alice)"}"#).status, 201)
        var exit: Int32 = 0
        XCTAssertTrue(waitForExit(reader, seconds: 10, status: &exit))
        XCTAssertNotEqual(exit, 0)
        let said = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        XCTAssertTrue(said.contains("Permission denied"), said)
        let accounts = try status(daemon)["accounts"] as? [[String: Any]] ?? []
        let view = try XCTUnwrap(accounts.first { $0["id"] as? String == "alice-id" })
        XCTAssertEqual(view["lock"] as? String, "unavailable")
        XCTAssertTrue((view["unavailable"] as? String)?.contains("keybags/" + alice) == true, "\(view)")
        XCTAssertEqual(try problems(daemon).first?["kind"] as? String, "keybagUnusable")
        let locked = try daemon.api("POST", "/v1/accounts/alice-id/lock")
        XCTAssertEqual(locked.status, 409, locked.body)
        XCTAssertTrue(locked.body.contains("318") && locked.body.contains("KeysUnavailable"), locked.body)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: path)), original.prefix(40), "left as found")

        // Restored, alice's file opens again.
        daemon.stop()
        try original.write(to: URL(fileURLWithPath: path))
        try daemon.start(extraArguments: ["--multi-identity", "--default-identity", "0=\(Self.alice)"])
        XCTAssertEqual(try readFile(daemon.mnt("mine.txt")), bytes("alice's"))
        XCTAssertTrue(try problems(daemon).isEmpty)
    }

    func testADamagedAccountsFileStopsTheDaemonAndIsLeftAsItIs() throws {
        let daemon = try MountedDaemon()
        self.daemon = daemon
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        daemon.stop()
        let path = daemon.state + "/accounts.json"
        let damaged = try Data(contentsOf: URL(fileURLWithPath: path)).prefix(20)
        try damaged.write(to: URL(fileURLWithPath: path))
        let result = try runCommand([MountedDaemon.binary, "--state", daemon.state, "--socket", daemon.socket, daemon.backing, daemon.mountPoint])
        XCTAssertEqual(result.status, 1)
        XCTAssertTrue(result.error.contains(path), result.error)
        XCTAssertFalse(daemon.isMounted)
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: path)), damaged)
    }
}
