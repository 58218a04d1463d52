@testable import CustodyFormat
import CustodyCrypto
import CustodySystem
import XCTest

/// `ProtectedFile.repair`: a file cut back to its last authentic block reads cleanly to its new
/// end, which is authenticated again; a whole file is left as it is.
final class RepairTests: XCTestCase {
    let owner = try! Owner("alice@contoso.com")
    let content = (0..<(5 * 4096 + 1000)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
    static let storedBlock = 4096 + 28

    /// A stored file of `content` (6 blocks, the last of 1,000 bytes).
    func stored() throws -> MemoryStorage {
        let storage = MemoryStorage()
        let file = try ProtectedFile.create(on: storage, owner: owner, protectionClass: .complete, classKey: try symmetricClassKey())
        try file.write(content, at: 0)
        return storage
    }

    func repair(_ storage: MemoryStorage) throws -> RepairOutcome {
        let header = try ProtectedFile.readHeader(from: storage)
        return try ProtectedFile.repair(storage, header: header, fileKey: try header.unwrapFileKey(with: try symmetricClassKey()))
    }

    /// Opens the storage afresh and reads everything (which fails on any damage left).
    func readBack(_ storage: MemoryStorage) throws -> [UInt8] {
        let key = try symmetricClassKey()
        return try ProtectedFile.open(storage.copy()) { _ in key }.readAll()
    }

    func testAWholeFileIsLeftAsItIs() throws {
        let storage = try stored()
        let before = storage.bytes
        let outcome = try repair(storage)
        XCTAssertFalse(outcome.repaired)
        XCTAssertEqual(outcome, RepairOutcome(sizeBefore: UInt64(content.count), sizeAfter: UInt64(content.count), firstDamagedBlock: nil))
        XCTAssertEqual(storage.bytes, before)
    }

    func testATornTailIsCutToTheLastWholeBlock() throws {
        // A write cut short at a page boundary: the stored file ends 4,096-aligned, inside block 4.
        let storage = try stored()
        let cut = 512 + 4 * Self.storedBlock + 100 - (512 + 4 * Self.storedBlock + 100) % 4096
        try storage.truncate(to: UInt64(cut))
        XCTAssertThrowsError(try readBack(storage))
        let outcome = try repair(storage)
        XCTAssertTrue(outcome.repaired)
        let kept = try readBack(storage)
        XCTAssertEqual(kept, Array(content.prefix(kept.count)), "a prefix of what was written")
        XCTAssertEqual(UInt64(kept.count), outcome.sizeAfter)
        XCTAssertEqual(kept.count % 4096, 0)
        XCTAssertGreaterThanOrEqual(kept.count, 3 * 4096, "every whole block before the tear is kept")
        XCTAssertFalse(try repair(storage).repaired, "repairing again changes nothing")
    }

    func testADamagedBlockEndsTheFileBeforeIt() throws {
        for damaged in [0, 2, 5] {
            let storage = try stored()
            var bytes = storage.bytes
            bytes[512 + damaged * Self.storedBlock + 40] ^= 0x01
            let copy = MemoryStorage(bytes)
            let outcome = try repair(copy)
            XCTAssertEqual(outcome.firstDamagedBlock, UInt64(damaged), "block \(damaged)")
            XCTAssertEqual(outcome.sizeBefore, UInt64(content.count))
            XCTAssertEqual(outcome.sizeAfter, UInt64(damaged * 4096))
            XCTAssertEqual(try readBack(copy), Array(content.prefix(damaged * 4096)), "block \(damaged)")
            XCTAssertEqual(copy.bytes.count, damaged == 0 ? 512 : 512 + damaged * Self.storedBlock, "nothing past the new end is kept")
        }
    }

    func testACutAtABlockBoundaryIsSealedAgain() throws {
        // Cut after block 3: block 3 was written as an inner block, so the file reads as truncated.
        let storage = try stored()
        try storage.truncate(to: UInt64(512 + 4 * Self.storedBlock))
        XCTAssertThrowsError(try readBack(storage)) { XCTAssertEqual($0 as? FormatError, .truncated(lastBlock: 3)) }
        let outcome = try repair(storage)
        XCTAssertEqual(outcome, RepairOutcome(sizeBefore: 4 * 4096, sizeAfter: 4 * 4096, firstDamagedBlock: 3))
        XCTAssertEqual(try readBack(storage), Array(content.prefix(4 * 4096)))
    }

    func testHolesListedInTheRecordAreKept() throws {
        let storage = MemoryStorage()
        let file = try ProtectedFile.create(on: storage, owner: owner, protectionClass: .complete, classKey: try symmetricClassKey())
        try file.write([1, 2, 3], at: 0)
        try file.write([4, 5, 6], at: 3 * 4096)   // blocks 1 and 2 are holes
        try file.write([7, 8, 9], at: 5 * 4096)   // block 4 a hole
        var bytes = storage.bytes
        bytes[512 + 5 * Self.storedBlock + 20] ^= 0x80
        let copy = MemoryStorage(bytes, holeRecord: try storage.readHoleRecord())
        let outcome = try repair(copy)
        XCTAssertEqual(outcome.firstDamagedBlock, 5)
        XCTAssertEqual(outcome.sizeAfter, 5 * 4096, "the holes before the damage stay, the last one re-sealed as the final block")
        let kept = try readBack(copy)
        XCTAssertEqual(Array(kept[0..<3]), [1, 2, 3])
        XCTAssertEqual(Array(kept[(3 * 4096)..<(3 * 4096 + 3)]), [4, 5, 6])
        XCTAssertTrue(kept[(4 * 4096)...].allSatisfy { $0 == 0 })
    }
}
