import CustodyAPI
import CustodyClient
import XCTest

/// What the agent shows for an event, and how often.
final class NoticeTests: XCTestCase {
    func event(_ kind: String, _ details: [String: String] = [:], identity: String? = "dana@contoso.com") -> CustodyEvent {
        CustodyEvent(sequence: 1, time: 0, kind: kind, identity: identity, message: "m", details: details)
    }

    func testNoticesNameTheIdentityTheLocationAndTheProgramButNoPath() {
        let saved = Notice(event("saveBlocked", ["executable": "/usr/bin/cp", "location": "LocalDrive", "path": "/home/dana/secret-plan.txt"]))
        XCTAssertEqual(saved, Notice(summary: "Save blocked", body: "cp may not save dana@contoso.com's data to LocalDrive.", urgent: true))
        let opened = Notice(event("openFromBlocked", ["executable": "unknown", "location": "LocalDrive", "path": "/home/dana/x"]))
        XCTAssertEqual(opened?.body, "A program may not bring data from LocalDrive into dana@contoso.com's files.")
        let shared = Notice(event("transferBlocked", ["executable": "/usr/bin/python3.11", "from": "dana@contoso.com", "to": "", "path": "a/b"]))
        XCTAssertEqual(shared?.body, "python3.11 may not move dana@contoso.com's data to no identity.")
        XCTAssertEqual(Notice(event("locked"))?.summary, "dana@contoso.com locked")
        XCTAssertEqual(Notice(event("wipeStarted"))?.urgent, true)
        XCTAssertNil(Notice(event("wipeProgress")), "progress is not for the person at the keyboard")
        for notice in [saved, opened, shared].compactMap({ $0 }) {
            XCTAssertFalse(notice.body.contains("/home") || notice.body.contains("a/b"), notice.body)
        }
    }

    func testOneNoticePerKindAndIdentityPerIntervalAndTheRestCounted() {
        var limiter = NoticeLimiter(interval: 10)
        let blocked = event("saveBlocked", ["location": "LocalDrive"])
        XCTAssertNotNil(limiter.admit(blocked, now: 100))
        XCTAssertNil(limiter.admit(blocked, now: 101))
        XCTAssertNil(limiter.admit(blocked, now: 105))
        XCTAssertNotNil(limiter.admit(event("saveBlocked", identity: "erin@contoso.com"), now: 105), "another identity")
        XCTAssertNotNil(limiter.admit(event("locked"), now: 105), "another kind")
        let next = limiter.admit(blocked, now: 111)
        XCTAssertTrue(next?.body.hasSuffix("(and 2 more like it)") == true, "\(String(describing: next))")
        XCTAssertNil(limiter.admit(event("registered"), now: 200))
    }
}
