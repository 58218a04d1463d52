import CustodyTestSupport
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Enrolment acts on what exists: files an identity wrote while it was unmanaged are brought to its
/// policy, `info` says why a managed owner's file is plain, and an account deregistered with its
/// keys kept comes back with its policy.
final class EnrolmentTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    /// The first bytes of the stored file: the header's magic for an encrypted one.
    func storedIsEncrypted(_ name: String) throws -> Bool {
        let stored = try readFile(daemon.back(name))
        return xattr(daemon.mnt(name), "user.custody.encrypted") == "1" && !String(decoding: stored, as: UTF8.self).contains("written meanwhile")
    }

    func testEnrollingAgainProtectsWhatTheIdentityWroteWhileUnmanaged() throws {
        daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=alice@contoso.com"])
        let enroll = #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", enroll).status, 201)
        try writeFile(daemon.mnt("before.txt"), bytes("wiped with her\n"))
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/wipe").status, 200)
        // Unmanaged now: what root writes is hers, plain, her name recorded.
        try mustRun(["sh", "-c", "mkdir '\(daemon.mnt("notes"))' && printf 'written meanwhile\\n' > '\(daemon.mnt("notes/meanwhile.txt"))'"])
        let plain = try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("notes/meanwhile.txt"))"}"#).json
        XCTAssertEqual(plain["owner"] as? String, "alice@contoso.com")
        XCTAssertEqual(plain["managed"] as? Bool, false)
        XCTAssertNil(plain["plainReason"], "an unmanaged owner's file is plain without a reason to give")
        XCTAssertTrue(String(decoding: try readFile(daemon.back("notes/meanwhile.txt")), as: UTF8.self).contains("written meanwhile"))

        // Enrolled again: her files are brought to her policy, as after a policy change.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", enroll).status, 201)
        do {
            try eventually("the file written meanwhile is encrypted") { try storedIsEncrypted("notes/meanwhile.txt") }
        } catch {
            XCTFail("\(error); the daemon's log:\n\(daemon.log.split(separator: "\n").suffix(30).joined(separator: "\n"))")
            throw error
        }
        XCTAssertEqual(try readFile(daemon.mnt("notes/meanwhile.txt")), bytes("written meanwhile\n"))
        try eventually("the re-protection is done") {
            (try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com").json["reprotectPending"] as? Bool ?? false) == false
        }
        let info = try daemon.ctl(["info", daemon.mnt("notes/meanwhile.txt")])
        XCTAssertTrue(info.output.contains("owner: alice@contoso.com (managed)") && info.output.contains("encrypted: yes, class none"), info.output)

        // A managed owner's plain file always says why.
        XCTAssertEqual(try daemon.ctl(["policy", "alice@contoso.com", "--encryption", "false"]).status, 0)
        try eventually("the file is plain again") { !(try storedIsEncrypted("notes/meanwhile.txt")) }
        let why = try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(daemon.mnt("notes/meanwhile.txt"))"}"#).json
        XCTAssertEqual(why["managed"] as? Bool, true)
        XCTAssertEqual(why["encrypted"] as? Bool, false)
        XCTAssertEqual(why["plainReason"] as? String, "the policy of alice@contoso.com does not require encryption")
        let text = try daemon.ctl(["info", daemon.mnt("notes/meanwhile.txt")])
        XCTAssertTrue(text.output.contains("encrypted: no: the policy of alice@contoso.com does not require encryption"), text.output)
    }

    func testADeregisteredAccountComesBackWithItsPolicy() throws {
        daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=alice@contoso.com"])
        let passphrase = daemon.root + "/passphrase"
        try "pw\n".write(toFile: passphrase, atomically: true, encoding: .utf8)
        let first = try daemon.ctl(["enroll", "alice-oid", "alice@contoso.com", "--level", "untilFirstAuth", "--save-to", "AccountDocument",
                                    "--passphrase-file", passphrase])
        XCTAssertEqual(first.status, 0, first.error)
        try writeFile(daemon.mnt("kept.txt"), bytes("kept\n"))
        XCTAssertEqual(try daemon.ctl(["deregister", "alice@contoso.com"]).status, 0)
        // The kept keys need their passphrase, and the error says how to give it.
        let refused = try daemon.ctl(["enroll", "alice-oid", "alice@contoso.com"])
        XCTAssertEqual(refused.status, 1)
        XCTAssertTrue(refused.error.contains("302") && refused.error.contains("enrolled before") && refused.error.contains("--passphrase-file"), refused.error)
        let again = try daemon.ctl(["enroll", "alice-oid", "alice@contoso.com", "--passphrase-file", passphrase, "--json"])
        XCTAssertEqual(again.status, 0, again.error)
        let policy = try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com/policy").json
        XCTAssertEqual(policy["protectionLevel"] as? String, "untilFirstAuth", "the earlier policy is back")
        XCTAssertEqual(policy["saveToLocations"] as? [String], ["AccountDocument"])
        XCTAssertEqual(try readFile(daemon.mnt("kept.txt")), bytes("kept\n"))
    }

    /// A reload whose AllowedAccounts no longer names an enrolled account: the status, the list
    /// and an event say so, and AllowedAccountsAction decides.
    func testAReloadThatStopsAllowingAnAccountSaysSoAndActs() throws {
        let config = try makeTemporaryDirectory("custody-allowed") + "/custody.toml"
        defer { _ = try? runCommand(["rm", "-rf", URL(fileURLWithPath: config).deletingLastPathComponent().path]) }
        func write(_ allowed: String, _ action: String) throws {
            try "[settings]\nMultiIdentity = true\nAllowedAccounts = [\(allowed)]\nAllowedAccountsAction = \"\(action)\"\n"
                .write(toFile: config, atomically: true, encoding: .utf8)
        }
        try write(#""alice@contoso.com", "bob@contoso.com""#, "warn")
        // The mount and the default identity come from the command line: a reload keeps them.
        daemon = try MountedDaemon(extraArguments: ["--config", config, "--default-identity", "0=bob@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        try writeFile(daemon.mnt("bob.txt"), bytes("bob's\n"))
        func reload() throws {
            let before = daemon.log.components(separatedBy: "configuration reloaded").count
            kill(daemon.pid, SIGHUP)
            try eventually("the reload") { self.daemon.log.components(separatedBy: "configuration reloaded").count > before }
        }

        try write(#""alice@contoso.com""#, "warn")
        try reload()
        let listed = try daemon.apiJSON("GET", "/v1/allowed-accounts").json
        XCTAssertEqual(listed["allowedAccounts"] as? [String], ["alice@contoso.com"])
        XCTAssertEqual(listed["action"] as? String, "warn")
        XCTAssertEqual(listed["notAllowed"] as? [String], ["bob@contoso.com"])
        let accounts = try daemon.apiJSON("GET", "/v1/status").json["accounts"] as? [[String: Any]] ?? []
        XCTAssertEqual(accounts.first { $0["upn"] as? String == "bob@contoso.com" }?["allowed"] as? Bool, false)
        XCTAssertNil(accounts.first { $0["upn"] as? String == "alice@contoso.com" }?["allowed"])
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains(#""kind":"allowedAccountsChanged""#), events)
        XCTAssertTrue(events.contains("bob@contoso.com is enrolled, but AllowedAccounts does not name it: it stays enrolled (AllowedAccountsAction = warn)"), events)
        XCTAssertEqual(try readFile(daemon.mnt("bob.txt")), bytes("bob's\n"), "warn changes nothing")
        try daemon.openToOtherUsers()
        XCTAssertEqual(try daemon.api("GET", "/v1/allowed-accounts", asUser: 65534).status, 403)

        // deregister: keys kept sealed, the file stays encrypted and unreadable.
        try write(#""alice@contoso.com""#, "deregister")
        try reload()
        try eventually("bob is deregistered") { try self.daemon.api("GET", "/v1/accounts/bob@contoso.com").status == 404 }
        XCTAssertEqual(try daemon.apiJSON("GET", "/v1/allowed-accounts").json["notAllowed"] as? [String], [])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.backing).filter { !$0.hasPrefix(".") }.count, 1)
    }

    /// Accounts declared in the configuration are enrolled at start and on reload, idempotently;
    /// a mount that requires a policy creates nothing until one exists.
    func testDeclaredAccountsAndAMountThatWaitsForItsPolicy() throws {
        let directory = try makeTemporaryDirectory("custody-declared")
        defer { _ = try? runCommand(["rm", "-rf", directory]) }
        let config = directory + "/custody.toml"
        func write(_ accounts: String) throws {
            try ("[settings]\nMultiIdentity = true\nAllowedAccountsAction = \"deregister\"\n" + accounts).write(toFile: config, atomically: true, encoding: .utf8)
        }
        try write("")
        daemon = try MountedDaemon(extraArguments: ["--config", config, "--policy-required", "--default-identity", "0=alice@contoso.com"])
        func reload() throws {
            let before = daemon.log.components(separatedBy: "configuration reloaded").count
            kill(daemon.pid, SIGHUP)
            try eventually("the reload") { self.daemon.log.components(separatedBy: "configuration reloaded").count > before }
        }
        // No policy yet: nothing is created, and an event says why.
        XCTAssertEqual(errnoOf { try writeFile(self.daemon.mnt("early.txt"), bytes("too early\n")) }, EACCES)
        XCTAssertEqual(errnoOf { if mkdir(self.daemon.mnt("dir"), 0o755) != 0 { throw Errno.current } }, EACCES)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.backing), [], "nothing reached the disk")
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains("creates nothing until its policy exists (policy_required): waiting for any account to be enrolled"), events)

        // Declared: enrolled at the reload, with its policy; files are created, encrypted.
        let declared = """
            [[account]]
            id = "alice-oid"
            upn = "alice@contoso.com"
            user = "root"
            [account.policy]
            protectionLevel = "untilFirstAuth"
            saveToLocations = ["AccountDocument"]
            """
        try write(declared)
        try reload()
        let policy = try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com/policy").json
        XCTAssertEqual(policy["protectionLevel"] as? String, "untilFirstAuth")
        XCTAssertEqual(policy["saveToLocations"] as? [String], ["AccountDocument"])
        XCTAssertEqual(try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com").json["uid"] as? Int, 0)
        try writeFile(daemon.mnt("report.txt"), bytes("numbers\n"))
        XCTAssertEqual(xattr(daemon.mnt("report.txt"), "user.custody.encrypted"), "1")
        // The same file again: nothing changes, nothing is said.
        let enrolledEvents = try daemon.api("GET", "/v1/events?follow=false").body.components(separatedBy: "\"kind\":\"enrolled\"").count
        try reload()
        let after = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertEqual(after.components(separatedBy: "\"kind\":\"enrolled\"").count, enrolledEvents)
        XCTAssertFalse(after.contains(#""kind":"policyChanged""#), "an unchanged declaration changes no policy")
        // A changed policy is applied; a removed account follows AllowedAccountsAction.
        try write(declared.replacingOccurrences(of: "untilFirstAuth", with: "none"))
        try reload()
        XCTAssertEqual(try daemon.apiJSON("GET", "/v1/accounts/alice@contoso.com/policy").json["protectionLevel"] as? String, "none")
        try write("")
        try reload()
        try eventually("alice is deregistered") { try self.daemon.api("GET", "/v1/accounts/alice@contoso.com").status == 404 }
        let last = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(last.contains("alice@contoso.com is enrolled, but the configuration no longer declares it: deregistering it"), last)
        XCTAssertThrowsError(try writeFile(daemon.mnt("late.txt"), bytes("no policy again\n")), "no policy again") {
            XCTAssertEqual(($0 as? Errno)?.rawValue, EACCES, "\($0)")
        }
    }
}
