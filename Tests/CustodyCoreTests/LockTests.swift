@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import Foundation
import XCTest

final class LockTests: EngineTestCase {
    func available(_ engine: Engine, _ protectionClass: ProtectionClass, _ purpose: KeyPurpose = .open) -> Bool {
        (try? engine.classKey(for: "alice", protectionClass, purpose: purpose)) != nil
    }

    func testLockDropsClassAAfterTheGracePeriodAndUnlockNeedsThePassphrase() throws {
        let clock = ManualClock()
        let engine = try makeEngine(testSettings(grace: 10), clock: clock)
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))
        XCTAssertEqual(try engine.lockStatus("alice"), .unlocked)
        XCTAssertTrue(ProtectionClass.allCases.allSatisfy { available(engine, $0) })

        try engine.lock("alice")
        XCTAssertEqual(try engine.lockStatus("alice"), .locking(remaining: 10))
        clock.advance(by: 9.9)
        XCTAssertTrue(available(engine, .complete), "class A stays during the grace period")
        clock.advance(by: 0.2)
        XCTAssertEqual(try engine.lockStatus("alice"), .locked)
        XCTAssertThrowsError(try engine.classKey(for: "alice", .complete, purpose: .open)) {
            XCTAssertEqual($0 as? EngineError, .locked("alice@contoso.com", .complete))
            XCTAssertEqual(($0 as? EngineError)?.errnoValue, .accessDenied)
        }
        XCTAssertFalse(available(engine, .complete, .create), "class A cannot create while locked")
        XCTAssertTrue(available(engine, .completeUnlessOpen, .create), "class B creates while locked")
        XCTAssertFalse(available(engine, .completeUnlessOpen, .open), "class B cannot open while locked")
        XCTAssertTrue(available(engine, .untilFirstAuthentication), "class C stays after the first unlock")
        XCTAssertTrue(available(engine, .none))

        XCTAssertThrowsError(try engine.unlock("alice", passphrase: nil)) { XCTAssertEqual($0 as? EngineError, .passphraseRequired("alice")) }
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("wrong"))) { XCTAssertEqual($0 as? EngineError, .wrongPassphrase("alice")) }
        try engine.unlock("ALICE@contoso.com", passphrase: try passphrase("correct horse"))
        XCTAssertEqual(try engine.lockStatus("alice"), .unlocked)
        XCTAssertTrue(available(engine, .complete))
    }

    /// An engine on a manual clock with alice and bob enrolled without passphrases.
    func aliceAndBob(grace: Double) throws -> (ManualClock, Engine) {
        let clock = ManualClock()
        let engine = try makeEngine(testSettings(grace: grace), clock: clock)
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        try engine.enroll(id: "bob", upn: "bob@contoso.com")
        return (clock, engine)
    }

    func testUnlockDuringGraceCancelsTheLockAndLockAllLocksEveryone() throws {
        let (clock, engine) = try aliceAndBob(grace: 5)
        try engine.lock("alice")
        clock.advance(by: 2)
        try engine.unlock("alice", passphrase: nil)
        clock.advance(by: 10)
        XCTAssertEqual(try engine.lockStatus("alice"), .unlocked, "an unlock during the grace period cancels the lock")
        engine.lockAll()
        XCTAssertEqual(engine.nextDeadline(), clock.now() + 5)
        clock.advance(by: 5)
        engine.processDeadlines()
        XCTAssertEqual(try engine.lockStatus("alice"), .locked)
        XCTAssertEqual(try engine.lockStatus("bob"), .locked)
        XCTAssertNil(engine.nextDeadline())
        XCTAssertEqual(engine.unlockAll(), [], "identities without a passphrase unlock on authorization alone")
        XCTAssertEqual(try engine.lockStatus("bob"), .unlocked)
    }

    /// Locks due at different times complete each at its own time: after the first completes,
    /// the engine still knows the later one is pending (class keys are asked on every create and
    /// only walk the identities when a lock is due).
    func testStaggeredLocksCompleteEachAtItsDeadline() throws {
        let (clock, engine) = try aliceAndBob(grace: 10)
        try engine.lock("bob")
        clock.advance(by: 4)
        try engine.lock("alice")
        XCTAssertEqual(engine.nextDeadline(), clock.now() + 6)
        clock.advance(by: 6)
        // Nothing but the class key request sees the deadline pass.
        XCTAssertThrowsError(try engine.classKey(for: "bob", .complete, purpose: .create)) {
            XCTAssertEqual($0 as? EngineError, .locked("bob@contoso.com", .complete))
        }
        XCTAssertTrue(available(engine, .complete, .create), "alice's lock is not due yet")
        clock.advance(by: 3.9)
        XCTAssertTrue(available(engine, .complete, .create))
        clock.advance(by: 0.2)
        XCTAssertFalse(available(engine, .complete, .create), "alice's lock completes at its own deadline")
        XCTAssertEqual(try engine.lockStatus("alice"), .locked)
        XCTAssertNil(engine.nextDeadline())
        // A cancelled lock leaves nothing due; a new lock is due again at its own time.
        try engine.unlock("alice", passphrase: nil)
        try engine.lock("alice")
        XCTAssertTrue(try engine.cancelPendingLock("alice"))
        clock.advance(by: 20)
        XCTAssertTrue(available(engine, .complete, .create))
        try engine.lock("alice")
        clock.advance(by: 10)
        XCTAssertFalse(available(engine, .complete, .create))
    }

    func testWrongPassphrasesAreRateLimited() throws {
        let clock = ManualClock()
        let engine = try makeEngine(testSettings(grace: 0), clock: clock)
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.lock("alice")
        XCTAssertEqual(try engine.lockStatus("alice"), .locked, "grace 0: locked at once")
        for _ in 0..<3 {
            XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("nope"))) { XCTAssertEqual($0 as? EngineError, .wrongPassphrase("alice")) }
        }
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("pw"))) {
            XCTAssertEqual($0 as? EngineError, .rateLimited("alice@contoso.com", retryAfterSeconds: 1), "even the right passphrase waits")
        }
        clock.advance(by: 1)
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("nope")))
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("pw"))) {
            XCTAssertEqual($0 as? EngineError, .rateLimited("alice@contoso.com", retryAfterSeconds: 2), "the wait doubles")
        }
        clock.advance(by: 2)
        try engine.unlock("alice", passphrase: try passphrase("pw"))
        XCTAssertEqual(try engine.lockStatus("alice"), .unlocked)
    }

    func testPassphraseCanBeSetChangedAndRemoved() throws {
        let engine = try makeEngine(testSettings(grace: 0))
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        XCTAssertFalse(try engine.account("alice").hasPassphrase)
        try engine.changePassphrase("alice", old: nil, new: try passphrase("first"))
        XCTAssertTrue(try engine.account("alice").hasPassphrase)
        try engine.lock("alice")
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: nil))
        try engine.unlock("alice", passphrase: try passphrase("first"))
        XCTAssertThrowsError(try engine.changePassphrase("alice", old: try passphrase("wrong"), new: try passphrase("second")))
        try engine.changePassphrase("alice", old: try passphrase("first"), new: try passphrase("second"))
        try engine.lock("alice")
        XCTAssertThrowsError(try engine.unlock("alice", passphrase: try passphrase("first")))
        try engine.unlock("alice", passphrase: try passphrase("second"))
        try engine.changePassphrase("alice", old: try passphrase("second"), new: nil)
        try engine.lock("alice")
        try engine.unlock("alice", passphrase: nil)
    }

    /// In the daemon a timer completes the lock at the end of the grace period, with no request.
    func testTheDeadlineTimerLocksWithoutARequest() throws {
        let engine = try makeEngine(testSettings(grace: 0.3), clock: SystemClock())
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        engine.startDeadlineTimer()
        defer { engine.stopDeadlineTimer() }
        let locked = expectation(description: "locked event")
        let token = engine.events.subscribe { event in if event.kind == .locked { locked.fulfill() } }
        defer { engine.events.unsubscribe(token) }
        let start = SystemClock().now()
        try engine.lock("alice")
        wait(for: [locked], timeout: 5)
        XCTAssertGreaterThanOrEqual(SystemClock().now() - start, 0.29, "not before the grace period")
    }

    func testFileKeyLifetimes() throws {
        let clock = ManualClock()
        let engine = try makeEngine(testSettings(grace: 10), clock: clock)
        try engine.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        func header(_ protectionClass: ProtectionClass) throws -> FileHeader {
            let classKey = try engine.classKey(for: "alice", protectionClass, purpose: .create)
            return try FileHeader.encrypted(owner: try Owner("alice@contoso.com"), protectionClass: protectionClass,
                                            classKey: classKey, fileKey: try SecretBytes.random(count: 32))
        }
        let a = try header(.complete), b = try header(.completeUnlessOpen), c = try header(.untilFirstAuthentication)
        let a1 = try engine.openFileKey(a), a2 = try engine.openFileKey(a)
        XCTAssertTrue(a1 === a2, "one key per file, shared by its handles")
        let b1 = try engine.openFileKey(b)
        let c1 = try engine.openFileKey(c)
        XCTAssertEqual(engine.openFileKeyCount(identity: "alice"), 3)
        engine.closeFileKey(c1)
        XCTAssertEqual(engine.openFileKeyCount(), 2, "a class C key goes at its last close")

        try engine.lock("alice")
        clock.advance(by: 11)
        engine.processDeadlines()
        XCTAssertTrue(a1.isRevoked, "open class A keys are revoked at grace expiry")
        XCTAssertFalse(b1.isRevoked, "open class B files keep working")
        XCTAssertEqual(engine.openFileKeyCount(), 1)
        XCTAssertThrowsError(try engine.openFileKey(a)) { XCTAssertEqual($0 as? EngineError, .locked("alice@contoso.com", .complete)) }
        XCTAssertThrowsError(try engine.openFileKey(try FileHeader.encrypted(owner: try Owner("alice@contoso.com"), protectionClass: .completeUnlessOpen,
            classKey: try engine.classKey(for: "alice", .completeUnlessOpen, purpose: .create), fileKey: try SecretBytes.random(count: 32))),
            "a class B file made while locked cannot be opened until unlock")
        XCTAssertTrue(try engine.openFileKey(b) === b1, "but one already open can be opened again")
        engine.closeFileKey(b1)
        engine.closeFileKey(b1)
        XCTAssertEqual(engine.openFileKeyCount(), 0, "the class B key is dropped at its last close")
    }
}
