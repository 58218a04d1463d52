import CustodyClient
import XCTest

/// Each kind of event the daemon sends means one typed change, with the SDK's status.
final class EventChangeTests: XCTestCase {
    func event(_ kind: String, code: Int? = nil, details: [String: String] = [:]) -> CustodyEvent {
        CustodyEvent(sequence: 1, time: 0, kind: kind, identity: "alice@contoso.com", code: code, message: "m", details: details)
    }

    func status(_ succeeded: Bool, _ code: Int) -> EnrollmentStatus {
        EnrollmentStatus(accountId: "alice@contoso.com", didSucceed: succeeded, statusCode: code, errorString: "m")
    }

    func testEveryKindMeansOneChange() {
        let alice = "alice@contoso.com"
        XCTAssertEqual(event("enrolled", code: 100).change, .enrollment(status(true, 100)))
        XCTAssertEqual(event("enrollmentFailed", code: 208).change, .enrollment(status(false, 208)))
        XCTAssertEqual(event("policyChanged", code: 100).change, .policy(status(true, 100)))
        XCTAssertEqual(event("policyUnchanged", code: 101).change, .policy(status(true, 101)))
        XCTAssertEqual(event("deregistered", code: 104, details: ["wipe": "true"]).change, .unenrollment(status(true, 104), wiped: true))
        XCTAssertEqual(event("deregistered", code: 104, details: ["wipe": "false"]).change, .unenrollment(status(true, 104), wiped: false))
        XCTAssertEqual(event("wipeStarted", code: 102).change, .wipe(account: alice, .started, code: 102, message: "m"))
        XCTAssertEqual(event("wipeProgress").change, .wipe(account: alice, .progress, code: nil, message: "m"))
        XCTAssertEqual(event("wipeFinished", code: 102).change, .wipe(account: alice, .finished, code: 102, message: "m"))
        XCTAssertEqual(event("wipeFailed", code: 215).change, .wipe(account: alice, .failed, code: 215, message: "m"))
        for lock in ["lockRequested", "locked", "unlocked", "unlockFailed", "unlockAttemptsExceeded"] {
            XCTAssertEqual(event(lock).change, .lock(account: alice, LockChange(rawValue: lock)!, message: "m"))
        }
        XCTAssertEqual(event("reprotectRequired").change, .dataProtection(account: alice, .required, message: "m"))
        XCTAssertEqual(event("reprotectProgress").change, .dataProtection(account: alice, .progress, message: "m"))
        XCTAssertEqual(event("reprotectFinished").change, .dataProtection(account: alice, .finished, message: "m"))
        for other in ["registered", "identityBound", "transferBlocked", "tamperDetected", "somethingNew"] {
            XCTAssertEqual(event(other).change, .other(kind: other))
        }
        // A failure without a code still reads as a failure.
        XCTAssertEqual(event("enrollmentFailed").change, .enrollment(status(false, 201)))
    }
}
