import CustodyCore
import Synchronization

/// A process table the test controls: thread → process, parent links, start times. The engine
/// takes it in place of /proc, so identity resolution and the routes that bind are tested
/// without real processes.
public final class FakeProcessTable: ProcessTable, @unchecked Sendable {
    struct Task { var process: Int32; var parent: Int32?; var start: UInt64 }
    private let tasks = Mutex<[Int32: Task]>([:])

    public init() {}

    public func add(_ id: Int32, process: Int32? = nil, parent: Int32? = nil, start: UInt64) {
        tasks.withLock { $0[id] = Task(process: process ?? id, parent: parent, start: start) }
    }

    public func remove(_ id: Int32) { _ = tasks.withLock { $0.removeValue(forKey: id) } }

    /// How many parent lookups identity resolution made (a walk up the process tree).
    public let parentLookups = Mutex(0)

    public func process(ofThread tid: Int32) -> Int32? { tasks.withLock { $0[tid]?.process } }

    public func parent(of pid: Int32) -> Int32? {
        parentLookups.withLock { $0 += 1 }
        return tasks.withLock { $0[pid]?.parent }
    }

    public func startTime(of pid: Int32) -> UInt64? { tasks.withLock { $0[pid]?.start } }
}
