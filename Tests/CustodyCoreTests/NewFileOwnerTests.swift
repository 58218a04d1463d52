@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import XCTest

/// What a new file's owner is made as (`Engine.newFileOwner`), kept between creations: every
/// change the answer rests on (a policy, the settings, an enrolment, a lock, a wipe) shows at
/// the next creation, not one later.
final class NewFileOwnerTests: EngineTestCase {
    func testTheAnswerFollowsEveryChangeItRestsOn() throws {
        var settings = testSettings()
        settings.maxFileProtectionLevel = .completeUnlessOpen
        let engine = try makeEngine(settings)
        try engine.register(id: "bob", upn: "Bob@Personal.example")
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))

        let stranger = engine.newFileOwner("  stranger@x ")
        XCTAssertEqual(stranger.owner?.display, "stranger@x", "an unknown identity is recorded as given, trimmed")
        XCTAssertNil(stranger.protectionClass)
        XCTAssertNil(stranger.keyID)
        guard case .plain = stranger.nameKey else { return XCTFail("an unknown identity's names are plain") }
        let bob = engine.newFileOwner("bob@personal.example")
        XCTAssertEqual(bob.owner?.display, "Bob@Personal.example", "a registered account as registered")
        XCTAssertNil(bob.protectionClass, "registered, not enrolled: unmanaged")
        guard case .plain = bob.nameKey else { return XCTFail("an unmanaged account's names are plain") }
        XCTAssertNil(engine.newFileOwner("").owner, "no owner can be named by nothing")

        let alice = engine.newFileOwner("ALICE@contoso.com")
        XCTAssertEqual(alice.owner?.display, "alice@contoso.com")
        XCTAssertEqual(alice.protectionClass, .completeUnlessOpen, "min(policy, MaxFileProtectionLevel)")
        XCTAssertEqual(alice.keyID, engine.ownerKeyID(for: "alice"))
        XCTAssertNotNil(alice.keyID)
        guard case .key(let nameKey) = alice.nameKey else { return XCTFail("an enrolled identity's names are encrypted") }
        XCTAssertEqual(nameKey.tag, engine.nameKey(for: "alice")?.tag)
        XCTAssertEqual(try engine.classKey(forNewFileOf: alice).id, try engine.classKey(for: "alice", .completeUnlessOpen, purpose: .create).id)

        // A setting and a policy: the next answer has them.
        settings.maxFileProtectionLevel = .complete
        engine.updateSettings(settings)
        XCTAssertEqual(engine.newFileOwner("ALICE@contoso.com").protectionClass, .complete)
        var policy = Policy(protectionLevel: .untilFirstAuthentication)
        try engine.setPolicy("alice", policy)
        XCTAssertEqual(engine.newFileOwner("ALICE@contoso.com").protectionClass, .untilFirstAuthentication)
        policy.fileEncryptionRequired = false
        try engine.setPolicy("alice", policy)
        XCTAssertNil(engine.newFileOwner("ALICE@contoso.com").protectionClass, "encryption not required: plain content")
        guard case .key = engine.newFileOwner("alice").nameKey else { return XCTFail("a managed identity's names stay encrypted") }
        try engine.setPolicy("alice", Policy(protectionLevel: .complete))

        // A lock withholds class A from creation, not the name key; an unlock gives it back.
        let complete = engine.newFileOwner("alice")
        try engine.lock("alice", immediately: true)
        XCTAssertThrowsError(try engine.classKey(forNewFileOf: complete)) {
            guard case .locked(let who, .complete) = $0 as? EngineError else { return XCTFail("\($0)") }
            XCTAssertEqual(who, "alice@contoso.com")
        }
        guard case .key = engine.newFileOwner("alice").nameKey else { return XCTFail("locked: names still encrypted") }
        try engine.unlock("alice", passphrase: try passphrase("correct horse"))
        XCTAssertNoThrow(try engine.classKey(forNewFileOf: complete))

        // A wipe: the identity is unknown at the next creation, and what was kept opens nothing.
        try engine.deregister("alice", wipe: true)
        let wiped = engine.newFileOwner("alice@contoso.com")
        XCTAssertNil(wiped.protectionClass)
        XCTAssertNil(wiped.keyID)
        guard case .plain = wiped.nameKey else { return XCTFail("a wiped identity is unknown: plain") }
        XCTAssertThrowsError(try engine.classKey(forNewFileOf: complete)) {
            XCTAssertEqual(($0 as? EngineError)?.code, EngineError.notEnrolled("").code, "\($0)")
        }

        // Enrolled again: new keys, new answer.
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))
        let again = engine.newFileOwner("alice@contoso.com")
        XCTAssertNotNil(again.keyID)
        XCTAssertNotEqual(again.keyID, alice.keyID)
        XCTAssertNoThrow(try engine.classKey(forNewFileOf: again))
    }

    func testCallersBoundToNothingFollowTheSettingsAndAccounts() throws {
        var settings = testSettings(multiIdentity: true)
        let engine = try makeEngine(settings)
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        XCTAssertNil(engine.resolve(thread: 4242, uid: 1000).identity, "multi-identity, no default: nobody")
        settings.defaultIdentities[1000] = "ALICE@contoso.com"
        engine.updateSettings(settings)
        XCTAssertEqual(engine.resolve(thread: 4242, uid: 1000).identity, "alice@contoso.com", "the uid's default, as registered")
        XCTAssertNil(engine.resolve(thread: 4242, uid: 1001).identity, "another uid")
        try engine.deregister("alice", wipe: false)
        XCTAssertEqual(engine.resolve(thread: 4242, uid: 1000).identity, "ALICE@contoso.com", "no account: the default as given")
        settings.defaultIdentities = [:]
        engine.updateSettings(settings)
        XCTAssertNil(engine.resolve(thread: 4242, uid: 1000).identity)
    }
}
