@testable import CustodyCore
import CustodyCrypto
import Foundation
import XCTest

/// Recovery keys: their printable form, recovery of a lost passphrase, escrow, and wipe.
final class RecoveryTests: EngineTestCase {
    func testThePrintableFormChecksEachGroup() throws {
        let key = try RecoveryKey.generate()
        let text = key.printable
        XCTAssertEqual(text.split(separator: "-").count, 8)
        XCTAssertTrue(text.split(separator: "-").allSatisfy { $0.count == 6 && $0.allSatisfy(\.isNumber) }, text)
        XCTAssertEqual(try RecoveryKey(parsing: text.replacingOccurrences(of: "-", with: " ")).printable, text, "spaces or dashes")
        XCTAssertNotEqual(try RecoveryKey.generate().printable, text)
        // One digit changed in the third group.
        var digits = Array(text)
        let index = 2 * 7 + 1
        digits[index] = digits[index] == "9" ? "0" : Character(String(digits[index].wholeNumberValue! + 1))
        XCTAssertThrowsError(try RecoveryKey(parsing: String(digits))) {
            XCTAssertEqual(($0 as? EngineError)?.description.contains("group 3"), true, "\($0)")
        }
        XCTAssertThrowsError(try RecoveryKey(parsing: "12345"))
        XCTAssertEqual("\(key)", "RecoveryKey(redacted)")
    }

    func testALostPassphraseIsRecoveredAndReset() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("forgotten"))
        XCTAssertThrowsError(try engine.createRecoveryKey("bob-id"))
        let (key, _) = try engine.createRecoveryKey("alice-id")
        XCTAssertEqual(try engine.account("alice-id").hasRecoveryKey, true)
        try engine.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try engine.recover("alice-id", with: try RecoveryKey.generate(), newPassphrase: nil), "another key")
        try engine.recover("alice-id", with: try RecoveryKey(parsing: key.printable), newPassphrase: try passphrase("new one"))
        XCTAssertEqual(try engine.lockStatus("alice-id"), .unlocked)
        try engine.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("forgotten")), "the old passphrase is gone")
        try engine.unlock("alice-id", passphrase: try passphrase("new one"))
        try engine.lock("alice-id", immediately: true)
        try engine.recover("alice-id", with: key, newPassphrase: nil)
        XCTAssertEqual(try engine.lockStatus("alice-id"), .unlocked, "the recovery key keeps working")

        // A restart keeps the recovery protector.
        let restarted = try makeEngine()
        try restarted.unlock("alice-id", using: .recovery(key))
    }

    func testEscrowRoundTripTamperingAndWipe() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        let (publicKey, secretKey) = try SealedBox.keyPair()
        let (key, escrow) = try engine.createRecoveryKey("alice-id", escrowTo: publicKey)
        let blob = try XCTUnwrap(escrow)
        XCTAssertFalse(String(decoding: try JSONEncoder().encode(blob), as: UTF8.self).contains(key.printable), "the escrow holds no key in clear")
        func open(_ blob: EscrowedRecoveryKey) throws -> EscrowContent {
            let opened = try SealedBox.open(Array(Data(base64Encoded: blob.sealed)!), publicKey: publicKey, secretKey: secretKey)
            return try opened.withUnsafeBytes { try JSONDecoder().decode(EscrowContent.self, from: Data($0)) }
        }
        let content = try open(blob)
        XCTAssertEqual(content.recoveryKey, key.printable)
        XCTAssertEqual(content.upn, "alice@contoso.com")
        var tampered = blob
        var sealed = Array(Data(base64Encoded: blob.sealed)!)
        sealed[sealed.count / 2] ^= 1
        tampered.sealed = Data(sealed).base64EncodedString()
        XCTAssertThrowsError(try open(tampered)) { XCTAssertEqual($0 as? CryptoError, .authenticationFailed) }
        let (otherPublic, otherSecret) = try SealedBox.keyPair()
        XCTAssertThrowsError(try SealedBox.open(Array(Data(base64Encoded: blob.sealed)!), publicKey: otherPublic, secretKey: otherSecret))

        // After a wipe the escrowed key opens nothing, even for the same account enrolled again.
        try engine.deregister("alice-id", wipe: true)
        let unsealed = try RecoveryKey(parsing: content.recoveryKey)
        XCTAssertThrowsError(try engine.recover("alice-id", with: unsealed, newPassphrase: nil)) { XCTAssertEqual(($0 as? EngineError)?.code, 300) }
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try engine.recover("alice-id", with: unsealed, newPassphrase: nil)) { XCTAssertEqual(($0 as? EngineError)?.code, 315) }
    }
}
