import XCTest
@testable import CustodySystem

final class BufferPoolTests: XCTestCase {
    func testBuffersAreReusedAndAtMostKeepAreKept() {
        let pool = BufferPool(capacity: 4096, keep: 2, zeroesOnReturn: false)
        var first: UnsafeMutableRawPointer?
        pool.withBuffer(byteCount: 100) { buffer in
            XCTAssertEqual(buffer.count, 100)
            first = buffer.baseAddress
        }
        XCTAssertEqual(pool.keptCount, 1)
        pool.withBuffer(byteCount: 4096) { buffer in
            XCTAssertEqual(buffer.baseAddress, first, "the kept buffer is used again")
        }
        // Three at once: the third is freed when returned.
        pool.withBuffer(byteCount: 10) { _ in
            pool.withBuffer(byteCount: 10) { _ in
                pool.withBuffer(byteCount: 10) { _ in }
            }
        }
        XCTAssertEqual(pool.keptCount, 2)
    }

    func testLargerRequestsGetTheirOwnBufferAndAreNotKept() {
        let pool = BufferPool(capacity: 1024, keep: 2, zeroesOnReturn: false)
        pool.withBuffer(byteCount: 5000) { buffer in
            XCTAssertEqual(buffer.count, 5000)
            buffer.initializeMemory(as: UInt8.self, repeating: 7)
        }
        XCTAssertEqual(pool.keptCount, 0)
    }

    func testPlaintextPoolsZeroWhatWasUsed() {
        let pool = BufferPool(capacity: 4096, keep: 1, zeroesOnReturn: true)
        pool.withBuffer(byteCount: 3000) { buffer in
            buffer.initializeMemory(as: UInt8.self, repeating: 0xAB)
        }
        pool.withBuffer(byteCount: 4096) { buffer in
            XCTAssertTrue(buffer[0..<3000].allSatisfy { $0 == 0 }, "no plaintext left from the last use")
        }
    }

    func testErrorsPassThroughAndTheBufferComesBack() {
        struct Failure: Error {}
        let pool = BufferPool(capacity: 64, keep: 1, zeroesOnReturn: false)
        XCTAssertThrowsError(try pool.withBuffer(byteCount: 8) { (_) throws(Failure) in throw Failure() })
        XCTAssertEqual(pool.keptCount, 1)
    }
}
