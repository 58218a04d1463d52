@testable import CustodyCore
import CustodyTestSupport
import XCTest

/// An enrolled account that `AllowedAccounts` stops naming is not silently left as it was.
final class AllowedAccountsTests: EngineTestCase {
    func settings(_ allowed: [String], _ action: AllowedAccountsAction = .warn) -> Settings {
        var settings = testSettings()
        settings.allowedAccounts = allowed
        settings.allowedAccountsAction = action
        return settings
    }

    func testEachActionActsOnTheAccountsTheListNoLongerNames() throws {
        let engine = try makeEngine(settings(["alice@contoso.com", "bob-oid"]))
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com")
        try engine.enroll(id: "bob-oid", upn: "bob@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        XCTAssertThrowsError(try engine.enroll(id: "carol-oid", upn: "carol@contoso.com")) { XCTAssertEqual(($0 as? EngineError)?.code, 209) }
        XCTAssertEqual(engine.accountsNotAllowed(), [])
        let events = recorded(engine)

        // warn: an event names it; it stays enrolled.
        engine.updateSettings(settings(["ALICE@contoso.com"]))
        XCTAssertEqual(engine.applyAllowedAccounts().map(\.upn), ["bob@contoso.com"])
        XCTAssertTrue(try engine.account("bob-oid").isEnrolled)
        XCTAssertFalse(engine.isAllowed(try engine.account("bob-oid")))
        XCTAssertTrue(engine.isAllowed(try engine.account("alice-oid")), "any case")
        let seen = events.withLock { $0.map { "\($0.kind.rawValue) \($0.code.map(String.init) ?? "-") \($0.identity ?? "-")" } }
        XCTAssertEqual(seen, ["allowedAccountsChanged - -", "accountNotAllowed 209 bob@contoso.com"])
        XCTAssertEqual(events.withLock { $0.last?.message },
                       "bob@contoso.com is enrolled, but AllowedAccounts does not name it: it stays enrolled (AllowedAccountsAction = warn)")
        // The same list again is no change.
        engine.updateSettings(settings(["alice@contoso.com"]))
        XCTAssertEqual(events.withLock { $0.filter { $0.kind == .allowedAccountsChanged }.count }, 1)

        // deregister: its keys stay sealed; allowed and enrolled again, it is as it was.
        let classKey = try engine.classKey(for: "bob-oid", .untilFirstAuthentication, purpose: .open).id
        engine.updateSettings(settings(["alice@contoso.com"], .deregister))
        XCTAssertEqual(engine.applyAllowedAccounts().map(\.upn), ["bob@contoso.com"])
        XCTAssertThrowsError(try engine.account("bob-oid"))
        engine.updateSettings(settings(["alice@contoso.com", "bob@contoso.com"]))
        let back = try engine.enroll(id: "bob-oid", upn: "bob@contoso.com")
        XCTAssertEqual(back.policy?.protectionLevel, .untilFirstAuthentication, "with the policy it had")
        XCTAssertEqual(try engine.classKey(for: "bob-oid", .untilFirstAuthentication, purpose: .open).id, classKey, "and its keys")

        // wipe: in the background, keys first.
        engine.updateSettings(settings(["alice-oid"], .wipe))
        XCTAssertEqual(engine.applyAllowedAccounts().map(\.upn), ["bob@contoso.com"])
        try eventually("bob is wiped") { (try? engine.account("bob-oid")) == nil }
        try eventually("the wipe finished") { events.withLock { $0.contains { $0.kind == .wipeFinished && $0.identity == "bob@contoso.com" } } }
        XCTAssertEqual(engine.applyAllowedAccounts(), [], "alice is allowed by her object ID")
        // An empty list allows everyone.
        engine.updateSettings(settings([]))
        XCTAssertEqual(events.withLock { $0.last?.message }, "AllowedAccounts is empty: every account may enroll")
        XCTAssertNoThrow(try engine.enroll(id: "carol-oid", upn: "carol@contoso.com"))
    }
}
