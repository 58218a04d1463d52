@testable import CustodyCore
import CustodyCrypto
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Every file of the state directory, cut short, filled with garbage and removed: what the engine
/// does at start, and that nothing is lost (the damaged file is kept, in place or set aside, and
/// what it protected opens again once it is restored).
final class StateFileTests: EngineTestCase {
    enum Damage: CaseIterable { case truncated, garbage, removed }

    /// Damages `name` (relative to the state directory); returns the bytes it held.
    @discardableResult
    func damage(_ name: String, _ how: Damage) throws -> Data {
        let url = URL(fileURLWithPath: directory + "/" + name)
        let original = try Data(contentsOf: url)
        switch how {
        case .truncated: try original.prefix(original.count / 2).write(to: url)
        case .garbage: try Data((0..<200).map { _ in UInt8.random(in: 0...255) }).write(to: url)
        case .removed: try FileManager.default.removeItem(at: url)
        }
        return original
    }

    func contents(_ name: String) -> Data? { try? Data(contentsOf: URL(fileURLWithPath: directory + "/" + name)) }

    /// Alice (a passphrase) and bob (none), enrolled; a blob protected for each; bob bound to a process.
    func populate(processes: FakeProcessTable) throws -> (alice: [UInt8], bob: [UInt8]) {
        let engine = try makeEngine(processes: processes)
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.enroll(id: "bob-id", upn: "bob@contoso.com")
        try engine.unlock("alice-id", passphrase: try passphrase("pw"))
        let blobs = (try engine.protectData(Array("alice's".utf8), for: "alice-id"), try engine.protectData(Array("bob's".utf8), for: "bob-id"))
        processes.add(500, start: 42)
        try engine.bindProcess(500, to: "bob@contoso.com")
        XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong")))
        XCTAssertNotNil(contents("bindings.json"))
        XCTAssertNotNil(contents("attempts.json"))
        return blobs
    }

    // MARK: The backbone: the engine refuses to start, names the file and changes nothing.

    func testDamagedAccountsOrWipeJournalsStopTheEngineAndStayAsTheyAre() throws {
        for file in ["accounts.json", "wipes"] {
            for how in [Damage.truncated, .garbage] {
                try? FileManager.default.removeItem(atPath: directory)
                XCTAssertEqual(mkdir(directory, 0o700), 0)
                _ = try populate(processes: FakeProcessTable())
                let name = file == "wipes" ? try stateFileName(of: "bob-id", in: "wipes", directory: directory) : file
                if name.hasPrefix("wipes/") {
                    try JSONEncoder().encode(try makeEngine().account("bob-id")).write(to: URL(fileURLWithPath: directory + "/" + name))
                }
                try damage(name, how)
                let damaged = contents(name)
                XCTAssertThrowsError(try makeEngine(), "\(name) \(how)") {
                    guard case .corruptState(let file, _) = $0 as? EngineError else { return XCTFail("\(name) \(how): \($0)") }
                    XCTAssertEqual(file, self.directory + "/" + name)
                }
                XCTAssertEqual(contents(name), damaged, "\(name) \(how): left as it was")
                XCTAssertNotNil(contents(try stateFileName(of: "bob-id", directory: directory)), "\(name) \(how): no key was destroyed")
            }
        }
    }

    func testDamagedMachineKeysStopTheEngine() throws {
        _ = try populate(processes: FakeProcessTable())
        let key = try XCTUnwrap(try FileManager.default.contentsOfDirectory(atPath: directory + "/machine-keys").first)
        for how in [Damage.truncated, .garbage] {
            let original = try damage("machine-keys/" + key, how)
            let damaged = contents("machine-keys/" + key)
            XCTAssertThrowsError(try makeEngine()) { XCTAssertTrue("\($0)".contains(key), "\(how): \($0)") }
            XCTAssertEqual(contents("machine-keys/" + key), damaged)
            try original.write(to: URL(fileURLWithPath: directory + "/machine-keys/" + key))
        }
        XCTAssertEqual(try makeEngine().unlockAttempts("alice-id").failures, 1, "restored: the engine starts again")
    }

    // MARK: A lost accounts file: keybags are reported, kept, and taken up again.

