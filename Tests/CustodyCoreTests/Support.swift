@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import Foundation
import Glibc
import Synchronization
import XCTest
import CustodyTestSupport

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

class EngineTestCase: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-core").path
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
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

/// Tests with engines of other hosts besides `makeEngine`'s: each with a state directory (and so
/// machine and host keys) of its own, removed in `tearDown`.
class HostsEngineTestCase: EngineTestCase {
    private var otherDirectories: [String] = []

    override func tearDown() {
        for directory in otherDirectories { TemporaryDirectory.removeTree(directory) }
        otherDirectories = []
        super.tearDown()
    }

    /// The engine of another host.
    func otherEngine() throws -> Engine {
        let directory = try TemporaryDirectory("custody-core-other").path
        otherDirectories.append(directory)
        return try Engine(stateDirectory: directory, settings: testSettings(), clock: ManualClock(), processes: FakeProcessTable())
    }
}

/// Events a subscriber saw, in order.
final class EventRecorder: @unchecked Sendable {
    private let events = Mutex<[EngineEvent]>([])
    func withLock<R>(_ body: (inout [EngineEvent]) -> R) -> R { events.withLock { body(&$0) } }
}
