@testable import CustodyCrypto
@testable import CustodyFormat
import Glibc
import XCTest

final class HeaderTests: XCTestCase {
    func testEncryptedHeaderRoundTripsAndUnwraps() throws {
        let owner = try Owner("  Alice@Contoso.COM ")
        XCTAssertEqual(owner.canonical, "alice@contoso.com")
        XCTAssertEqual(owner.display, "Alice@Contoso.COM")
        let fileKey = try SecretBytes.random(count: 32)
        let classKey = try symmetricClassKey()
        let header = try FileHeader.encrypted(owner: owner, protectionClass: .complete, classKey: classKey, fileKey: fileKey)
        let bytes = header.encoded()
        XCTAssertEqual(bytes.count, 512)
        XCTAssertEqual(Array(bytes[0..<8]), FileHeader.magic)
        let decoded = try bytes.withUnsafeBytes { try FileHeader.decode($0) }
        XCTAssertEqual(decoded, header)
        XCTAssertTrue(try decoded.unwrapFileKey(with: classKey).constantTimeEquals(fileKey))
        XCTAssertNotEqual(try FileHeader.encrypted(owner: owner, protectionClass: .complete, classKey: classKey, fileKey: fileKey).fileID,
                          header.fileID, "file IDs are random")
    }

    func testWrongOrMismatchedKeysAreTold() throws {
        let header = try FileHeader.encrypted(owner: try Owner("a@b"), protectionClass: .untilFirstAuthentication,
                                              classKey: try symmetricClassKey(), fileKey: try SecretBytes.random(count: 32))
        XCTAssertThrowsError(try header.unwrapFileKey(with: try symmetricClassKey(0x11, id: [8, 7, 6, 5, 4, 3, 2, 1]))) {
            XCTAssertEqual($0 as? FormatError, .wrongKey(keyID: [1, 2, 3, 4, 5, 6, 7, 8]))
        }
        XCTAssertThrowsError(try header.unwrapFileKey(with: try symmetricClassKey(0x12))) {
            XCTAssertEqual($0 as? FormatError, .headerAuthenticationFailed, "same ID, other key bytes")
        }
        let (classB, _, _) = try classBKey(id: [1, 2, 3, 4, 5, 6, 7, 8])
        XCTAssertThrowsError(try header.unwrapFileKey(with: classB)) { XCTAssertEqual($0 as? FormatError, .wrongKey(keyID: [1, 2, 3, 4, 5, 6, 7, 8])) }
    }

    func testClassBCreatesWithThePublicKeyAndOpensOnlyWithThePrivateKey() throws {
        let (locked, _, _) = try classBKey(unlocked: false)
        let (unlocked, _, _) = try classBKey(unlocked: true)
        let fileKey = try SecretBytes.random(count: 32)
        let header = try FileHeader.encrypted(owner: try Owner("a@b"), protectionClass: .completeUnlessOpen, classKey: locked, fileKey: fileKey)
        XCTAssertEqual(header.wrapMethod, .classAgreement)
        XCTAssertNotEqual(header.ephemeralPublicKey, [UInt8](repeating: 0, count: 32))
        XCTAssertThrowsError(try header.unwrapFileKey(with: locked)) {
            guard case .unsupported = $0 as? FormatError else { return XCTFail("\($0)") }
        }
        XCTAssertTrue(try header.unwrapFileKey(with: unlocked).constantTimeEquals(fileKey))
        // Changing the ephemeral public key breaks the unwrap.
        var bytes = header.encoded()
        bytes[48] ^= 0x40
        let tampered = try bytes.withUnsafeBytes { try FileHeader.decode($0) }
        XCTAssertThrowsError(try tampered.unwrapFileKey(with: unlocked)) { XCTAssertEqual($0 as? FormatError, .headerAuthenticationFailed) }
    }

    func testRewrapKeepsFileIDAndKey() throws {
        let fileKey = try SecretBytes.random(count: 32)
        let header = try FileHeader.encrypted(owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey(), fileKey: fileKey)
        let (classB, _, _) = try classBKey()
        let moved = try header.rewrapped(fileKey: fileKey, to: .completeUnlessOpen, classKey: classB)
        XCTAssertEqual(moved.fileID, header.fileID)
        XCTAssertEqual(moved.protectionClass, .completeUnlessOpen)
        XCTAssertTrue(try moved.unwrapFileKey(with: classB).constantTimeEquals(fileKey))
    }

