@testable import CustodyCore
import Foundation
import XCTest
import CustodyTestSupport

/// Wrong passphrases: the back-off survives a restart, and MaxUnlockAttempts can wipe.
final class UnlockAttemptsTests: EngineTestCase {
    func testTheBackOffSurvivesARestart() throws {
        let clock = ManualClock()
        do {
            let engine = try makeEngine(testSettings(), clock: clock)
            try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("right"))
            try engine.lock("alice-id", immediately: true)
            for _ in 0..<4 {
                XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong")))
                clock.advance(by: 301)
            }
            XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong")))
            XCTAssertEqual(engine.unlockAttempts("alice-id").failures, 5)
            XCTAssertEqual(engine.unlockAttempts("alice-id").retryAfter, 4, accuracy: 0.01, "after five: 4 s")
        }
        // The daemon restarts: the count and the wait are still there.
        let engine = try makeEngine(testSettings(), clock: clock)
        XCTAssertEqual(engine.unlockAttempts("alice-id").failures, 5)
        XCTAssertGreaterThan(engine.unlockAttempts("alice-id").retryAfter, 3)
        XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("right"))) {
            guard case .rateLimited = $0 as? EngineError else { return XCTFail("\($0)") }
        }
        clock.advance(by: 5)
        XCTAssertNoThrow(try engine.unlock("alice-id", passphrase: try passphrase("right")))
        XCTAssertEqual(engine.unlockAttempts("alice-id").failures, 0, "a right passphrase starts the count again")
        let kept = try String(contentsOfFile: directory + "/attempts.json", encoding: .utf8)
        XCTAssertFalse(kept.contains("alice"), kept)
    }

    func testTooManyWrongAttemptsWipeWhenConfigured() throws {
        var settings = testSettings()
        settings.maxUnlockAttempts = 3
        settings.unlockAttemptsAction = "wipe"
        let clock = ManualClock()
        let engine = try makeEngine(settings, clock: clock)
        let recorder = recorded(engine)
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("right"))
        try engine.enroll(id: "bob-id", upn: "bob@contoso.com", passphrase: try passphrase("right"))
        // Each wrong attempt says how many are left; the last says it wipes.
        let said = [
            "wrong passphrase for alice-id (2 attempts left before the identity is wiped)",
            "wrong passphrase for alice-id (1 attempt left before the identity is wiped)",
            "wrong passphrase for alice-id: that was wrong attempt 3 of 3 (MaxUnlockAttempts), and the identity is being wiped (UnlockAttemptsAction = wipe)",
        ]
        for message in said {
            XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong"))) { error in
                XCTAssertEqual((error as? EngineError)?.code, 303)
                XCTAssertEqual("\(error)", message)
            }
            clock.advance(by: 301)
        }
        // The wipe runs as a job: its account goes first, its finishing event after.
        let finished = { recorder.withLock { $0.contains { $0.kind == .wipeFinished && $0.identity == "alice@contoso.com" } } }
        _ = try? eventually("the wipe to finish", timeout: 5) { (try? engine.account("alice-id")) == nil && finished() }
        XCTAssertThrowsError(try engine.account("alice-id"), "wiped")
        XCTAssertNoThrow(try engine.account("bob-id"), "only that identity")
        XCTAssertTrue(recorder.withLock { $0.contains { $0.kind == .unlockAttemptsExceeded && $0.details["action"] == "wipe" } })
        XCTAssertTrue(finished())
    }
}
