import CustodyCrypto
import CustodySystem
import FoundationEssentials

/// A recovery key as printed for a person: 8 groups of 6 digits, each group 5 random digits and
/// a Luhn check digit (a typo in a group is caught and named), about 133 bits in all.
public struct RecoveryKey: Sendable, CustomStringConvertible {
    public static let groups = 8
    /// The 48 digits, in secure memory.
    let digits: SecretBytes

    /// A new random key.
    public static func generate() throws(EngineError) -> RecoveryKey {
        var text: [UInt8] = []
        defer { for index in text.indices { text[index] = 0 } }
        do {
            for _ in 0..<groups {
                var group: [UInt8] = []
                while group.count < 5 {
                    // Rejection sampling: bytes of 250 and above would favour the low digits.
                    for byte in try Random.bytes(8) where byte < 250 && group.count < 5 { group.append(byte % 10) }
                }
                group.append(luhn(group))
                text += group.map { $0 + 0x30 }
            }
            return RecoveryKey(digits: try text.withBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) })
        } catch let error as CryptoError {
            throw .crypto(error)
        } catch {
            throw .crypto(.library("\(error)"))
        }
    }

    /// Reads a key as typed: digits, with any spaces or dashes; each group's check digit must hold.
    public init(parsing text: String) throws(EngineError) {
        var digits: [UInt8] = []
        defer { for index in digits.indices { digits[index] = 0 } }
        for byte in text.utf8 {
            if byte >= 0x30, byte <= 0x39 { digits.append(byte - 0x30) } else if byte != UInt8(ascii: " "), byte != UInt8(ascii: "-") {
                throw .invalidRecoveryKey("only digits, spaces and dashes")
            }
        }
        guard digits.count == Self.groups * 6 else { throw .invalidRecoveryKey("\(Self.groups) groups of 6 digits, not \(digits.count) digits") }
        for group in 0..<Self.groups {
            let slice = Array(digits[group * 6..<group * 6 + 6])
            guard Self.luhn(Array(slice.prefix(5))) == slice[5] else { throw .invalidRecoveryKey("group \(group + 1) does not check; a digit is mistyped") }
        }
        var ascii = digits.map { $0 + 0x30 }
        defer { for index in ascii.indices { ascii[index] = 0 } }
        do { self.digits = try ascii.withBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) } } catch { throw .crypto(error) }
    }

    private init(digits: SecretBytes) { self.digits = digits }

    /// The Luhn check digit of `digits` (0…9 each).
    static func luhn(_ digits: [UInt8]) -> UInt8 {
        var sum = 0
        for (index, digit) in digits.reversed().enumerated() {
            var value = Int(digit)
            if index % 2 == 0 { value *= 2; if value > 9 { value -= 9 } }
            sum += value
        }
        return UInt8((10 - sum % 10) % 10)
    }

    /// The printable form, `123456-234567-…` (the only way the digits leave secure memory).
    public var printable: String {
        digits.withUnsafeBytes { bytes in
            stride(from: 0, to: bytes.count, by: 6).map { String(decoding: bytes[$0..<$0 + 6], as: UTF8.self) }.joined(separator: "-")
        }
    }

    public var description: String { "RecoveryKey(redacted)" }
}

/// A recovery key sealed to an administrator's public key (libsodium's sealed box), for an MDM
/// or a vault to hold. The sealed part repeats the account, so that the outer fields cannot be
/// changed unnoticed; `custodyctl recovery-key unseal` opens it with the secret key.
public struct EscrowedRecoveryKey: Codable, Equatable, Sendable {
    public var format = "custody-recovery-escrow"
    public var version = 1
    public var accountID: String
    public var upn: String
    /// Wall-clock seconds since 1970.
    public var created: Double
    /// The administrator's public key (base64), to tell escrows apart.
    public var publicKey: String
    /// Base64 of the sealed box of `{"accountID", "upn", "recoveryKey"}`.
    public var sealed: String
}

/// What the sealed box holds.
struct EscrowContent: Codable {
    var accountID: String
    var upn: String
    var recoveryKey: String
}
