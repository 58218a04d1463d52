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
        /// Lists two objects of whoever is asked about, named after the mount and the account.
        var mount = "/m"
        func listOwnedObjects(of account: Account, visit: (OwnedObject) -> Bool) throws(Errno) {
            record("list \(account.upn) tag \(account.nameTag ?? "none")")
            for (index, kind) in [OwnedObject.Kind.file, .directory].enumerated() {
                let object = OwnedObject(path: "\(mount)/\(account.id)-\(index)", kind: kind, size: kind == .file ? 10 : 0,
                                         bytesOnDisk: 4096, encrypted: kind == .file, wipeDeletes: true)
                guard visit(object) else { return }
            }
        }
    }

    func testOwnedObjectsWalkEveryMountKnowingTheNameTagAndStopWhenAsked() throws {
        let engine = try makeEngine()
        let first = RecordingVolume(), second = RecordingVolume()
        second.mount = "/n"
        engine.attach(first)
        engine.attach(second)
        defer { engine.detach(first); engine.detach(second) }
        try engine.enroll(id: "a-id", upn: "a@contoso.com")
        first.calls.withLock { $0.removeAll() }
        second.calls.withLock { $0.removeAll() }
        var seen: [String] = []
        XCTAssertTrue(try engine.ownedObjects(of: "A@Contoso.com") { seen.append($0.path); return true })
        XCTAssertEqual(seen, ["/m/a-id-0", "/m/a-id-1", "/n/a-id-0", "/n/a-id-1"])
        let tag = try XCTUnwrap(engine.nameKey(for: "a-id")?.tag)
        XCTAssertEqual(first.calls.withLock { $0 }, ["list a@contoso.com tag \(tag)"], "the walk knows the identity's names by their tag")
        // A reader that goes away stops the walk: the second mount is not walked.
        seen = []
        XCTAssertFalse(try engine.ownedObjects(of: "a-id") { seen.append($0.path); return seen.count < 1 })
        XCTAssertEqual(seen, ["/m/a-id-0"])
        XCTAssertEqual(second.calls.withLock { $0 }.count, 1)
        XCTAssertThrowsError(try engine.ownedObjects(of: "nobody@contoso.com") { _ in true }) {
            XCTAssertEqual($0 as? EngineError, .unknownAccount("nobody@contoso.com"))
        }
    }

    func testTotalsCountEachFileOnceHoweverManyNamesItHas() {
        var totals = OwnedTotals()
        totals.add(OwnedObject(path: "/m/a", kind: .file, size: 100, bytesOnDisk: 4096, encrypted: true, wipeDeletes: true))
        totals.add(OwnedObject(path: "/m/b", kind: .file, size: 100, bytesOnDisk: 4096, encrypted: true, wipeDeletes: true, otherLink: true))
        totals.add(OwnedObject(path: "/m/c", kind: .file, size: 7, bytesOnDisk: 4096, encrypted: false, wipeDeletes: true))
        totals.add(OwnedObject(path: "/m/d", kind: .directory, size: 0, bytesOnDisk: 4096, encrypted: false, wipeDeletes: false))
        totals.add(OwnedObject(path: "/m/e", kind: .symlink, size: 0, bytesOnDisk: 0, encrypted: true, wipeDeletes: true))
        XCTAssertEqual(totals.files, 3)
        XCTAssertEqual(totals.encryptedFiles, 2)
        XCTAssertEqual(totals.directories, 1)
        XCTAssertEqual(totals.symlinks, 1)
        XCTAssertEqual(totals.objects, 5)
        XCTAssertEqual(totals.size, 107, "the second name of a file adds nothing")
        XCTAssertEqual(totals.bytesOnDisk, 2 * 4096, "files only, each once: what a wipe frees")
    }

    func testLocksPolicyChangesAndWipesReachEveryMountInOrder() throws {
        let clock = ManualClock()
        let engine = try makeEngine(clock: clock)
        let volume = RecordingVolume()
        engine.attach(volume)
        defer { engine.detach(volume) }
        try engine.enroll(id: "a-id", upn: "a@contoso.com")
        try engine.enroll(id: "b-id", upn: "b@contoso.com")
        // An enrolment brings files the identity already has to its policy.
        XCTAssertEqual(volume.calls.withLock { $0 }.map { $0.split(separator: " ").prefix(2).joined(separator: " ") },
                       ["policyChanged a@contoso.com", "policyChanged b@contoso.com"])
        XCTAssertTrue(try engine.account("a-id").reprotectPending, "until the mounts have done it")
        volume.calls.withLock { $0.removeAll() }

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
