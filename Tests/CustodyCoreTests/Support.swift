@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import Foundation
import Glibc
import Synchronization
import XCTest

func passphrase(_ text: String) throws -> SecretBytes {
    try Array(text.utf8).withUnsafeBytes { try SecretBytes(copying: $0) }
}

func testSettings(multiIdentity: Bool = true, grace: Double = 10) -> Settings {
    var settings = Settings()
    settings.multiIdentity = multiIdentity
    settings.lockGracePeriod = grace
    settings.passphraseCost = "minimal"
    return settings
}

/// A process table the test controls: thread → process, parent links, start times.
final class FakeProcessTable: ProcessTable, @unchecked Sendable {
    struct Task { var process: Int32; var parent: Int32?; var start: UInt64 }
    private let tasks = Mutex<[Int32: Task]>([:])

    func add(_ id: Int32, process: Int32? = nil, parent: Int32? = nil, start: UInt64) {
        tasks.withLock { $0[id] = Task(process: process ?? id, parent: parent, start: start) }
    }
    func remove(_ id: Int32) { _ = tasks.withLock { $0.removeValue(forKey: id) } }

    /// How many parent lookups identity resolution made (a walk up the process tree).
    let parentLookups = Mutex(0)

    func process(ofThread tid: Int32) -> Int32? { tasks.withLock { $0[tid]?.process } }
    func parent(of pid: Int32) -> Int32? {
        parentLookups.withLock { $0 += 1 }
        return tasks.withLock { $0[pid]?.parent }
    }
    func startTime(of pid: Int32) -> UInt64? { tasks.withLock { $0[pid]?.start } }
}

class EngineTestCase: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        var template = Array("/tmp/custody-core.XXXXXX".utf8CString)
        directory = String(cString: try XCTUnwrap(mkdtemp(&template)))
    }

    override func tearDown() {
        _ = try? FileManager.default.removeItem(atPath: directory)
    }

    func makeEngine(_ settings: Settings = testSettings(), clock: EngineClock = ManualClock(), processes: ProcessTable = FakeProcessTable()) throws -> Engine {
        try Engine(stateDirectory: directory, settings: settings, clock: clock, processes: processes)
    }

    func recorded(_ engine: Engine) -> EventRecorder {
        let recorder = EventRecorder()
        _ = engine.events.subscribe { event in recorder.withLock { $0.append(event) } }
        return recorder
    }
}

/// Events a subscriber saw, in order.
final class EventRecorder: @unchecked Sendable {
    private let events = Mutex<[EngineEvent]>([])
    func withLock<R>(_ body: (inout [EngineEvent]) -> R) -> R { events.withLock { body(&$0) } }
}