    func testRemovedAccountsFileReportsTheKeybagsAndReEnrollingTakesThemUp() throws {
        let blobs = try populate(processes: FakeProcessTable())
        let aliceName = try stateFileName(of: "alice-id", directory: directory)
        let aliceKeybag = contents(aliceName)
        try damage("accounts.json", .removed)
        let engine = try makeEngine()
        XCTAssertTrue(engine.accounts().isEmpty)
        let orphans = engine.stateProblems.filter { $0.kind == .orphanedKeybag }
        XCTAssertEqual(Set(orphans.compactMap(\.identity)), ["alice-id", "bob-id"], "\(engine.stateProblems)")
        XCTAssertTrue(orphans.allSatisfy { $0.message.contains("enrolled again") }, "\(orphans)")
        XCTAssertEqual(contents(aliceName), aliceKeybag, "the keybag is kept")
        XCTAssertEqual(engine.events.events().filter { $0.kind == .stateProblem }.count, 2, "one event each")
        XCTAssertThrowsError(try engine.unprotectData(blobs.bob))

        // Enrolling the same object IDs again reuses their keybags (alice's needs her passphrase).
        XCTAssertThrowsError(try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("other")))
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.enroll(id: "bob-id", upn: "bob@contoso.com")
        XCTAssertEqual(try engine.unprotectData(blobs.alice), Array("alice's".utf8))
        XCTAssertEqual(try engine.unprotectData(blobs.bob), Array("bob's".utf8))
        XCTAssertTrue(try makeEngine().stateProblems.isEmpty, "nothing to report once the accounts name the keybags")
    }

    // MARK: One identity's keybag: that identity is unavailable, the others are served.

    func testDamagedKeybagMakesOnlyItsIdentityUnavailable() throws {
        let processes = FakeProcessTable()
        let blobs = try populate(processes: processes)
        for how in Damage.allCases {
            let name = try stateFileName(of: "alice-id", directory: directory)
            let original = try damage(name, how)
            let damaged = contents(name)
            let engine = try makeEngine(processes: processes)
            let problem = try XCTUnwrap(engine.stateProblems.first { $0.kind == .keybagUnusable }, "\(how)")
            XCTAssertEqual(problem.identity, "alice-id")
            XCTAssertEqual(problem.file, name)
            XCTAssertNotNil(engine.unavailability(of: try engine.account("alice-id")), "\(how)")
            XCTAssertThrowsError(try engine.unprotectData(blobs.alice)) {
                guard case .keysUnavailable = $0 as? EngineError else { return XCTFail("\(how): \($0)") }
                XCTAssertEqual(($0 as? EngineError)?.errnoValue, .accessDenied)
            }
            XCTAssertThrowsError(try engine.lockStatus("alice-id"))
            XCTAssertEqual(try engine.unprotectData(blobs.bob), Array("bob's".utf8), "\(how): bob is served")
            XCTAssertEqual(engine.resolve(thread: 500, uid: 0).identity, "bob@contoso.com", "\(how): bindings are kept")
            XCTAssertEqual(contents(name), damaged, "\(how): the keybag is left as found")
            // Restored, the identity is back with everything it protected.
            try original.write(to: URL(fileURLWithPath: directory + "/" + name))
            let restored = try makeEngine(processes: processes)
            try restored.unlock("alice-id", passphrase: try passphrase("pw"))
            XCTAssertEqual(try restored.unprotectData(blobs.alice), Array("alice's".utf8))
            XCTAssertTrue(restored.stateProblems.isEmpty)
        }
    }

    // MARK: Bindings: set aside, and the engine starts without them.

    func testDamagedBindingsAreSetAside() throws {
        let processes = FakeProcessTable()
        _ = try populate(processes: processes)
        for how in Damage.allCases {
            let original = try damage("bindings.json", how)
            let damaged = contents("bindings.json")
            let engine = try makeEngine(processes: processes)
            XCTAssertNil(engine.resolve(thread: 500, uid: 0).identity, "\(how): the binding is gone")
            XCTAssertEqual(try engine.unprotectData(try engine.protectData([1], for: "bob-id")), [1], "\(how): the accounts are served")
            if how == .removed {
                XCTAssertTrue(engine.stateProblems.isEmpty, "a missing file is no bindings")
            } else {
                let problem = try XCTUnwrap(engine.stateProblems.first { $0.kind == .setAside }, "\(how)")
                XCTAssertEqual(problem.file, "bindings.json")
                let moved = try XCTUnwrap(problem.setAsideAs)
                XCTAssertTrue(moved.hasPrefix("bindings.json.unreadable-"), moved)
                XCTAssertEqual(contents(moved), damaged, "\(how): what could not be read is kept")
                XCTAssertEqual(try Syscall.lstat(directory + "/" + moved).st_mode & 0o777, 0o600)
                XCTAssertNil(contents("bindings.json"))
                XCTAssertEqual(engine.events.events().filter { $0.kind == .stateProblem }.first?.details["setAsideAs"], moved)
                try FileManager.default.removeItem(atPath: directory + "/" + moved)
            }
            // Binding again writes a good file, which the next start reads.
            try engine.bindProcess(500, to: "bob@contoso.com")
            XCTAssertEqual(try makeEngine(processes: processes).resolve(thread: 500, uid: 0).identity, "bob@contoso.com")
            try original.write(to: URL(fileURLWithPath: directory + "/bindings.json"))
        }
    }

    // MARK: The run's marks: a damaged one still counts as an unclean stop, and nothing else changes.

    func testDamagedRunMarksAreUncleanStopsOrSetAside() throws {
        _ = try populate(processes: FakeProcessTable())
        // An engine that was not stopped cleanly left running.json; a clean stop removes it.
        XCTAssertNotNil(contents(Engine.runningFile))
        for how in Damage.allCases {
            let before = try makeEngine()
            let stops = before.uncleanStops.count
            before.markCleanStop()
            XCTAssertNil(contents(Engine.runningFile), "a clean stop removes the mark")
            try? Data("{}".utf8).write(to: URL(fileURLWithPath: directory + "/" + Engine.runningFile))
            try damage(Engine.runningFile, how)
            let engine = try makeEngine()
            XCTAssertEqual(engine.uncleanStops.count, how == .removed ? stops : stops + 1,
                           "\(how): a mark that cannot be read is still an unclean stop; none, a clean one")
            XCTAssertNotNil(try engine.account("alice-id"))
        }
        // The kept stops: set aside when unreadable, and the engine starts.
        for how in [Damage.truncated, .garbage] {
            try damage(Engine.uncleanStopsFile, how)
            let engine = try makeEngine()
            XCTAssertTrue(engine.stateProblems.contains { $0.kind == .setAside && $0.file == Engine.uncleanStopsFile }, "\(how)")
            XCTAssertNotNil(contents(Engine.uncleanStopsFile), "\(how): written afresh with this start's unclean stop")
        }
        try damage(Engine.uncleanStopsFile, .removed)
        XCTAssertNoThrow(try makeEngine())
    }

    // MARK: Unlock attempts: set aside, and the count stays on the safe side.

    func testDamagedAttemptsCountAsTheBackoffLimitUntilTheRightPassphrase() throws {
        let clock = ManualClock()
        _ = try populate(processes: FakeProcessTable())
        for how in [Damage.truncated, .garbage] {
            try damage("attempts.json", how)
            var engine = try makeEngine(clock: clock)
            XCTAssertEqual(engine.unlockAttempts("alice-id").failures, Engine.backoffLimit, "\(how)")
            XCTAssertEqual(engine.stateProblems.first?.kind, .setAside)
            // Kept so from now on: a restart does not reset it.
            engine = try makeEngine(clock: clock)
            XCTAssertEqual(engine.unlockAttempts("alice-id").failures, Engine.backoffLimit, "\(how): after a restart")
            // A wrong passphrase waits the longest; the right one clears the count.
            XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong")))
            XCTAssertEqual(engine.unlockAttempts("alice-id").retryAfter, 300, accuracy: 1)
            clock.advance(by: 301)
            try engine.unlock("alice-id", passphrase: try passphrase("pw"))
            XCTAssertEqual(engine.unlockAttempts("alice-id").failures, 0)
            for name in try FileManager.default.contentsOfDirectory(atPath: directory) where name.hasPrefix("attempts.json.unreadable-") {
                try FileManager.default.removeItem(atPath: directory + "/" + name)
            }
            XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("wrong")))
        }
        // With MaxUnlockAttempts lower, the count stops one short of it.
        try damage("attempts.json", .garbage)
        var settings = testSettings()
        settings.maxUnlockAttempts = 5
        XCTAssertEqual(try makeEngine(settings, clock: clock).unlockAttempts("alice-id").failures, 4)
        // A removed file (only root can) is no failures.
        try damage("attempts.json", .removed)
        XCTAssertEqual(try makeEngine(clock: clock).unlockAttempts("alice-id").failures, 0)
    }
}
