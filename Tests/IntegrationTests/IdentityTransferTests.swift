import CustodySystem
import Foundation
import Glibc
import XCTest

/// One identity on two hosts: two daemons with state directories (and so machine and host keys)
/// of their own stand for two machines. alice's keys go from the first to the second sealed to
/// the second's host key; then what alice's identity encrypted on either host opens on the other:
/// an exported copy, and a mount's tree carried over (as a backup restored, or an rsync of the
/// backing store).
final class IdentityTransferTests: HostsTestCase {
    private func enrollAlice(_ daemon: MountedDaemon) throws {
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "\#(Self.alice)", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
    }

    private func hostKey(_ daemon: MountedDaemon) throws -> String {
        let answer = try daemon.apiJSON("GET", "/v1/host-key")
        XCTAssertEqual(answer.status, 200, "\(answer.json)")
        let key = try XCTUnwrap(answer.json["publicKey"] as? String)
        XCTAssertEqual(Data(base64Encoded: key)?.count, 32)
        XCTAssertEqual((answer.json["fingerprint"] as? String)?.utf8.count, 16)
        return key
    }

    /// alice's export from `from` sealed to `key`, as the daemon answers it (its JSON text).
    private func export(from daemon: MountedDaemon, to key: String) throws -> String {
        let answer = try daemon.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(key)"}"#)
        XCTAssertEqual(answer.status, 200, answer.body)
        return answer.body
    }

