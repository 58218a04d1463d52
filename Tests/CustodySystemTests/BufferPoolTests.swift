import XCTest
import Foundation
import Synchronization
@testable import CustodySystem
import CustodyTestSupport

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

    func testSmallRequestsDoNotTakeKeptBuffers() {
        let pool = BufferPool(capacity: 8192, keep: 2, zeroesOnReturn: true, smallLimit: 1024)
        var kept: UnsafeMutableRawPointer?
        pool.withBuffer(byteCount: 4096) { kept = $0.baseAddress }
        XCTAssertEqual(pool.keptCount, 1)
        pool.withBuffer(byteCount: 1024) { buffer in
            XCTAssertEqual(buffer.count, 1024)
            XCTAssertNotEqual(buffer.baseAddress, kept, "a small request does not use the kept buffer")
            XCTAssertEqual(pool.keptCount, 1, "and leaves it in the pool")
            buffer.initializeMemory(as: UInt8.self, repeating: 0xCD)
        }
        XCTAssertEqual(pool.keptCount, 1)
        pool.withBuffer(byteCount: 1025) { buffer in
            XCTAssertEqual(buffer.baseAddress, kept, "above the limit the pool serves it")
        }
    }

    func testPlaintextPoolsZeroWhatWasUsed() {
        let pool = BufferPool(capacity: 4096, keep: 1, zeroesOnReturn: true)
        pool.withBuffer(byteCount: 3000) { buffer in
            _ = buffer.initializeMemory(as: UInt8.self, repeating: 0xAB)
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

final class ThreadScratchTests: XCTestCase {
    func testNestedBuffersAreDisjointAndReleasedInOrder() {
        let before = ThreadScratch.bytesInUse
        ThreadScratch.withBuffer(byteCount: 100, zeroing: false) { outer in
            XCTAssertEqual(outer.count, 100)
            XCTAssertEqual(Int(bitPattern: outer.baseAddress) % 64, 0, "aligned to 64")
            ThreadScratch.withBuffer(byteCount: 5000, zeroing: false) { inner in
                XCTAssertEqual(inner.count, 5000)
                XCTAssertGreaterThanOrEqual(inner.baseAddress!, outer.baseAddress! + 100, "the inner buffer starts after the outer one")
                XCTAssertEqual(ThreadScratch.bytesInUse, before + 128 + 5056)
            }
            XCTAssertEqual(ThreadScratch.bytesInUse, before + 128)
        }
        XCTAssertEqual(ThreadScratch.bytesInUse, before)
    }

    func testZeroingClearsWhatWasUsedAndErrorsReleaseTheBuffer() {
        struct Failure: Error {}
        var address: UnsafeMutableRawPointer?
        XCTAssertThrowsError(try ThreadScratch.withBuffer(byteCount: 4096, zeroing: true) { (buffer) throws(Failure) in
            address = buffer.baseAddress
            buffer.initializeMemory(as: UInt8.self, repeating: 0xEE)
            throw Failure()
        })
        ThreadScratch.withBuffer(byteCount: 4096, zeroing: false) { buffer in
            XCTAssertEqual(buffer.baseAddress, address, "the same bytes are handed out again")
            XCTAssertTrue(buffer.allSatisfy { $0 == 0 }, "no plaintext left from the last use")
        }
    }

    func testRequestsBeyondTheRegionGetTheirOwnBuffer() {
        let before = ThreadScratch.bytesInUse
        ThreadScratch.withBuffer(byteCount: ThreadScratch.regionSize + 1, zeroing: true) { buffer in
            XCTAssertEqual(buffer.count, ThreadScratch.regionSize + 1)
            buffer.initializeMemory(as: UInt8.self, repeating: 1)
            XCTAssertEqual(ThreadScratch.bytesInUse, before, "the region is untouched")
        }
    }

    func testEachThreadHasItsOwnRegion() throws {
        var mine: UnsafeMutableRawPointer?
        ThreadScratch.withBuffer(byteCount: 64, zeroing: false) { mine = $0.baseAddress }
        let theirs = Mutex<UnsafeMutableRawPointerBox?>(nil)
        let thread = Thread { ThreadScratch.withBuffer(byteCount: 64, zeroing: false) { buffer in theirs.withLock { $0 = UnsafeMutableRawPointerBox(buffer.baseAddress) } } }
        thread.start()
        try eventually("the other thread's buffer", interval: 0.001) { theirs.withLock { $0 != nil } }
        XCTAssertNotEqual(theirs.withLock { $0?.pointer }, mine)
    }
}

private struct UnsafeMutableRawPointerBox: @unchecked Sendable, Equatable {
    let pointer: UnsafeMutableRawPointer?
    init(_ pointer: UnsafeMutableRawPointer?) { self.pointer = pointer }
}
