@testable import CustodyCore
import XCTest

/// The engine's side of session locking: who locks when a user leaves, returns, or the machine
/// sleeps (the logind side is in CustodySessionsTests and IntegrationTests/SessionLockTests).
final class SessionTests: EngineTestCase {
    func testLeavingReturningAndSleeping() throws {
        let clock = ManualClock()
        let engine = try makeEngine(testSettings(grace: 10), clock: clock)
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("pw"), uid: 1000)
        try engine.enroll(id: "bob-id", upn: "bob@contoso.com", uid: 1000)
        var keepOpen = Policy()
        keepOpen.lockOnSessionLock = false
        try engine.enroll(id: "dana-id", upn: "dana@contoso.com", policy: keepOpen, uid: 1000)
        try engine.enroll(id: "carol-id", upn: "carol@contoso.com", uid: 2000)
        let recorder = recorded(engine)

        engine.userLeft(1000, cause: .sessionLock)
        XCTAssertEqual(try engine.lockStatus("alice-id"), .locking(remaining: 10))
        XCTAssertEqual(try engine.lockStatus("dana-id"), .unlocked, "its policy keeps it open on a screen lock")
        XCTAssertEqual(try engine.lockStatus("carol-id"), .unlocked, "another user's")
        XCTAssertEqual(recorder.withLock { $0.first { $0.kind == .lockRequested }?.details["cause"] }, "sessionLock")
        clock.advance(by: 5)
        engine.userReturned(1000)
        XCTAssertEqual(try engine.lockStatus("alice-id"), .unlocked, "back within the grace period: called off")

        engine.userLeft(1000, cause: .sessionLock)
        clock.advance(by: 11)
        XCTAssertEqual(try engine.lockStatus("alice-id"), .locked)
        XCTAssertEqual(try engine.lockStatus("bob-id"), .locked)
        engine.userReturned(1000)
        XCTAssertEqual(try engine.lockStatus("alice-id"), .locked, "a passphrase is still needed")
        XCTAssertEqual(try engine.lockStatus("bob-id"), .unlocked, "no passphrase: unlocks on authorization alone")

        try engine.unlock("alice-id", passphrase: try passphrase("pw"))
        engine.prepareForSleep()
        for id in ["alice-id", "bob-id", "dana-id", "carol-id"] {
            XCTAssertEqual(try engine.lockStatus(id), .locked, "\(id): a suspend locks at once, every identity")
        }

        var settings = testSettings(grace: 10)
        settings.lockOnLogout = false
        engine.updateSettings(settings)
        engine.userReturned(2000)
        engine.userLeft(2000, cause: .logout)
        XCTAssertEqual(try engine.lockStatus("carol-id"), .unlocked, "LockOnLogout off")
    }
}
