@testable import CustodyCore
import Foundation
import Synchronization
import XCTest
import CustodyTestSupport

/// State files written after the engine's lock is released (`OrderedStateFile`): the file on disk
/// is the newest state whatever order the writers reach the disk in.
final class OrderedStateFileTests: EngineTestCase {
    struct Value: Codable, Equatable { var n: Int }

    func stored(_ name: String) throws -> Value {
        try JSONDecoder().decode(Value.self, from: Data(contentsOf: URL(fileURLWithPath: directory + "/" + name)))
    }

    func testAnOlderSnapshotWrittenLateDoesNotReplaceANewerOne() throws {
        let files = StateFiles(directory: directory, seal: nil)
        let file = OrderedStateFile<Value>("value.json")
        let first = file.snapshot(Value(n: 1)), second = file.snapshot(Value(n: 2))
        try files.save(second)
        try files.save(first)
        XCTAssertEqual(try stored("value.json"), Value(n: 2))
        let third = file.snapshot(Value(n: 3))
        try files.save(third)
        XCTAssertEqual(try stored("value.json"), Value(n: 3))
    }

    /// Binds from many threads at once, each writing outside the lock: `bindings.json` holds
    /// every binding, and a fresh engine reads all of them back.
    func testConcurrentBindingsAllReachTheDisk() throws {
        let processes = FakeProcessTable()
        let engine = try makeEngine(processes: processes)
        try engine.enroll(id: "bob-id", upn: "bob@contoso.com")
        let tasks = Array(Int32(1000)..<Int32(1064))
        for task in tasks { processes.add(task, start: 7) }
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: tasks.count) { index in
            do { try engine.bindProcess(tasks[index], to: "bob@contoso.com") } catch {
                failures.withLock { $0.append("\(tasks[index]): \(error)") }
            }
        }
        XCTAssertEqual(failures.withLock { $0 }, [])
        let onDisk = try XCTUnwrap(try engine.files.read(Engine.Bindings.self, from: "bindings.json"))
        XCTAssertEqual(Set(onDisk.processes.map(\.task.id)), Set(tasks))
        let reopened = try makeEngine(processes: processes)
        for task in tasks { XCTAssertEqual(reopened.resolve(thread: task, uid: 0).identity, "bob@contoso.com", "task \(task)") }
    }
}
