import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// The control API end to end with curl against a running daemon: every route, the documented
/// errors, limits and disconnects, authorization of a non-admin user.
final class ControlAPITests: XCTestCase {
    var daemon: MountedDaemon!
    var children: [pid_t] = []
    var outside: String!

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--lock-grace-period", "0", "--socket-mode", "0666", "--allow-other"])
        outside = try makeTemporaryDirectory("custody-export")
    }

    override func tearDown() {
        for child in children { kill(child, SIGKILL); waitForExit(child, seconds: 5) }
        daemon?.destroy()
        daemon = nil
        if let outside { _ = try? runCommand(["rm", "-rf", outside]) }
    }

    func enroll(_ id: String, _ upn: String, level: String = "untilFirstAuth", passphrase: String? = nil, uid: UInt32? = nil,
                share: Bool = false, file: StaticString = #filePath, line: UInt = #line) throws {
        var body = #"{"id": "\#(id)", "upn": "\#(upn)", "policy": {"protectionLevel": "\#(level)", "canShareWithOtherIdentities": \#(share)}"#
        if let passphrase { body += #", "passphrase": "\#(passphrase)""# }
        if let uid { body += #", "uid": \#(uid)"# }
        let response = try daemon.api("POST", "/v1/accounts", body + "}")
        XCTAssertEqual(response.status, 201, response.body, file: file, line: line)
    }

    /// Writes `content` at `path` from a shell bound to `identity`.
    func write(_ content: String, to path: String, as identity: String) throws {
        let shell = try spawn("/bin/sh", ["-c", "while [ ! -e '\(outside!)/go' ]; do sleep 0.01; done; printf '%s' '\(content)' > '\(path)'"])
        children.append(shell)
        XCTAssertEqual(try daemon.api("POST", "/v1/bindings", #"{"pid": \#(shell), "identity": "\#(identity)"}"#).status, 201)
        XCTAssertTrue(FileManager.default.createFile(atPath: outside + "/go", contents: Data()))
        XCTAssertTrue(waitForExit(shell, seconds: 20))
        try FileManager.default.removeItem(atPath: outside + "/go")
    }

    func hasMagic(_ path: String) throws -> Bool {
        Array(try readFile(path).prefix(8)) == FileHeader.magic
    }

    // MARK: Every route

    /// Every documented route answers (neither UnknownRoute nor MethodNotAllowed), and every
    /// route the server knows is documented (the static check is in CustodyControlTests).
    func testEveryDocumentedRouteIsServed() throws {
        let document = try String(contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/openapi.yaml").path, encoding: .utf8)
        var routes: [(String, String)] = []
        var path: String?
        for line in document.split(separator: "\n") {
            if line.hasPrefix("  /v1/"), line.hasSuffix(":") { path = String(line.dropFirst(2).dropLast()) }
            else if let path, line.hasPrefix("    "), !line.hasPrefix("     "),
                    let method = ["get", "put", "post", "delete"].first(where: { line == "    \($0):" }) {
                routes.append((method.uppercased(), path))
            }
        }
        XCTAssertGreaterThan(routes.count, 20)
        for (method, pattern) in routes {
            let concrete = pattern.replacingOccurrences(of: "{identity}", with: "nobody@example.com")
                .replacingOccurrences(of: "{pid}", with: "\(getpid())").replacingOccurrences(of: "{id}", with: "999999")
            let query = concrete == "/v1/events" ? "?follow=false" : ""
            let (status, body) = try daemon.api(method, concrete + query, method == "GET" || method == "DELETE" ? nil : "{}")
            XCTAssertFalse(body.contains("UnknownRoute") || body.contains("MethodNotAllowed"), "\(method) \(pattern): \(status) \(body)")
            XCTAssertNotEqual(status, 0, "\(method) \(pattern) answered")
        }
    }

    func testAccountsPoliciesLocksAndBindings() throws {
        try enroll("alice-oid", "alice@contoso.com", level: "complete", passphrase: "pw")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@fabrikam.com", "enroll": false}"#).status, 201)

        let list = try daemon.api("GET", "/v1/accounts")
        XCTAssertTrue(list.body.contains("alice@contoso.com") && list.body.contains("bob@fabrikam.com"), list.body)
        let alice = try daemon.apiJSON("GET", "/v1/accounts/ALICE-OID")
        XCTAssertEqual(alice.status, 200)
        XCTAssertEqual(field(alice.json, "upn"), "alice@contoso.com")
        XCTAssertEqual(field(alice.json, "hasPassphrase"), "1")
        XCTAssertEqual(field(try daemon.apiJSON("GET", "/v1/accounts/bob@fabrikam.com").json, "enrolled"), "0")

        let policy = try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com/policy")
        XCTAssertEqual(field(policy.json, "protectionLevel"), "complete")
        let changed = try daemon.apiJSON("PUT", "/v1/accounts/alice@contoso.com/policy", #"{"protectionLevel": "NSFileProtectionCompleteUnlessOpen"}"#)
        XCTAssertEqual(changed.status, 200)
        XCTAssertEqual(field(changed.json, "policy.protectionLevel"), "completeUnlessOpen")
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/bob@fabrikam.com/policy").status, 409, "a registered account has no policy")

        // Nothing sent is half-understood: a misspelt field is refused by name (with the field it
        // resembles), at any depth and in every body, and changes nothing.
        let restricted = try daemon.api("PUT", "/v1/accounts/alice@contoso.com/policy",
                                        #"{"protectionLevel": "completeUnlessOpen", "saveToLocations": ["AccountDocument"]}"#)
        XCTAssertEqual(restricted.status, 200, restricted.body)
        let misspelt = try daemon.apiJSON("PUT", "/v1/accounts/alice@contoso.com/policy", #"{"protectionLevel": "completeUnlessOpen", "saveToLocation": []}"#)
        XCTAssertEqual(misspelt.status, 400, "\(misspelt.json)")
        XCTAssertEqual(field(misspelt.json, "message"), "unknown field saveToLocation (did you mean saveToLocations?)")
        XCTAssertEqual(try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com/policy").json["saveToLocations"] as? [String], ["AccountDocument"],
                       "the restriction stays")
        let nested = try daemon.apiJSON("POST", "/v1/accounts", #"{"id": "x-oid", "upn": "x@contoso.com", "policy": {"protectonLevel": "complete"}}"#)
        XCTAssertEqual(nested.status, 400, "\(nested.json)")
        XCTAssertEqual(field(nested.json, "message"), "unknown field policy.protectonLevel (did you mean protectionLevel?)")
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/x@contoso.com").status, 404, "nothing was enrolled")
        let unrelated = try daemon.apiJSON("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "nope", "remember": true}"#)
        XCTAssertEqual(unrelated.status, 400, "\(unrelated.json)")
        XCTAssertEqual(field(unrelated.json, "message"), "unknown field remember", "no close field: none suggested")
        // A value the policy does not take is the policy error, naming what it takes.
        let level = try daemon.apiJSON("PUT", "/v1/accounts/alice@contoso.com/policy", #"{"protectionLevel": "ultra"}"#)
        XCTAssertEqual(level.status, 400, "\(level.json)")
        XCTAssertEqual(field(level.json, "code"), "301")
        XCTAssertEqual(field(level.json, "name"), "InvalidPolicy")
        XCTAssertTrue((field(level.json, "message") ?? "").contains("unknown protection level ultra (complete, completeUnlessOpen, untilFirstAuth or none"), "\(level.json)")
        let ultra = try daemon.ctl(["policy", "alice@contoso.com", "--level", "ultra"])
        XCTAssertNotEqual(ultra.status, 0)
        XCTAssertTrue(ultra.error.contains("InvalidPolicy") && ultra.error.contains("untilFirstAuth"), ultra.error)

        let status = try daemon.apiJSON("GET", "/v1/status")
        XCTAssertEqual((status.json["mounts"] as? [[String: Any]])?.first?["mountPoint"] as? String, daemon.mountPoint)

        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/accounts/alice@contoso.com/lock").json, "lock"), "locked")
        let wrong = try daemon.apiJSON("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "nope"}"#)
        XCTAssertEqual(wrong.status, 403)
        XCTAssertEqual(field(wrong.json, "code"), "303")
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "pw"}"#).json, "lock"), "unlocked")
        XCTAssertEqual(try daemon.api("POST", "/v1/lock").status, 200)
        let stillLocked = try daemon.api("POST", "/v1/unlock")
        XCTAssertTrue(stillLocked.body.contains("alice@contoso.com"), "alice needs her passphrase: \(stillLocked.body)")

        let sleeper = try spawnSleeper()
        children.append(sleeper)
        let bound = try daemon.apiJSON("POST", "/v1/bindings", #"{"pid": \#(sleeper), "identity": "bob@fabrikam.com"}"#)
        XCTAssertEqual(bound.status, 201)
        XCTAssertEqual(field(bound.json, "identity"), "bob@fabrikam.com")
        let resolved = try daemon.apiJSON("GET", "/v1/processes/\(sleeper)/identity")
        XCTAssertEqual(field(resolved.json, "identity"), "bob@fabrikam.com")
        XCTAssertTrue(field(resolved.json, "source")?.hasPrefix("process") ?? false, "\(resolved.json)")
        XCTAssertEqual(try daemon.api("DELETE", "/v1/bindings/\(sleeper)").status, 204)
        XCTAssertNil(field(try daemon.apiJSON("GET", "/v1/processes/\(sleeper)/identity").json, "identity"))
        XCTAssertEqual(try daemon.api("GET", "/v1/processes/999999999/identity").status, 404)

        XCTAssertEqual(try daemon.api("DELETE", "/v1/accounts/bob@fabrikam.com").status, 204)
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/bob@fabrikam.com").status, 404)
    }

    // MARK: Files

    func testFileRoutesInTheMountAndOutside() throws {
        try enroll("alice-oid", "alice@contoso.com", share: true)
        try write("corporate secret", to: daemon.mnt("report.txt"), as: "alice@contoso.com")

        // Info and is-encrypted in the mount; the backing file is encrypted.
        let info = try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("report.txt"))"}"#)
        XCTAssertEqual(info.status, 200, "\(info.json)")
        XCTAssertEqual(field(info.json, "owner"), "alice@contoso.com")
        XCTAssertEqual(field(info.json, "encrypted"), "1")
        XCTAssertEqual(field(info.json, "managed"), "1")
        XCTAssertEqual(field(info.json, "protectionClass"), "untilFirstAuth")
        XCTAssertEqual(field(info.json, "size"), "16")
        XCTAssertEqual(field(info.json, "mountPoint"), daemon.mountPoint)
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/files/is-encrypted", #"{"path": "\#(daemon.mnt("report.txt"))"}"#).json, "encrypted"), "1")

        // Decrypt to a copy outside: plaintext; the original stays encrypted.
        let copy = outside + "/report-copy.txt"
        let decrypted = try daemon.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(daemon.mnt("report.txt"))", "copyPath": "\#(copy)"}"#)
        XCTAssertEqual(decrypted.status, 200, "\(decrypted.json)")
        XCTAssertEqual(try readFile(copy), bytes("corporate secret"))
        XCTAssertTrue(try hasMagic(daemon.back("report.txt")))

        // A copy into the mount itself (no anonymous files there: a named staging file, renamed).
        let inside = try daemon.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(daemon.mnt("report.txt"))", "copyPath": "\#(daemon.mnt("report-copy.txt"))"}"#)
        XCTAssertEqual(inside.status, 200, "\(inside.json)")
        XCTAssertEqual(try readFile(daemon.mnt("report-copy.txt")), bytes("corporate secret"))
        XCTAssertEqual(try readFile(daemon.back("report-copy.txt")), bytes("corporate secret"), "written by a caller with no identity: plain")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.backing).filter { $0.hasPrefix(".custody-") }, [])

        // Encrypt an export outside the mount: self-describing, no plaintext on disk, same mode.
        let export = outside + "/export.txt"
        try writeFile(export, bytes("exported corporate data"), mode: 0o640)
        let encrypted = try daemon.apiJSON("POST", "/v1/files/encrypt", #"{"path": "\#(export)", "identity": "alice@contoso.com"}"#)
        XCTAssertEqual(encrypted.status, 200, "\(encrypted.json)")
        XCTAssertTrue(try hasMagic(export))
        XCTAssertEqual(try runCommand(["grep", "-c", "corporate", export]).output, "0\n")
        XCTAssertEqual(try Syscall.lstat(export).st_mode & 0o777, 0o640)
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(export)"}"#).json, "size"), "23")
        let again = try daemon.apiJSON("POST", "/v1/files/encrypt", #"{"path": "\#(export)", "identity": "alice@contoso.com"}"#)
        XCTAssertEqual(again.status, 409)
        XCTAssertEqual(field(again.json, "code"), "105")

        // A tampered export fails to decrypt with 103 and nothing is written or lost.
        let tampered = outside + "/tampered.txt"
        var stored = try readFile(export)
        stored[FileHeader.length + 20] ^= 0x01
        try writeFile(tampered, stored)
        let refused = try daemon.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(tampered)", "copyPath": "\#(outside!)/never.txt"}"#)
        XCTAssertEqual(refused.status, 422)
        XCTAssertEqual(field(refused.json, "code"), "103")
        XCTAssertEqual(field(refused.json, "name"), "FailedToDecryptFile")
        XCTAssertFalse(FileManager.default.fileExists(atPath: outside + "/never.txt"))
        XCTAssertEqual(try readFile(tampered), stored)

        // Decrypt the export in place.
        XCTAssertEqual(try daemon.api("POST", "/v1/files/decrypt", #"{"path": "\#(export)"}"#).status, 200)
        XCTAssertEqual(try readFile(export), bytes("exported corporate data"))
        let plain = try daemon.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(export)"}"#)
        XCTAssertEqual(field(plain.json, "code"), "104")
        XCTAssertEqual(field(plain.json, "name"), "FileNotEncrypted")

        // Encrypting for an unmanaged identity, bad paths.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@fabrikam.com", "enroll": false}"#).status, 201)
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/files/encrypt", #"{"path": "\#(export)", "identity": "bob@fabrikam.com"}"#).json, "code"), "106")
        for bad in ["relative/path", outside + "/missing/x", daemon.back("report.txt"), outside + "/nothing-here"] {
            let answer = try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(bad)"}"#)
            XCTAssertEqual(field(answer.json, "code"), "101", "\(bad): \(answer.json)")
        }
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/files/protect", #"{"path": "\#(export)", "identity": "x@y.z"}"#).json, "code"), "101",
                       "protect works in mounts only")
        XCTAssertEqual(try readFile(export), bytes("exported corporate data"))

        // Encrypt in the mount: a plain file becomes alice's encrypted file; decrypt in place unprotects it.
        try writeFile(daemon.mnt("notes.txt"), bytes("plain notes"))
        XCTAssertFalse(try hasMagic(daemon.back("notes.txt")))
        XCTAssertEqual(try daemon.api("POST", "/v1/files/encrypt", #"{"path": "\#(daemon.mnt("notes.txt"))", "identity": "alice@contoso.com"}"#).status, 200)
        XCTAssertTrue(try hasMagic(daemon.back("notes.txt")))
        XCTAssertEqual(try readFile(daemon.mnt("notes.txt")), bytes("plain notes"))
        XCTAssertEqual(try daemon.api("POST", "/v1/files/decrypt", #"{"path": "\#(daemon.mnt("notes.txt"))"}"#).status, 200)
        XCTAssertEqual(try readFile(daemon.back("notes.txt")), bytes("plain notes"))
        XCTAssertNil(xattr(daemon.mnt("notes.txt"), "user.custody.owner"))
    }

    /// Recursive protect as a job: progress while it runs, the result after; the files change form.
    func testRecursiveProtectIsAJobWithProgress() throws {
        try enroll("alice-oid", "alice@contoso.com", share: true)
        try FileManager.default.createDirectory(atPath: daemon.mnt("tree/a/b"), withIntermediateDirectories: true)
        for index in 0..<60 { try writeFile(daemon.mnt("tree/\(["a", "a/b", ""][index % 3])/f\(index)"), bytes("file \(index) content")) }
        let started = try daemon.apiJSON("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("tree"))", "identity": "alice@contoso.com", "wait": false}"#)
        XCTAssertEqual(started.status, 202, "\(started.json)")
        guard let id = field(started.json, "id") else { return XCTFail("no job id") }
        var job: [String: Any] = [:]
        _ = try? eventually("the job to end", timeout: 30) {
            job = try daemon.apiJSON("GET", "/v1/jobs/\(id)").json
            return field(job, "state") != "running"
        }
        XCTAssertEqual(field(job, "state"), "succeeded", "\(job)")
        XCTAssertEqual(field(job, "progress.done"), "63", "60 files and 3 directories")
        XCTAssertEqual(field(job, "result.owner"), "alice@contoso.com")
        for index in 0..<60 {
            let path = "tree/\(["a", "a/b", ""][index % 3])/f\(index)"
            XCTAssertTrue(try hasMagic(daemon.back(path)), path)
            XCTAssertEqual(try readFile(daemon.mnt(path)), bytes("file \(index) content"))
        }
        // Removing the owner (identity null) makes them plain again, waiting for the result.
        let removed = try daemon.apiJSON("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("tree"))", "identity": null}"#)
        XCTAssertEqual(removed.status, 200)
        XCTAssertNil(field(removed.json, "owner"))
        XCTAssertEqual(try readFile(daemon.back("tree/a/f0")), bytes("file 0 content"))
    }

    func testCanReceiveSharedFileFollowsThePolicies() throws {
        try enroll("alice-oid", "alice@contoso.com")
        try enroll("carol-oid", "carol@contoso.com", share: true)
        try write("from alice", to: daemon.mnt("a.txt"), as: "alice@contoso.com")
        try write("from carol", to: daemon.mnt("c.txt"), as: "carol@contoso.com")
        try writeFile(daemon.mnt("p.txt"), bytes("personal"))
        func decision(_ file: String, _ identity: String) throws -> String? {
            let answer = try daemon.apiJSON("POST", "/v1/files/can-receive", #"{"path": "\#(daemon.mnt(file))", "identity": "\#(identity)"}"#)
            XCTAssertEqual(answer.status, 200, "\(answer.json)")
            return field(answer.json, "allowed")
        }
        XCTAssertEqual(try decision("a.txt", "alice@contoso.com"), "1")
        XCTAssertEqual(try decision("a.txt", "carol@contoso.com"), "0", "alice keeps her files")
        XCTAssertEqual(try decision("c.txt", "alice@contoso.com"), "1", "carol shares hers")
        XCTAssertEqual(try decision("p.txt", "alice@contoso.com"), "1", "unowned files are accepted by default")
        XCTAssertEqual(try daemon.api("PUT", "/v1/accounts/alice@contoso.com/policy", #"{"protectionLevel": "untilFirstAuth", "canReceiveFromUnmanaged": false}"#).status, 200)
        XCTAssertEqual(try decision("p.txt", "alice@contoso.com"), "0")

        // Alice's files do not leave her, not even to no identity: decrypting in place in the
        // mount (removing the owner) is refused and changes nothing.
        let refused = try daemon.apiJSON("POST", "/v1/files/decrypt", #"{"path": "\#(daemon.mnt("a.txt"))"}"#)
        XCTAssertEqual(refused.status, 403)
        XCTAssertEqual(field(refused.json, "name"), "SharingNotAllowed")
        XCTAssertEqual(xattr(daemon.mnt("a.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertTrue(try hasMagic(daemon.back("a.txt")))
    }

    // MARK: Data

    func testDataProtectionForManagedAndUnmanagedIdentities() throws {
        try enroll("alice-oid", "alice@contoso.com")
        let protected = try daemon.apiJSON("POST", "/v1/data/protect", #"{"identity": "alice@contoso.com", "string": "wire transfer 42"}"#)
        XCTAssertEqual(protected.status, 200)
        let sealed = Data(base64Encoded: field(protected.json, "data") ?? "") ?? Data()
        XCTAssertEqual(Array(sealed.prefix(8)), FileHeader.magic)
        XCTAssertNil(String(decoding: sealed, as: UTF8.self).range(of: "wire transfer"), "encrypted")
        let info = try daemon.apiJSON("POST", "/v1/data/info", #"{"data": "\#(sealed.base64EncodedString())"}"#)
        XCTAssertEqual(field(info.json, "encrypted"), "1")
        XCTAssertEqual(field(info.json, "owner"), "alice@contoso.com")
        let opened = try daemon.apiJSON("POST", "/v1/data/unprotect", #"{"data": "\#(sealed.base64EncodedString())"}"#)
        XCTAssertEqual(field(opened.json, "string"), "wire transfer 42")

        // Unmanaged: tagged, plain.
        let tagged = try daemon.apiJSON("POST", "/v1/data/protect", #"{"identity": "someone@gmail.com", "data": "\#(Data("hello".utf8).base64EncodedString())"}"#)
        let tag = Data(base64Encoded: field(tagged.json, "data") ?? "") ?? Data()
        XCTAssertEqual(Array(tag.suffix(5)), bytes("hello"))
        let tagInfo = try daemon.apiJSON("POST", "/v1/data/info", #"{"data": "\#(tag.base64EncodedString())"}"#)
        XCTAssertEqual(field(tagInfo.json, "encrypted"), "0")
        XCTAssertEqual(field(tagInfo.json, "owner"), "someone@gmail.com")
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/data/unprotect", #"{"data": "\#(tag.base64EncodedString())"}"#).json, "string"), "hello")

        // Never protected: unchanged.
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/data/unprotect", #"{"string": "as is"}"#).json, "string"), "as is")
        XCTAssertEqual(field(try daemon.apiJSON("POST", "/v1/data/info", #"{"string": "as is"}"#).json, "isProtected"), "0")

        // Tampered, bad input.
        var broken = sealed
        broken[broken.count - 3] ^= 0x40
        let failed = try daemon.apiJSON("POST", "/v1/data/unprotect", #"{"data": "\#(broken.base64EncodedString())"}"#)
        XCTAssertEqual(failed.status, 422)
        XCTAssertEqual(field(failed.json, "name"), "FailedToUnprotectData")
        XCTAssertEqual(try daemon.api("POST", "/v1/data/unprotect", #"{"data": "***"}"#).status, 400)
        XCTAssertEqual(try daemon.api("POST", "/v1/data/protect", #"{"identity": "a@b.c", "data": "aGk=", "string": "hi"}"#).status, 400)

        // A class A identity, locked: 423.
        try enroll("dave-oid", "dave@contoso.com", level: "complete", passphrase: "pw")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/dave@contoso.com/lock").status, 200)
        let locked = try daemon.apiJSON("POST", "/v1/data/protect", #"{"identity": "dave@contoso.com", "string": "x"}"#)
        XCTAssertEqual(locked.status, 423)
        XCTAssertEqual(field(locked.json, "code"), "305")
    }

    // MARK: Robustness

    func testMalformedRequestsGetDocumentedErrorsAndTheDaemonKeepsServing() throws {
        let cases: [(String, String, String?, Int, String)] = [
            ("POST", "/v1/accounts", "{not json", 400, "BadRequest"),
            ("POST", "/v1/accounts", #"{"id": 5, "upn": "x@y.z"}"#, 400, "BadRequest"),
            ("POST", "/v1/accounts", #"{"upn": "x@y.z"}"#, 400, "BadRequest"),
            ("POST", "/v1/bindings", #"{"pid": "twelve", "identity": "a"}"#, 400, "BadRequest"),
            ("PUT", "/v1/accounts/nobody@x.y/policy", #"{"protectionLevel": "ultra"}"#, 400, "InvalidPolicy"),
            ("GET", "/v1/nothing", nil, 404, "UnknownRoute"),
            ("GET", "/v2/status", nil, 404, "UnknownRoute"),
            ("DELETE", "/v1/status", nil, 405, "MethodNotAllowed"),
            ("GET", "/v1/accounts/nobody@nowhere.example", nil, 404, "UnknownAccount"),
            ("POST", "/v1/accounts/nobody@nowhere.example/lock", nil, 404, "UnknownAccount"),
            ("GET", "/v1/jobs/12345", nil, 404, "UnknownJob"),
            ("DELETE", "/v1/bindings/abc", nil, 400, "BadRequest"),
        ]
        for (method, path, body, status, name) in cases {
            let answer = try daemon.apiJSON(method, path, body)
            XCTAssertEqual(answer.status, status, "\(method) \(path) \(body ?? ""): \(answer.json)")
            XCTAssertEqual(field(answer.json, "name"), name, "\(method) \(path)")
            XCTAssertNotNil(field(answer.json, "message"))
            XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200, "still serving after \(method) \(path)")
        }
        // A body over 1 MiB.
        let huge = outside + "/huge.json"
        try writeFile(huge, [UInt8](repeating: UInt8(ascii: "a"), count: 2 << 20))
        let result = try runCommand(["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket", daemon.socket, "-X", "POST",
                                     "--data-binary", "@" + huge, "http://localhost/v1/accounts"])
        XCTAssertTrue(result.output.contains("RequestTooLarge") || result.output.hasSuffix("413") || result.output.hasSuffix("000"), result.output)
        XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200)
    }

    /// Clients that disconnect mid-request and mid-stream, and many at once.
    func testDisconnectsAndManyConcurrentClients() throws {
        for partial in ["", "GET /v1/sta", "POST /v1/accounts HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"id\":"] {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                raw.copyBytes(from: Array(daemon.socket.utf8))
            }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            XCTAssertEqual(connected, 0)
            _ = partial.withCString { send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            close(fd)
        }
        // An event stream whose client goes away.
        let streamLog = outside + "/stream.log"
        let stream = try spawn("curl", ["-s", "-N", "--unix-socket", daemon.socket, "http://localhost/v1/events"], stdoutPath: streamLog)
        children.append(stream)
        try enroll("alice-oid", "alice@contoso.com")
        _ = try? eventually("the stream to deliver") { ((try? String(contentsOfFile: streamLog, encoding: .utf8)) ?? "").contains("\"enrolled\"") }
        XCTAssertTrue(((try? String(contentsOfFile: streamLog, encoding: .utf8)) ?? "").contains(#""kind":"enrolled""#), "the stream delivered the event")
        kill(stream, SIGKILL)
        waitForExit(stream, seconds: 5)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200, "events after the client left")

        // Forty clients at once.
        let script = "for i in $(seq 40); do curl -s -o /dev/null -w '%{http_code}\\n' --unix-socket '\(daemon.socket)' http://localhost/v1/status & done; wait"
        let statuses = try runCommand(["sh", "-c", script]).output.split(separator: "\n")
        XCTAssertEqual(statuses.filter { $0 == "200" }.count, 40, "\(statuses)")
    }

    func testEventStreamReplaysAndFilters() throws {
        try enroll("alice-oid", "alice@contoso.com")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)
        let all = try daemon.api("GET", "/v1/events?follow=false").body.split(separator: "\n")
        let kinds = all.compactMap { line in (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] }.compactMap { $0["kind"] as? String }
        XCTAssertEqual(Array(kinds.prefix(1)), ["enrolled"])
        XCTAssertTrue(kinds.contains("lockRequested") && kinds.contains("locked"), "\(kinds)")
        let after = try daemon.api("GET", "/v1/events?follow=false&after=1").body
        XCTAssertFalse(after.contains(#""sequence":1,"#), after)
    }

    // MARK: Authorization

    /// The socket's mode and group come from the options.
    func testSocketModeAndGroupAreConfigurable() throws {
        let user = try testUser()
        guard let group = getpwuid(user)?.pointee.pw_gid else { return XCTFail("no group for the test user") }
        let other = try MountedDaemon(extraArguments: ["--socket-mode", "0640", "--socket-group", "\(group)"])
        defer { other.destroy() }
        let attributes = try Syscall.lstat(other.socket)
        XCTAssertEqual(attributes.st_mode & 0o777, 0o640)
        XCTAssertEqual(attributes.st_gid, group)
        XCTAssertEqual(attributes.st_mode & S_IFMT, S_IFSOCK)
        let refused = try runCommand([MountedDaemon.binary, "--socket-mode", "999", "/tmp", "/tmp"])
        XCTAssertEqual(refused.status, 64, refused.error)
        XCTAssertTrue(refused.error.contains("--socket-mode"), refused.error)
        let unknown = try runCommand([MountedDaemon.binary, "--socket-group", "no-such-group-here", "/tmp", "/tmp"])
        XCTAssertEqual(unknown.status, 64, unknown.error)
    }

    func testWrongPassphrasesAreCountedInTheStatusAndSurviveARestart() throws {
        try enroll("alice-oid", "alice@contoso.com", passphrase: "right")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)
        for _ in 0..<3 { XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "wrong"}"#).status, 403) }
        let limited = try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "right"}"#)
        XCTAssertEqual(limited.status, 429, "the right passphrase waits too: \(limited.body)")
        var status = try daemon.api("GET", "/v1/status").body
        XCTAssertTrue(status.contains(#""failedUnlockAttempts":3"#), status)
        daemon.stop()
        try daemon.start(extraArguments: ["--multi-identity"])
        status = try daemon.api("GET", "/v1/status").body
        XCTAssertTrue(status.contains(#""failedUnlockAttempts":3"#), "a restart resets nothing: \(status)")
        usleep(1_100_000)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "right"}"#).status, 200)
        XCTAssertTrue(try daemon.api("GET", "/v1/status").body.contains(#""failedUnlockAttempts":0"#))
    }

    /// The answers about files and data do not name another user's account (the account routes
    /// answer 404 for it), and errors about a file in a mount name it as the caller did.
    func testAnswersDoNotNameOtherUsersAccountsOrTheBackingStore() throws {
        let user = try testUser()
        try daemon.openToOtherUsers()
        try enroll("erin-oid", "erin@contoso.com", level: "none")
        try writeFile(daemon.mnt("report.txt"), bytes("erin's"))
        XCTAssertEqual(try daemon.api("POST", "/v1/files/encrypt", #"{"path": "\#(daemon.mnt("report.txt"))", "identity": "erin@contoso.com"}"#).status, 200)
        XCTAssertEqual(chmod(daemon.mnt("report.txt"), 0o644), 0)
        let blob = try XCTUnwrap(field(try daemon.apiJSON("POST", "/v1/data/protect", #"{"identity": "erin@contoso.com", "string": "x"}"#).json, "data"))

        // The administrator sees the owner; another user does not.
        let asAdmin = try daemon.api("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("report.txt"))"}"#)
        XCTAssertTrue(asAdmin.body.contains("erin@contoso.com"), asAdmin.body)
        for (path, body) in [("/v1/files/info", #"{"path": "\#(daemon.mnt("report.txt"))"}"#), ("/v1/data/info", #"{"data": "\#(blob)"}"#),
                             ("/v1/files/can-receive", #"{"path": "\#(daemon.mnt("report.txt"))", "identity": "someone@example.org"}"#)] {
            let answer = try daemon.api("POST", path, body, asUser: user)
            XCTAssertEqual(answer.status, 200, "\(path): \(answer.body)")
            XCTAssertFalse(answer.body.contains("erin"), "\(path) names the account: \(answer.body)")
        }
        XCTAssertTrue(try daemon.api("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("report.txt"))"}"#, asUser: user).body.contains(#""encrypted":true"#))

        // A missing file in the mount is named by its path in the mount.
        for path in ["/v1/files/info", "/v1/files/is-encrypted", "/v1/files/decrypt", "/v1/files/repair"] {
            let answer = try daemon.api("POST", path, #"{"path": "\#(daemon.mnt("no/such.txt"))"}"#)
            XCTAssertGreaterThanOrEqual(answer.status, 400, "\(path): \(answer.body)")
            XCTAssertFalse(answer.body.contains(daemon.backing), "\(path) names the backing store: \(answer.body)")
            let missing = try daemon.api("POST", path, #"{"path": "\#(daemon.mnt("missing.txt"))"}"#)
            XCTAssertFalse(missing.body.contains(daemon.backing), "\(path) names the backing store: \(missing.body)")
        }
    }

    func testNonAdminUserIsLimitedToItsOwnAccountsFilesAndProcesses() throws {
        let user = try testUser()
        try daemon.openToOtherUsers()
        try enroll("alice-oid", "alice@contoso.com", uid: user)
        try enroll("erin-oid", "erin@contoso.com")

        func status(_ method: String, _ path: String, _ body: String? = nil) throws -> Int { try daemon.api(method, path, body, asUser: user).status }
        XCTAssertEqual(try status("GET", "/v1/status"), 200)
        XCTAssertEqual(try status("POST", "/v1/accounts", #"{"id": "x", "upn": "x@y.z"}"#), 403)
        XCTAssertEqual(try status("PUT", "/v1/accounts/alice@contoso.com/policy", "{}"), 403)
        XCTAssertEqual(try status("POST", "/v1/accounts/alice@contoso.com/wipe"), 403)
        XCTAssertEqual(try status("DELETE", "/v1/accounts/erin@contoso.com?wipe=true"), 403)
        XCTAssertEqual(try status("POST", "/v1/lock"), 403)
        XCTAssertEqual(try status("POST", "/v1/accounts/erin@contoso.com/lock"), 403, "not its account")
        XCTAssertEqual(try status("POST", "/v1/accounts/alice@contoso.com/lock"), 200, "its own account")
        XCTAssertEqual(try status("POST", "/v1/accounts/alice@contoso.com/unlock", "{}"), 200)
        let denied = try daemon.apiJSON("POST", "/v1/lock", asUser: user)
        XCTAssertEqual(field(denied.json, "code"), "401")
        XCTAssertEqual(field(denied.json, "name"), "NotAuthorized")
        // It sees its own account only: not in lists, not by name (answered as unknown).
        let listed = try daemon.api("GET", "/v1/accounts", asUser: user)
        XCTAssertEqual(listed.status, 200)
        XCTAssertTrue(listed.body.contains("alice@contoso.com"), listed.body)
        XCTAssertFalse(listed.body.contains("erin"), listed.body)
        let seen = try daemon.api("GET", "/v1/status", asUser: user).body
        XCTAssertTrue(seen.contains("alice@contoso.com") && !seen.contains("erin"), seen)
        XCTAssertTrue(try daemon.api("GET", "/v1/status").body.contains("erin@contoso.com"), "an administrator sees every account")
        XCTAssertEqual(try status("GET", "/v1/accounts/alice@contoso.com"), 200)
        XCTAssertEqual(try status("GET", "/v1/accounts/alice@contoso.com/policy"), 200)
        let hidden = try daemon.apiJSON("GET", "/v1/accounts/erin@contoso.com", asUser: user)
        XCTAssertEqual(hidden.status, 404)
        XCTAssertEqual(field(hidden.json, "name"), "UnknownAccount")
        XCTAssertEqual(try status("GET", "/v1/accounts/ERIN-OID/policy"), 404)
        // Jobs: its own only (an administrator's wipe job names the wiped account).
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "gone-oid", "upn": "gone@contoso.com", "enroll": false}"#).status, 201)
        let wipeJob = try daemon.apiJSON("POST", "/v1/accounts/gone@contoso.com/wipe?wait=false")
        XCTAssertEqual(wipeJob.status, 202)
        let jobID = try XCTUnwrap(field(wipeJob.json, "id"))
        XCTAssertFalse(try daemon.api("GET", "/v1/jobs", asUser: user).body.contains("gone@contoso.com"))
        XCTAssertEqual(try status("GET", "/v1/jobs/\(jobID)"), 404)
        XCTAssertEqual(try daemon.api("GET", "/v1/jobs/\(jobID)").status, 200, "the administrator sees it")

        // Processes: its own, not root's; identities: its own or unmanaged.
        let own = try spawnSleeper(asUser: user)
        let roots = try spawnSleeper()
        children += [own, roots]
        XCTAssertEqual(try status("POST", "/v1/bindings", #"{"pid": \#(own), "identity": "alice@contoso.com"}"#), 201)
        XCTAssertEqual(try status("POST", "/v1/bindings", #"{"pid": \#(own), "identity": "erin@contoso.com"}"#), 403)
        XCTAssertEqual(try status("POST", "/v1/bindings", #"{"pid": \#(roots), "identity": "alice@contoso.com"}"#), 403)
        XCTAssertEqual(try status("GET", "/v1/processes/\(own)/identity"), 200)
        XCTAssertEqual(try status("GET", "/v1/processes/\(roots)/identity"), 403, "whose identity root's process has is not its business")

        // Files: only what it could read or write itself; data and exports only for its accounts.
        try writeFile(daemon.mnt("root-only.txt"), bytes("root's"), mode: 0o600)
        XCTAssertEqual(try status("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("root-only.txt"))"}"#), 403)
        XCTAssertEqual(try status("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("root-only.txt"))", "identity": "alice@contoso.com"}"#), 403)
        XCTAssertEqual(try status("POST", "/v1/files/encrypt", #"{"path": "/etc/hostname", "identity": "alice@contoso.com"}"#), 403)
        XCTAssertEqual(try readFile(daemon.mnt("root-only.txt")), bytes("root's"))
        try mustRun(["chmod", "0755", outside])
        let mine = outside + "/mine.txt"
        try writeFile(mine, bytes("user's export"))
        try mustRun(["chown", "\(user):\(user)", mine])
        XCTAssertEqual(try status("POST", "/v1/files/encrypt", #"{"path": "\#(mine)", "identity": "erin@contoso.com"}"#), 403)
        XCTAssertEqual(try readFile(mine), bytes("user's export"))
        XCTAssertEqual(try status("POST", "/v1/data/protect", #"{"identity": "erin@contoso.com", "string": "x"}"#), 403)
        XCTAssertEqual(try status("POST", "/v1/data/protect", #"{"identity": "alice@contoso.com", "string": "x"}"#), 200)
        // A user holds at most 8 event streams (the connections are shared by everyone).
        var streams: [pid_t] = []
        for _ in 0..<8 {
            streams.append(try spawn("setpriv", ["--reuid=\(user)", "--regid=\(user)", "--clear-groups", "curl", "-s", "-N", "--unix-socket", daemon.socket, "http://localhost/v1/events"]))
        }
        children += streams
        func streamStatus() throws -> Int {
            let result = try runCommand(["setpriv", "--reuid=\(user)", "--regid=\(user)", "--clear-groups", "curl", "-s", "-m", "1", "-o", "/dev/null",
                                         "-w", "%{http_code}", "--unix-socket", daemon.socket, "http://localhost/v1/events?after=latest"])
            return Int(result.output) ?? 0
        }
        var ninth = 0
        for _ in 0..<100 {
            ninth = try streamStatus()
            if ninth == 503 { break }
            usleep(50_000)
        }
        XCTAssertEqual(ninth, 503, "the ninth stream is refused")
        XCTAssertEqual(try daemon.api("GET", "/v1/events?follow=false").status, 200, "others are served")
        for stream in streams { kill(stream, SIGKILL); waitForExit(stream, seconds: 5) }
        var again = 0
        for _ in 0..<30 {
            // Streams are released when the daemon notices the clients are gone (within about a second).
            again = try streamStatus()
            if again == 200 { break }
            usleep(100_000)
        }
        XCTAssertEqual(again, 200, "a stream is allowed again once the others closed")

        // Its file, outside the mount, in a directory it cannot write: the daemon does not write there for it.
        XCTAssertEqual(try status("POST", "/v1/files/encrypt", #"{"path": "\#(mine)", "identity": "alice@contoso.com"}"#), 403)
        XCTAssertEqual(try readFile(mine), bytes("user's export"))
    }
}
