import XCTest
@testable import CustodyFormat

final class NoncesTests: XCTestCase {
    private func nonce() throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 12)
        try bytes.withUnsafeMutableBytes { try Nonces.fill($0) }
        return bytes
    }

    func testNoncesDoNotRepeatAcrossBatches() throws {
        // 10,000 nonces span about 30 batches of the thread's supply.
        var seen = Set<[UInt8]>()
        for _ in 0..<10_000 { seen.insert(try nonce()) }
        XCTAssertEqual(seen.count, 10_000)
    }

    func testLargeRequestsBypassTheBatch() throws {
        _ = try nonce()
        let before = try XCTUnwrap(Nonces.batchUsedForTests)
        var big = [UInt8](repeating: 0, count: 3 * 1024)
        try big.withUnsafeMutableBytes { try Nonces.fill($0) }
        XCTAssertEqual(Nonces.batchUsedForTests, before, "a large request draws from the generator directly")
        XCTAssertFalse(big.allSatisfy { $0 == 0 })
    }

    func testAForkedChildDoesNotReuseTheParentsBatch() throws {
        _ = try nonce()
        _ = try nonce()
        XCTAssertGreaterThanOrEqual(try XCTUnwrap(Nonces.batchUsedForTests), 24)
        // What pthread_atfork's child handler does.
        Nonces.forkGeneration.wrappingAdd(1, ordering: .relaxed)
        _ = try nonce()
        XCTAssertEqual(Nonces.batchUsedForTests, 12, "the batch was refilled before use")
    }
}