    private func importing(_ export: String, into daemon: MountedDaemon, extra: String = "") throws -> (status: Int, json: [String: Any]) {
        try daemon.apiJSON("POST", "/v1/identities/import", #"{"export": \#(export)\#(extra)}"#)
    }

    /// Replaces `target`'s backing store with a copy of `source`'s (extended attributes and all),
    /// with `target`'s daemon stopped, and starts it again on the copy.
    private func carry(_ source: MountedDaemon, to target: MountedDaemon) throws {
        _ = try mustRun(["sync"])
        target.stop()
        _ = try mustRun(["rm", "-rf", target.backing])
        _ = try mustRun(["cp", "-a", source.backing, target.backing])
        try target.start(extraArguments: hostArguments)
    }

    func testAnIdentityMovesToAnotherHostAndItsFilesOpenOnBoth() throws {
        let first = try host(), second = try host()
        try enrollAlice(first)
        let outside = try scratchDirectory("transfer-exports")

        // On the first host: a file in the mount (in a directory of alice's: names encrypted) and
        // an encrypted copy handed out of it.
        XCTAssertEqual(mkdir(first.mnt("Project Falcon"), 0o755), 0)
        try writeFile(first.mnt("Project Falcon/plan.txt"), bytes("written on the first host"))
        XCTAssertEqual(xattr(first.mnt("Project Falcon/plan.txt"), "user.custody.encrypted"), "1")
        let copy = outside + "/plan-export.txt"
        try writeFile(copy, bytes("an export of the first host"))
        XCTAssertEqual(try first.api("POST", "/v1/files/encrypt", #"{"path": "\#(copy)", "identity": "\#(Self.alice)"}"#).status, 200)

        // The second host has no alice: the copy does not open there.
        let before = try second.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copy)", "copyPath": "\#(outside)/never.txt"}"#)
        XCTAssertEqual(field(before.json, "code"), "103", "\(before.json)")

        // Sealed to the second host's key; the document names the account and both hosts, and
        // carries nothing else in clear.
        let secondKey = try hostKey(second)
        let document = try export(from: first, to: secondKey)
        let parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(document.utf8)) as? [String: Any])
        XCTAssertEqual(Set(parsed.keys), ["format", "accountID", "upn", "to", "toFingerprint", "from", "created", "sealed"])
        XCTAssertEqual(parsed["upn"] as? String, Self.alice)
        XCTAssertEqual(parsed["to"] as? String, secondKey)
        XCTAssertEqual(parsed["from"] as? String, try first.apiJSON("GET", "/v1/host-key").json["fingerprint"] as? String)
        let sealed = try XCTUnwrap(Data(base64Encoded: try XCTUnwrap(parsed["sealed"] as? String)))
        XCTAssertNil(sealed.range(of: Data("alice".utf8)), "the sealed content is not readable")

        let imported = try importing(document, into: second)
        XCTAssertEqual(imported.status, 201, "\(imported.json)")
        XCTAssertEqual(imported.json["upn"] as? String, Self.alice)
        XCTAssertEqual((imported.json["policy"] as? [String: Any])?["protectionLevel"] as? String, "untilFirstAuth", "the policy travels")
        // Its keys are the second host's now: bound to its machine key, in a keybag of its own.
        let status = try second.apiJSON("GET", "/v1/accounts/alice-oid")
        XCTAssertEqual(status.json["enrolled"] as? Bool, true, "\(status.json)")

        // The copy opens on the second host.
        let opened = try second.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(copy)", "copyPath": "\#(outside)/opened.txt"}"#)
        XCTAssertEqual(opened.status, 200, "\(opened.json)")
        XCTAssertEqual(try readFile(outside + "/opened.txt"), bytes("an export of the first host"))

        // The first host's tree, carried to the second: names and contents read there.
        try carry(first, to: second)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: second.mountPoint).filter { !$0.hasPrefix(".") }, ["Project Falcon"])
        XCTAssertEqual(try readFile(second.mnt("Project Falcon/plan.txt")), bytes("written on the first host"))

        // Written on the second host, read on the first: a new file in the mount and an export.
        try writeFile(second.mnt("Project Falcon/reply.txt"), bytes("written on the second host"))
        let reply = outside + "/reply-export.txt"
        try writeFile(reply, bytes("an export of the second host"))
        XCTAssertEqual(try second.api("POST", "/v1/files/encrypt", #"{"path": "\#(reply)", "identity": "\#(Self.alice)"}"#).status, 200)
        let back = try first.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(reply)", "copyPath": "\#(outside)/reply.txt"}"#)
        XCTAssertEqual(back.status, 200, "\(back.json)")
        XCTAssertEqual(try readFile(outside + "/reply.txt"), bytes("an export of the second host"))
        try carry(second, to: first)
        XCTAssertEqual(try readFile(first.mnt("Project Falcon/reply.txt")), bytes("written on the second host"))
        XCTAssertEqual(try readFile(first.mnt("Project Falcon/plan.txt")), bytes("written on the first host"))
    }

    /// The walk-through of docs/identity.md, with custodyctl.
    func testCustodyctlCarriesAnIdentityToAnotherHost() throws {
        let first = try host(), second = try host()
        try enrollAlice(first)
        let work = try scratchDirectory("transfer-cli")
        func ctl(_ daemon: MountedDaemon, _ arguments: [String]) throws -> String {
            let result = try daemon.ctl(arguments)
            XCTAssertEqual(result.status, 0, "custodyctl \(arguments.joined(separator: " ")): \(result.output) \(result.error)")
            return result.output
        }
        let said = try ctl(second, ["identity", "host-key", "--output", work + "/b.pub"])
        let fingerprint = try XCTUnwrap(try second.apiJSON("GET", "/v1/host-key").json["fingerprint"] as? String)
        XCTAssertTrue(said.contains(fingerprint), said)
        XCTAssertTrue(try ctl(second, ["identity", "host-key"]).contains(fingerprint))
        XCTAssertTrue(try ctl(first, ["identity", "export", Self.alice, "--to", work + "/b.pub", "--output", work + "/alice.export"]).contains(fingerprint))
        XCTAssertEqual(try Syscall.lstat(work + "/alice.export").st_mode & 0o777, 0o600)
        XCTAssertTrue(try ctl(second, ["identity", "import", work + "/alice.export"]).contains("imported \(Self.alice)"))
        XCTAssertEqual(try second.apiJSON("GET", "/v1/accounts/alice-oid").json["enrolled"] as? Bool, true)
        // The process identity is still `custodyctl identity [PID]`.
        let shown = try ctl(second, ["identity", "\(getpid())"])
        XCTAssertTrue(shown.contains(Self.alice), shown)
        // Another file is refused by name.
        try writeFile(work + "/not-an-export", bytes("{}"))
        let refused = try second.ctl(["identity", "import", work + "/not-an-export"])
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.error.contains("is not a Custody identity export"), refused.error)
    }

    func testAnExportOpensOnlyOnItsHostAndAsItWasMade() throws {
        let first = try host(), second = try host(), third = try host()
        try enrollAlice(first)
        let secondKey = try hostKey(second)
        let document = try export(from: first, to: secondKey)

        // Sealed to the second host: the third cannot open it, and enrolls nothing.
        let elsewhere = try importing(document, into: third)
        XCTAssertEqual(elsewhere.status, 422, "\(elsewhere.json)")
        XCTAssertEqual(field(elsewhere.json, "code"), "320")
        XCTAssertEqual(field(elsewhere.json, "name"), "IdentityExportInvalid")
        XCTAssertEqual(try third.api("GET", "/v1/accounts/alice-oid").status, 404)

        // The outer fields cannot be changed: another account named outside, a changed box.
        var parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(document.utf8)) as? [String: Any])
        parsed["upn"] = "mallory@contoso.com"
        parsed["accountID"] = "mallory-oid"
        let renamed = String(decoding: try JSONSerialization.data(withJSONObject: parsed), as: UTF8.self)
        let swapped = try importing(renamed, into: second)
        XCTAssertEqual(field(swapped.json, "code"), "320", "\(swapped.json)")
        XCTAssertEqual(try second.api("GET", "/v1/accounts/mallory-oid").status, 404)
        parsed = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(document.utf8)) as? [String: Any])
        var box = try XCTUnwrap(Data(base64Encoded: try XCTUnwrap(parsed["sealed"] as? String)))
        box[box.count / 2] ^= 0x01
        parsed["sealed"] = box.base64EncodedString()
        let changed = try importing(String(decoding: try JSONSerialization.data(withJSONObject: parsed), as: UTF8.self), into: second)
        XCTAssertEqual(field(changed.json, "code"), "320", "\(changed.json)")

        // A malformed request is refused before anything opens it.
        XCTAssertEqual(try second.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "c2hvcnQ="}"#).status, 400)
        XCTAssertEqual(try second.api("POST", "/v1/identities/import", #"{"export": {"format": 1}}"#).status, 400)

        // Who may export and import: docs/api.md's route × caller table (AuthorizationTableTests).
        // Checked first (nothing enrolled), then imported with a passphrase of the second host's
        // own; again, nothing is left to do.
        let check = try second.api("POST", "/v1/identities/import?check=true", #"{"export": \#(document)}"#)
        XCTAssertEqual(check.status, 204, check.body)
        XCTAssertEqual(try second.api("GET", "/v1/accounts/alice-oid").status, 404)
        let imported = try importing(document, into: second, extra: #", "passphrase": "second host's own""#)
        XCTAssertEqual(imported.status, 201, "\(imported.json)")
        XCTAssertEqual(imported.json["hasPassphrase"] as? Bool, true)
        let again = try importing(document, into: second)
        XCTAssertEqual(again.status, 200, "\(again.json)")
        XCTAssertEqual(try second.api("POST", "/v1/identities/import?check=true", #"{"export": \#(document)}"#).status, 200)
        // The same account enrolled on the third host on its own has other keys: refused.
        try enrollAlice(third)
        let otherKeys = try third.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(secondKey)"}"#)
        XCTAssertEqual(field(try importing(otherKeys.body, into: second).json, "code"), "208")
        // The passphrase is the second host's: locked, it unlocks with that one.
        XCTAssertEqual(try second.api("POST", "/v1/accounts/alice-oid/lock").status, 200)
        XCTAssertEqual(try second.api("POST", "/v1/accounts/alice-oid/unlock", #"{"passphrase": "second host's own"}"#).status, 200)

        // A locked identity's keys cannot be exported (classes A and B are not in memory).
        XCTAssertEqual(try first.api("POST", "/v1/accounts/alice-oid/passphrase", #"{"new": "first"}"#).status, 200)
        XCTAssertEqual(try first.api("POST", "/v1/accounts/alice-oid/lock").status, 200)
        var locked = (status: 0, body: "")
        for _ in 0..<100 {
            locked = try first.api("POST", "/v1/accounts/\(Self.alice)/export", #"{"hostKey": "\#(secondKey)"}"#)
            if locked.status == 423 { break }
            usleep(100_000)
        }
        XCTAssertEqual(locked.status, 423, locked.body)
    }
}
