@testable import CustodyCore
import CustodyTestSupport
import XCTest

/// Accounts declared in the configuration, brought to it at start and at every reload.
final class ProvisioningTests: EngineTestCase {
    func testDeclaredAccountsAreMadeOnceAndKeptAsDeclared() throws {
        let engine = try makeEngine()
        var policy = Policy(protectionLevel: .untilFirstAuthentication)
        policy.saveToLocations = ["AccountDocument"]
        let declared = [DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com", uid: 1000, policy: policy),
                        DeclaredAccount(id: "bob-oid", upn: "bob@contoso.com", enroll: false)]
        let events = recorded(engine)
        XCTAssertTrue(engine.provision(declared).isEmpty)
        let alice = try engine.account("alice@contoso.com")
        XCTAssertEqual(alice.policy, policy)
        XCTAssertEqual(alice.uid, 1000)
        XCTAssertEqual(alice.declared, true)
        XCTAssertFalse(try engine.account("bob-oid").isEnrolled)
        let first = events.withLock { $0.count }
        // Idempotent: the same declaration again changes nothing and says nothing.
        XCTAssertTrue(engine.provision(declared).isEmpty)
        XCTAssertEqual(events.withLock { $0.count }, first, "\(events.withLock { $0.suffix(3).map(\.message) })")
        // A changed policy is applied as a policy change; bob declared managed is enrolled.
        var changed = declared
        changed[0].policy?.protectionLevel = .complete
        changed[1].enroll = true
        XCTAssertTrue(engine.provision(changed).isEmpty)
        XCTAssertEqual(try engine.account("alice-oid").policy?.protectionLevel, .complete)
        XCTAssertTrue(try engine.account("bob-oid").isEnrolled)
        XCTAssertEqual(events.withLock { $0.filter { $0.kind == .policyChanged }.count }, 1)
    }

    func testAnAccountNoLongerDeclaredFollowsTheAction() throws {
        var settings = testSettings()
        settings.allowedAccountsAction = .deregister
        let engine = try makeEngine(settings)
        try engine.enroll(id: "carol-oid", upn: "carol@contoso.com")
        engine.provision([DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com"), DeclaredAccount(id: "bob-oid", upn: "bob@contoso.com")])
        let events = recorded(engine)
        engine.provision([DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com")])
        XCTAssertThrowsError(try engine.account("bob-oid"), "deregistered, its keys kept")
        XCTAssertNoThrow(try engine.account("carol-oid"), "an account made over the API is not the configuration's")
        XCTAssertEqual(events.withLock { $0.first { $0.kind == .accountNotAllowed }?.message },
                       "bob@contoso.com is enrolled, but the configuration no longer declares it: deregistering it; its keys stay sealed (AllowedAccountsAction = deregister)")
        // Once: the next reload says nothing more about it.
        let count = events.withLock { $0.count }
        engine.provision([DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com")])
        XCTAssertEqual(events.withLock { $0.count }, count)
    }

    func testWhatCannotBeProvisionedIsAnEventAndTheRestGoesOn() throws {
        var settings = testSettings(multiIdentity: false)
        settings.allowedAccounts = []
        let engine = try makeEngine(settings)
        let events = recorded(engine)
        let failures = engine.provision([DeclaredAccount(id: "alice-oid", upn: "alice@contoso.com"),
                                         DeclaredAccount(id: "bob-oid", upn: "bob@contoso.com"),
                                         DeclaredAccount(id: "alice-oid", upn: "mallory@contoso.com", enroll: false)])
        XCTAssertEqual(failures.map(\.0.upn), ["bob@contoso.com", "mallory@contoso.com"])
        XCTAssertEqual(failures.first?.1.code, 227, "one managed account without MultiIdentity")
        XCTAssertTrue(try engine.account("alice-oid").isEnrolled)
        let messages = events.withLock { $0.filter { $0.kind == .enrollmentFailed }.map(\.message) }
        XCTAssertTrue(messages.contains { $0.hasPrefix("the configuration declares bob@contoso.com, which cannot be provisioned:") }, "\(messages)")
        XCTAssertTrue(messages.contains { $0.contains("object ID alice-oid belongs to alice@contoso.com, not mallory@contoso.com") }, "\(messages)")
    }
}
