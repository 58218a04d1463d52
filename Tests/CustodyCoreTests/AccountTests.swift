@testable import CustodyCore
import CustodyCrypto
import CustodySystem
import CustodyFormat
import Foundation
import XCTest
import CustodyTestSupport

final class AccountTests: EngineTestCase {
    func testRegisterEnrollListAndCaseInsensitiveLookup() throws {
        let engine = try makeEngine()
        let events = recorded(engine)
        try engine.register(id: "3ec2c00f-b125-4519-acf0-302ac3761822", upn: "Bob@Personal.example")
        let alice = try engine.enroll(id: "A1B2-C3", upn: "Alice@Contoso.com", policy: Policy(protectionLevel: .completeUnlessOpen))
        XCTAssertTrue(alice.isEnrolled)
        XCTAssertEqual(try engine.account("alice@CONTOSO.com").id, "A1B2-C3", "UPN, any case")
        XCTAssertEqual(try engine.account("a1b2-c3").upn, "Alice@Contoso.com", "object ID, any case; the answer keeps its spelling")
        XCTAssertEqual(engine.accounts().count, 2)
        XCTAssertEqual(engine.accounts().filter(\.isEnrolled).map(\.upn), ["Alice@Contoso.com"])
        XCTAssertThrowsError(try engine.account("nobody@x")) { XCTAssertEqual(($0 as? EngineError)?.code, 300) }
        XCTAssertThrowsError(try engine.register(id: " ", upn: "x")) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }
        let kinds = events.withLock { $0.map(\.kind) }
        XCTAssertEqual(kinds, [.registered, .enrolled, .reprotectRequired], "files it may have already are brought to its policy")
        XCTAssertEqual(events.withLock { $0.first { $0.kind == .enrolled }?.code }, 100, "enrollment reports NewPoliciesReceived")
    }

    /// Every way an identity enters takes the one rule an owner obeys (what the API's schema
    /// states): some character that is not whitespace, no NUL, at most 180 bytes.
    func testIdentitiesThatCannotOwnAFileAreRefusedEverywhere() throws {
        let engine = try makeEngine(testSettings(multiIdentity: true))
        let bad = ["", " ", "\u{85}", "\u{3000}\t", "a\u{0}b", String(repeating: "é", count: 91), String(repeating: "x", count: 181)]
        for identity in bad {
            XCTAssertThrowsError(try engine.enroll(id: identity, upn: "ok@x"), identity.debugDescription) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }
            XCTAssertThrowsError(try engine.register(id: "ok-id", upn: identity), identity.debugDescription) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }
            XCTAssertThrowsError(try engine.protectData([1, 2], for: identity), identity.debugDescription) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }
            XCTAssertThrowsError(try engine.bindProcess(getpid(), to: identity), identity.debugDescription) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }
        }
        XCTAssertEqual(engine.accounts().count, 0, "nothing was registered")
        XCTAssertEqual(try Account.checkedName("  \u{A0}Alice@Contoso.com\u{2003}"), "Alice@Contoso.com")
        XCTAssertEqual(try Account.checkedName(String(repeating: "x", count: 180)).utf8.count, 180)
        try engine.enroll(id: " \u{85}alice-id", upn: "alice@contoso.com\u{3000}")
        XCTAssertEqual(try engine.account("alice-id").upn, "alice@contoso.com")
    }

    func testEnrollmentRulesAndTheirCodes() throws {
        var settings = testSettings(multiIdentity: false)
        settings.allowedAccounts = ["alice@contoso.com", "CAROL-ID"]
        let engine = try makeEngine(settings)
        let events = recorded(engine)
        XCTAssertThrowsError(try engine.enroll(id: "mallory", upn: "mallory@evil.example")) {
            XCTAssertEqual($0 as? EngineError, .accountNotAllowed("mallory@evil.example"))
            XCTAssertEqual(($0 as? EngineError)?.code, 209)
        }
        try engine.enroll(id: "alice-id", upn: "Alice@Contoso.com")
        XCTAssertThrowsError(try engine.enroll(id: "alice-id", upn: "alice@contoso.com")) {
            XCTAssertEqual(($0 as? EngineError)?.code, 208, "AlreadyEnrolled")
        }
        XCTAssertThrowsError(try engine.enroll(id: "carol-id", upn: "carol@contoso.com")) {
            XCTAssertEqual($0 as? EngineError, .singleManagedAccountMode(enrolled: "Alice@Contoso.com"))
            XCTAssertEqual(($0 as? EngineError)?.code, 227)
        }
        let failures = events.withLock { $0.filter { $0.kind == .enrollmentFailed }.compactMap(\.code) }
        XCTAssertEqual(failures, [209, 208, 227], "each failure is an event with its code")

        let multi = try Engine(stateDirectory: directory + "/multi", settings: testSettings(multiIdentity: true), clock: ManualClock(), processes: FakeProcessTable())
        try multi.enroll(id: "a", upn: "a@x")
        try multi.enroll(id: "b", upn: "b@x")
        XCTAssertEqual(multi.accounts().filter(\.isEnrolled).count, 2, "MultiIdentity allows several managed accounts")
    }

    func testPolicyChangesEmitEventsAndMarkReprotection() throws {
        var settings = testSettings()
        settings.maxFileProtectionLevel = .completeUnlessOpen
        let engine = try makeEngine(settings)
        try engine.register(id: "bob", upn: "bob@personal.example")
        try engine.enroll(id: "alice", upn: "alice@contoso.com", policy: Policy(protectionLevel: .complete))
        XCTAssertEqual(engine.effectiveProtection(for: "alice@contoso.com"), .completeUnlessOpen, "min(policy, MaxFileProtectionLevel)")
        XCTAssertNil(engine.effectiveProtection(for: "bob@personal.example"), "registered but not enrolled: unmanaged")
        XCTAssertNil(engine.effectiveProtection(for: "stranger@x"), "unknown identity: unmanaged")
        let events = recorded(engine)
        var policy = Policy(protectionLevel: .untilFirstAuthentication)
        let changed = try engine.setPolicy("ALICE@contoso.com", policy)
        XCTAssertTrue(changed.reprotectPending)
        XCTAssertEqual(engine.effectiveProtection(for: "alice"), .untilFirstAuthentication)
        try engine.setPolicy("alice", policy)
        policy.fileEncryptionRequired = false
        try engine.setPolicy("alice", policy)
        XCTAssertNil(engine.effectiveProtection(for: "alice"), "encryption not required: plain files")
        let seen = events.withLock { $0.map { "\($0.kind.rawValue):\($0.code.map(String.init) ?? "-")" } }
        XCTAssertEqual(seen, ["policyChanged:100", "reprotectRequired:-", "policyUnchanged:101", "policyChanged:100", "reprotectRequired:-"])
        try engine.reprotectFinished("alice")
        XCTAssertFalse(try engine.account("alice").reprotectPending)
        XCTAssertThrowsError(try engine.setPolicy("bob", policy)) { XCTAssertEqual(($0 as? EngineError)?.code, 214) }
    }

    func testPolicyAndSettingsAcceptTheSDKAndConsoleNames() throws {
        let policy = try JSONDecoder().decode(Policy.self, from: Data(#"{"protectionLevel": "locked except open files", "fileProviderEncryptionRequired": true}"#.utf8))
        XCTAssertEqual(policy.protectionLevel, .completeUnlessOpen)
        XCTAssertTrue(policy.fileEncryptionRequired, "defaults fill what is missing")
        XCTAssertTrue(policy.fileProviderEncryptionRequired)
        XCTAssertThrowsError(try JSONDecoder().decode(Policy.self, from: Data(#"{"protectionLevel": "sometimes"}"#.utf8)))
        let settings = try JSONDecoder().decode(Settings.self, from: Data(#"{"MaxFileProtectionLevel": "NSFileProtectionCompleteUntilFirstUserAuthentication", "MultiIdentity": true, "ValuesToScrubFromLogging": ["alice@contoso.com"]}"#.utf8))
        XCTAssertEqual(settings.maxFileProtectionLevel, .untilFirstAuthentication)
        XCTAssertTrue(settings.multiIdentity)
        XCTAssertEqual(settings.lockGracePeriod, 10, "default grace period")
        XCTAssertEqual(settings.valuesToScrubFromLogging, ["alice@contoso.com"])
        let roundTrip = try JSONDecoder().decode(Settings.self, from: JSONEncoder().encode(settings))
        XCTAssertEqual(roundTrip, settings)
        XCTAssertEqual(Settings().maxFileProtectionLevel, .complete)
    }

    final class RecordingWipe: WipeHandler, @unchecked Sendable {
        var wiped: [String] = []
        var keybagExistedDuringWipe: Bool?
        let keybagPath: String
        init(keybagPath: String) { self.keybagPath = keybagPath }
        func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws(Errno) {
            keybagExistedDuringWipe = FileManager.default.fileExists(atPath: keybagPath)
            progress(3, 1, 4096)
            wiped.append(account.upn)
        }
    }

    func testDeregisterWithWipeDestroysKeysFirstThenCallsTheHook() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        let keybag = directory + "/" + engine.files.keybagName("alice")
        XCTAssertTrue(FileManager.default.fileExists(atPath: keybag))
        let handler = RecordingWipe(keybagPath: keybag)
        engine.wipeHandler = handler
        let events = recorded(engine)
        try engine.deregister("Alice@Contoso.com", wipe: true)
        XCTAssertEqual(handler.wiped, ["alice@contoso.com"])
        XCTAssertEqual(handler.keybagExistedDuringWipe, false, "keys are gone before files are deleted")
        XCTAssertFalse(FileManager.default.fileExists(atPath: keybag))
        XCTAssertThrowsError(try engine.account("alice"))
        XCTAssertThrowsError(try engine.classKey(for: "alice", .none, purpose: .open))
        let seen = events.withLock { $0.map { "\($0.kind.rawValue):\($0.code.map(String.init) ?? "-")" } }
        XCTAssertEqual(seen, ["wipeStarted:102", "wipeProgress:-", "wipeProgress:-", "wipeFinished:102", "deregistered:104"])
        XCTAssertNotNil(events.withLock { $0[1].details["keysDestroyedSeconds"] }, "the keys are reported gone before any file")
        XCTAssertEqual(events.withLock { $0[2].details["bytesFreed"] }, "4096")
    }

    func testAnEnrolmentWithoutAPolicyRestoresTheOneKeptAtDeregistration() throws {
        let engine = try makeEngine()
        var kept = Policy(protectionLevel: .completeUnlessOpen)
        kept.saveToLocations = ["AccountDocument"]
        try engine.enroll(id: "alice", upn: "alice@contoso.com", policy: kept, passphrase: try passphrase("pw"), uid: 1234)
        try engine.deregister("alice", wipe: false)
        // The kept keys need the passphrase they had; the error says where it goes.
        XCTAssertThrowsError(try engine.enroll(id: "alice", upn: "alice@contoso.com")) { error in
            XCTAssertEqual((error as? EngineError)?.code, 302)
            XCTAssertTrue("\(error)".contains("enrolled before") && "\(error)".contains("\"passphrase\"") && "\(error)".contains("--passphrase-file"), "\(error)")
        }
        let back = try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        XCTAssertEqual(back.policy, kept, "the earlier policy returns")
        XCTAssertEqual(back.uid, 1234, "and the local user")
        // A policy named at enrolment wins, and what is kept goes with the enrolment.
        try engine.deregister("alice", wipe: false)
        let fresh = try engine.enroll(id: "alice", upn: "alice@contoso.com", policy: Policy(protectionLevel: .none), passphrase: try passphrase("pw"), uid: 99)
        XCTAssertEqual(fresh.policy?.protectionLevel, ProtectionClass.none)
        XCTAssertEqual(fresh.uid, 99)
        try engine.deregister("alice", wipe: false)
        XCTAssertEqual(try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw")).policy?.protectionLevel, ProtectionClass.none,
                       "the policy of the last deregistration")
        // A wipe keeps nothing: a new enrolment starts from the default policy.
        try engine.deregister("alice", wipe: true)
        XCTAssertEqual(try engine.enroll(id: "alice", upn: "alice@contoso.com").policy, Policy())
    }

    func testDeregisterWithoutWipeKeepsKeysSealedForReEnrollment() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        let before = try engine.classKey(for: "alice", .complete, purpose: .open).id
        try engine.deregister("alice", wipe: false)
        XCTAssertThrowsError(try engine.classKey(for: "alice", .complete, purpose: .open), "no keys while deregistered")
        XCTAssertTrue(FileManager.default.fileExists(atPath: directory + "/" + engine.files.keybagName("alice")), "the keybag stays sealed")
        XCTAssertThrowsError(try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("wrong"))) {
            XCTAssertEqual($0 as? EngineError, .wrongPassphrase("alice"))
        }
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        XCTAssertEqual(try engine.classKey(for: "alice", .complete, purpose: .open).id, before, "the same class keys are back")
    }
}
