import CustodyClient
import Foundation
import Glibc
import Synchronization
import XCTest

/// CustodyClient's events: typed changes with the SDK's status codes, in order, against a real
/// daemon; the enrollment delegate's three calls; a daemon that stops in the middle of a stream,
/// and one that is not there.
final class ClientEventTests: XCTestCase {
    var daemon: MountedDaemon!
    static let arguments = ["--multi-identity", "--lock-grace-period", "0"]

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: Self.arguments)
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    final class Recorder: EnrollmentDelegate, @unchecked Sendable {
        let calls = Mutex<[String]>([])
        func enrollmentRequest(with status: EnrollmentStatus) { record("enrollment", status) }
        func policyRequest(with status: EnrollmentStatus) { record("policy", status) }
        func unenrollRequest(with status: EnrollmentStatus, wiped: Bool) { record("unenroll wiped=\(wiped)", status) }
        func record(_ call: String, _ status: EnrollmentStatus) {
            calls.withLock { $0.append("\(call) \(status.accountId ?? "-") \(status.didSucceed) \(status.statusCode)") }
        }
    }

    /// The sequence number of the last event the daemon keeps (0: none yet).
    func lastSequence(_ client: ControlClient) async throws -> UInt64 {
        var last: UInt64 = 0
        for try await event in client.events(after: 0, follow: false) { last = event.sequence }
        return last
    }

    func testChangesArriveTypedInOrderAndTheDelegateHearsEnrolments() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        let start = try await lastSequence(client)
        let recorder = Recorder()
        let delivering = Task { try await enrollment.deliverEvents(to: recorder, after: start) }
        let alice = "alice@contoso.com"

        try await enrollment.registerAndEnrollAccountId("alice-oid", upn: alice)
        // The default policy is class A ("complete"): a change, then the same again.
        let policy = CustodyPolicy(protectionLevel: "untilFirstAuth")
        _ = try client.call(Endpoint.setPolicy, alice, json: policy, as: CustodyAccount.self)
        _ = try client.call(Endpoint.setPolicy, alice, json: policy, as: CustodyAccount.self)
        do {
            try await enrollment.registerAndEnrollAccountId("alice-oid", upn: alice)
            XCTFail("enrolled twice")
        } catch {
            XCTAssertEqual(error.code, 208)
        }
        _ = try client.call(Endpoint.lock, alice, as: LockState.self)
        _ = try client.call(Endpoint.unlock, alice, json: UnlockRequest(), as: LockState.self)
        try await enrollment.deRegisterAndUnenrollAccountId("alice-oid", withWipe: true)

        // Every change, typed, until the unenrolment (wipe progress and re-protection aside).
        var seen: [String] = []
        for try await event in client.events(after: start) {
            switch event.change {
            case .enrollment(let status): seen.append("enrollment \(status.accountId ?? "-") \(status.didSucceed) \(status.statusCode)")
            case .policy(let status): seen.append("policy \(status.didSucceed) \(status.statusCode)")
            case .lock(let account, let change, _): seen.append("lock \(account ?? "-") \(change.rawValue)")
            case .wipe(_, let phase, let code, _) where phase != .progress: seen.append("wipe \(phase.rawValue) \(code ?? 0)")
            case .unenrollment(let status, let wiped): seen.append("unenrollment \(status.statusCode) wiped=\(wiped)")
            case .wipe, .dataProtection, .other: break
            }
            if case .unenrollment = event.change { break }
        }
        XCTAssertEqual(seen.filter { $0 != "lock \(alice) lockRequested" }, [
            "enrollment \(alice) true 100", "policy true 100", "policy true 101", "enrollment \(alice) false 208",
            "lock \(alice) locked", "lock \(alice) unlocked", "wipe started 102", "wipe finished 102", "unenrollment 104 wiped=true",
        ])

        // The delegate heard the enrolments (the failed one too), both policies and the unenrolment.
        let expected = ["enrollment \(alice) true 100", "policy \(alice) true 100", "policy \(alice) true 101",
                        "enrollment \(alice) false 208", "unenroll wiped=true \(alice) true 104"]
        let deadline = Date().addingTimeInterval(10)
        while recorder.calls.withLock({ $0.count }) < expected.count, Date() < deadline { try await Task.sleep(nanoseconds: 20_000_000) }
        XCTAssertEqual(recorder.calls.withLock { $0 }, expected)
        // Cancelled, the delivery returns (and its connection is closed).
        delivering.cancel()
        try await delivering.value
    }

    /// A daemon that stops while a program follows its events: the sequence ends with
    /// `.streamEnded`, not silently; a new sequence after the restart works.
    func testAStoppedDaemonEndsTheStreamWithATypedError() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        try await enrollment.registerAccount(id: "bob-oid", upn: "bob@contoso.com")
        let stream = client.events(after: 0)
        var iterator = stream.makeAsyncIterator()
        let first = try await iterator.next()
        XCTAssertEqual(first?.kind, "registered")
        daemon.stop()
        do {
            while try await iterator.next() != nil {}
            XCTFail("the stream ended without an error")
        } catch let error as CustodyClientError {
            XCTAssertEqual(error, .streamEnded(path: daemon.socket))
        }
        try daemon.start(extraArguments: Self.arguments)
        try await enrollment.registerAccount(id: "carol-oid", upn: "carol@contoso.com")
        var kinds: [String] = []
        for try await event in client.events(after: 0, follow: false) { kinds.append(event.kind) }
        XCTAssertTrue(kinds.contains("registered"), "\(kinds)")

        // No daemon at all: the first element throws `.cannotConnect`.
        let missing = ControlClient(socketPath: daemon.root + "/no-daemon.sock")
        do {
            for try await _ in missing.events() { XCTFail("an event from no daemon") }
            XCTFail("no error")
        } catch let error as CustodyClientError {
            guard case .cannotConnect(_, let code) = error else { return XCTFail("\(error)") }
            XCTAssertEqual(code, ENOENT)
        }
    }
}
