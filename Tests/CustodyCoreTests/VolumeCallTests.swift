@testable import CustodyCore
import CustodyFormat
import CustodySystem
import CustodyTestSupport
import Synchronization
import XCTest

/// What the engine tells the mounts, as calls on `ProtectedVolume` in the order things happen.
final class VolumeCallTests: EngineTestCase {
    final class RecordingVolume: ProtectedVolume, @unchecked Sendable {
        let calls = Mutex<[String]>([])
        var mountPoint: String { "/m" }
        var backingDirectory: String { "/b" }
        var allowsOtherUsers: Bool { false }
        func record(_ call: String) { calls.withLock { $0.append(call) } }
        func changeOwner(_ relativePath: String, to owner: String?, progress: (Int) -> Void) throws(EngineError) {}
        func settleCaches() {}
        func repair(_ relativePath: String) throws(EngineError) -> RepairOutcome { throw .fileNotEncrypted(relativePath) }
        func lockRequested(_ account: Account) { record("lockRequested \(account.upn)") }
        func locked(_ account: Account) { record("locked \(account.upn)") }
        func policyChanged(_ account: Account) { record("policyChanged \(account.upn) \(account.policy?.protectionLevel.description ?? "")") }
        func wipeStarting(_ account: Account) { record("wipeStarting \(account.upn)") }
        func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws(Errno) { record("wipeFiles \(account.upn)") }
    }

    func testLocksPolicyChangesAndWipesReachEveryMountInOrder() throws {
        let clock = ManualClock()
        let engine = try makeEngine(clock: clock)
        let volume = RecordingVolume()
        engine.attach(volume)
        defer { engine.detach(volume) }
        try engine.enroll(id: "a-id", upn: "a@contoso.com")
        try engine.enroll(id: "b-id", upn: "b@contoso.com")

        try engine.lock("a@contoso.com")
        XCTAssertEqual(volume.calls.withLock { $0 }, ["lockRequested a@contoso.com"], "the lock is requested; the keys stay for the grace period")
        clock.advance(by: 11)
        engine.processDeadlines()
        XCTAssertEqual(volume.calls.withLock { $0 }.last, "locked a@contoso.com")

        var policy = Policy()
        policy.protectionLevel = .untilFirstAuthentication
        try engine.setPolicy("b-id", policy)
        XCTAssertEqual(volume.calls.withLock { $0 }.last, "policyChanged b@contoso.com untilFirstAuth", "the new policy travels with the call")
        try engine.setPolicy("b-id", policy)
        XCTAssertEqual(volume.calls.withLock { $0 }.count, 3, "an unchanged policy tells nobody")

        try engine.deregister("a-id", wipe: true)
        XCTAssertEqual(Array(volume.calls.withLock { $0 }.suffix(2)), ["wipeStarting a@contoso.com", "wipeFiles a@contoso.com"])
    }
}
