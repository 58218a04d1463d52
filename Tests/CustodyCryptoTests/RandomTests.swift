import Dispatch
import Synchronization
import XCTest
@testable import CustodyCrypto

final class RandomTests: XCTestCase {
    private func nonce() throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 12)
        try bytes.withUnsafeMutableBytes { try Random.fill($0) }
        return bytes
    }

    func testDrawsDoNotRepeatAcrossBatches() throws {
        // 10,000 nonces span about 30 batches of the thread's supply.
        var seen = Set<[UInt8]>()
        for _ in 0..<10_000 { seen.insert(try nonce()) }
        XCTAssertEqual(seen.count, 10_000)
        // File-ID-sized draws between them do not repeat either.
        var ids = Set<[UInt8]>()
        for _ in 0..<1_000 {
            ids.insert(try Random.bytes(16))
            _ = try nonce()
        }
        XCTAssertEqual(ids.count, 1_000)
    }

    func testLargeRequestsBypassTheBatch() throws {
        _ = try nonce()
        let before = Random.batchUsedForTests
        var big = [UInt8](repeating: 0, count: 3 * 1024)
        try big.withUnsafeMutableBytes { try Random.fill($0) }
        XCTAssertEqual(Random.batchUsedForTests, before, "a large request draws from the generator directly")
        XCTAssertFalse(big.allSatisfy { $0 == 0 })
    }

    func testAForkedChildDoesNotReuseTheParentsBatch() throws {
        _ = try nonce()
        _ = try nonce()
        XCTAssertGreaterThanOrEqual(Random.batchUsedForTests, 24)
        // What pthread_atfork's child handler does.
        Random.forkGeneration.wrappingAdd(1, ordering: .relaxed)
        _ = try nonce()
        XCTAssertEqual(Random.batchUsedForTests, 12, "the batch was refilled before use")
    }

    func testThreadsDrawFromBatchesOfTheirOwn() throws {
        let draws = Mutex<[[UInt8]]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            var mine: [[UInt8]] = []
            for _ in 0..<2_000 {
                if let bytes = try? Random.bytes(12) { mine.append(bytes) }
            }
            draws.withLock { $0 += mine }
        }
        let all = draws.withLock { $0 }
        XCTAssertEqual(all.count, 8_000)
        XCTAssertEqual(Set(all).count, 8_000)
    }
}
