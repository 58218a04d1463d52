@testable import CustodyCrypto
@testable import CustodyFormat
import Foundation
import XCTest

/// Files a release with another AES-GCM implementation wrote (`Fixtures/`, with random nonces and
/// file keys, as the mount writes them): the current code reads every byte back, and refuses them
/// changed. What was written once must keep opening, whichever library seals.
final class WrittenBeforeTests: XCTestCase {
    /// What the fixtures hold: 9000 bytes (5000 for class B) counting by 7 from 3.
    let content = (0..<9000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }

    func fixture(_ name: String) throws -> [UInt8] {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/\(name)")
        return [UInt8](try Data(contentsOf: url))
    }

    func testAClassAFileOpensAndReadsBack() throws {
        let stored = try fixture("class-a-file.bin")
        let key = try symmetricClassKey()
        let file = try ProtectedFile.open(MemoryStorage(stored)) { _ in key }
        XCTAssertNil(file.header.owner, "a version 3 header names no owner")
        XCTAssertEqual(file.header.protectionClass, .complete)
        XCTAssertEqual(try file.readAll(), content)
        var changed = stored
        changed[changed.count - 20] ^= 0x01
        XCTAssertThrowsError(try ProtectedFile.open(MemoryStorage(changed)) { _ in key }.readAll(), "a flipped byte in the last block")
        let other = try symmetricClassKey(0x12)
        XCTAssertThrowsError(try ProtectedFile.open(MemoryStorage(stored)) { _ in other }.readAll(), "another class key")
    }

    func testAClassBFileOpensWithItsPrivateKey() throws {
        let stored = try fixture("class-b-file.bin")
        let (unlocked, _, _) = try classBKey()
        let file = try ProtectedFile.open(MemoryStorage(stored)) { _ in unlocked }
        XCTAssertEqual(file.header.protectionClass, .completeUnlessOpen)
        XCTAssertEqual(try file.readAll(), Array(content.prefix(5000)))
        let (locked, _, _) = try classBKey(unlocked: false)
        XCTAssertThrowsError(try ProtectedFile.open(MemoryStorage(stored)) { _ in locked }.readAll(), "no private key: no file key")
    }

    func testAWrappedKeyUnwraps() throws {
        let wrapped = try fixture("wrapped-key.bin")
        let wrapping = try AESGCMKey(try secretBytes([UInt8](repeating: 0x42, count: 32)))
        let context = [UInt8]("wrap context".utf8)
        let key = try wrapped.withUnsafeBytes { sealed in try context.withUnsafeBytes { try KeyWrap.unwrap(sealed, with: wrapping, context: $0) } }
        XCTAssertEqual(key.withUnsafeBytes { Array($0) }, [UInt8](repeating: 0x5A, count: 32))
        let other = [UInt8]("another context".utf8)
        XCTAssertThrowsError(try wrapped.withUnsafeBytes { sealed in try other.withUnsafeBytes { try KeyWrap.unwrap(sealed, with: wrapping, context: $0) } })
    }
}