    func testPlainHeaderRecordsOwnerAndDetectsCorruption() throws {
        let header = try FileHeader.plain(owner: try Owner("Bob@Personal.example"))
        var bytes = header.encoded()
        XCTAssertEqual(try bytes.withUnsafeBytes { try FileHeader.decode($0) }, header)
        bytes[300] ^= 0x01  // inside the display owner
        XCTAssertThrowsError(try bytes.withUnsafeBytes { try FileHeader.decode($0) }) {
            guard case .corruptHeader = $0 as? FormatError else { return XCTFail("\($0)") }
        }
        XCTAssertThrowsError(try header.unwrapFileKey(with: try symmetricClassKey()))
    }

    func testDecodeRejectsMalformedHeaders() throws {
        let good = try FileHeader.encrypted(owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey(),
                                            fileKey: try SecretBytes.random(count: 32)).encoded()
        func decode(_ bytes: [UInt8]) -> FormatError? {
            do { _ = try bytes.withUnsafeBytes { try FileHeader.decode($0) }; return nil } catch { return error as? FormatError }
        }
        XCTAssertEqual(decode(Array("plain text file".utf8)), .notProtected)
        XCTAssertEqual(decode([]), .notProtected)
        var version = good; version[8] = 4
        XCTAssertEqual(decode(version), .unsupportedVersion(4))
        // A version 3 header must not name its owner, nor an earlier one leave it out.
        version[8] = 3
        if case .corruptHeader = decode(version) {} else { XCTFail("a version 3 header naming its owner") }
        if case .corruptHeader = decode(Array(good[0..<300])) {} else { XCTFail("short header") }
        var kind = good; kind[10] = 9
        XCTAssertEqual(decode(kind), .corruptHeader("unknown content kind 9"))
        var protectionClass = good; protectionClass[11] = 4
        XCTAssertEqual(decode(protectionClass), .corruptHeader("unknown protection class 4"))
        var length = good; length[13] = 0
        if case .corruptHeader = decode(length) {} else { XCTFail("header length") }
        var owner = good; owner[37] = 0
        if case .corruptHeader = decode(owner) {} else { XCTFail("owner length 0") }
        var ownerLong = good; ownerLong[38] = 200
        if case .corruptHeader = decode(ownerLong) {} else { XCTFail("owner length 200") }
        var tail = good; tail[511] = 1
        XCTAssertEqual(decode(tail), .corruptHeader("trailing bytes are not zero"))
        var padding = good; padding[200] = 1
        XCTAssertEqual(decode(padding), .corruptHeader("owner padding is not zero"))
        var utf8 = good; utf8[80] = 0xFF
        XCTAssertEqual(decode(utf8), .corruptHeader("owner is not valid UTF-8"))
    }

    func testOwnerLimits() throws {
        XCTAssertThrowsError(try Owner("   ")) { guard case .invalidOwner = $0 as? FormatError else { return XCTFail() } }
        XCTAssertThrowsError(try Owner(String(repeating: "x", count: 181)))
        XCTAssertNoThrow(try Owner(String(repeating: "x", count: 180)))
        XCTAssertThrowsError(try Owner("a\u{0}b"))
        XCTAssertTrue(try Owner("ALICE@x").matches(try Owner("alice@X")))
        XCTAssertEqual(try Owner("Zoë@Example.org").canonical, "zoë@example.org")
    }

