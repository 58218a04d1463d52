@testable import CustodySessions
import XCTest

/// What logind reports, turned into "a user left" and "a user returned".
final class SessionTrackerTests: XCTestCase {
    typealias Session = SessionTracker.Session

    func testAUserLeavesWhenItsLastUnlockedSessionLocks() {
        var tracker = SessionTracker()
        XCTAssertEqual(tracker.replace(with: [("/s/1", Session(id: "1", uid: 1000, locked: false)),
                                              ("/s/2", Session(id: "2", uid: 1000, locked: false)),
                                              ("/s/3", Session(id: "3", uid: 1001, locked: false))]), [], "logging in is not a change")
        XCTAssertEqual(tracker.setLocked("/s/1", true), [], "another session of the user is still unlocked")
        XCTAssertEqual(tracker.setLocked("/s/2", true), [.locked(1000)])
        XCTAssertEqual(tracker.setLocked("/s/2", true), [], "a repeated signal changes nothing")
        XCTAssertEqual(tracker.setLocked("/s/1", false), [.returned(1000)])
        XCTAssertEqual(tracker.setLocked("/s/unknown", true), [])
    }

    func testTheLastSessionEndingIsALogout() {
        var tracker = SessionTracker()
        _ = tracker.replace(with: [("/s/1", Session(id: "1", uid: 1000, locked: false)), ("/s/2", Session(id: "2", uid: 1000, locked: true))])
        XCTAssertEqual(tracker.replace(with: [("/s/2", Session(id: "2", uid: 1000, locked: true))]), [.locked(1000)],
                       "the unlocked session ended, the locked one remains: the user is away")
        XCTAssertEqual(tracker.replace(with: []), [.loggedOut(1000)])
        XCTAssertEqual(tracker.replace(with: [("/s/4", Session(id: "4", uid: 1000, locked: false))]), [], "a new login is not a change")
    }
}