    func testOwnerRecord() throws {
        let plain = OwnerRecord(owner: try Owner("Bob@Personal.example"))
        let record = plain.encoded()
        XCTAssertEqual(Array(record.prefix(3)), [1, 0, 0])
        XCTAssertEqual(try OwnerRecord.decode(record), plain)
        let encrypted = OwnerRecord(owner: try Owner("alice@contoso.com"), encryptedClass: .completeUnlessOpen)
        XCTAssertEqual(Array(encrypted.encoded().prefix(3)), [1, 1, 2])
        XCTAssertEqual(try OwnerRecord.decode(encrypted.encoded()), encrypted)
        XCTAssertThrowsError(try OwnerRecord.decode([]))
        XCTAssertThrowsError(try OwnerRecord.decode([3] + record.dropFirst())) { XCTAssertEqual($0 as? FormatError, .unsupportedVersion(3)) }
        // Version 2: a managed identity by key ID.
        let byKey = OwnerRecord(ownerKeyID: [9, 8, 7, 6, 5, 4, 3, 2], encryptedClass: .complete)
        XCTAssertEqual(byKey.encoded(), [2, 1, 3, 9, 8, 7, 6, 5, 4, 3, 2])
        XCTAssertEqual(try OwnerRecord.decode(byKey.encoded()), byKey)
        XCTAssertNil(byKey.owner)
        XCTAssertThrowsError(try OwnerRecord.decode(Array(byKey.encoded().dropLast())))
        XCTAssertThrowsError(try OwnerRecord.decode([2] + record.dropFirst()), "a named record is not version 2")
        XCTAssertThrowsError(try OwnerRecord.decode(Array(record.dropLast())))
        XCTAssertThrowsError(try OwnerRecord.decode(record + [0]))
        XCTAssertThrowsError(try OwnerRecord.decode([1, 2, 0] + record.dropFirst(3)), "unknown kind")
        XCTAssertThrowsError(try OwnerRecord.decode([1, 1, 9] + record.dropFirst(3)), "unknown class")
        XCTAssertThrowsError(try OwnerRecord.decode([1, 0, 3] + record.dropFirst(3)), "plain with a class")
    }

    /// Unmanaged files keep their bytes: the owner lives in a trusted.* attribute of the stored file.
    func testOwnerRecordOnARealFile() throws {
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        let content = Array("personal notes".utf8)
        _ = content.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        XCTAssertNil(try OwnerRecord.load(from: path))
        let owner = try Owner("Bob@Personal.example")
        try OwnerRecord(owner: owner).store(at: path)
        XCTAssertEqual(try OwnerRecord.load(from: path)?.owner, owner)
        var buffer = [UInt8](repeating: 0, count: 64)
        XCTAssertEqual(pread(fd, &buffer, 64, 0), content.count)
        XCTAssertEqual(Array(buffer[0..<content.count]), content, "the stored bytes are untouched")
        try OwnerRecord.remove(at: path)
        XCTAssertNil(try OwnerRecord.load(from: path))
        XCTAssertNoThrow(try OwnerRecord.remove(at: path), "removing twice is fine")
        XCTAssertThrowsError(try OwnerRecord(owner: owner).store(at: path + ".missing")) { XCTAssertEqual($0 as? FormatError, .io(.noSuchFile)) }
    }

    func testProtectionClassNames() {
        XCTAssertEqual(ProtectionClass(name: "NSFileProtectionComplete"), .complete)
        XCTAssertEqual(ProtectionClass(name: "NSFileProtectionCompleteUnlessOpen"), .completeUnlessOpen)
        XCTAssertEqual(ProtectionClass(name: "NSFileProtectionCompleteUntilFirstUserAuthentication"), .untilFirstAuthentication)
        XCTAssertEqual(ProtectionClass(name: "NSFileProtectionNone"), ProtectionClass.none)
        XCTAssertEqual(ProtectionClass(name: "untilFirstAuth"), .untilFirstAuthentication)
        XCTAssertEqual(ProtectionClass(name: "When device locked"), .complete)
        XCTAssertEqual(ProtectionClass(name: "locked except open files"), .completeUnlessOpen)
        XCTAssertEqual(ProtectionClass(name: "after restart"), .untilFirstAuthentication)
        XCTAssertEqual(ProtectionClass(name: "use device settings"), ProtectionClass.none)
        XCTAssertEqual(ProtectionClass(name: "b"), .completeUnlessOpen)
        XCTAssertNil(ProtectionClass(name: "sometimes"))
        XCTAssertTrue(ProtectionClass.none < .untilFirstAuthentication && .untilFirstAuthentication < .completeUnlessOpen && .completeUnlessOpen < .complete)
    }
}
