import CustodyCrypto

/// Names of a managed identity's files, directories and symlinks as the backing store keeps them,
/// and symlink targets: encrypted under a key of that identity, so that a copy of the disk shows
/// neither the names nor whose they are (a key tag groups the names of one identity, and nothing
/// more).
///
/// A name is encrypted deterministically within its directory, so that a lookup finds it without
/// listing the directory: AES-256-GCM with a nonce derived from the directory's tweak and the name
/// (`HKDF(nonceKey, tweak ‖ name)`, 12 bytes), which only the same name in the same directory
/// repeats. Stored: `~c3` ‖ key tag (6 characters) ‖ `.` ‖ base64url(nonce ‖ ciphertext ‖ GCM tag),
/// without padding. When that is longer than `NameCipher.maxStoredLength`, the stored name is
/// `~c3` ‖ key tag ‖ `-` ‖ base64url(SHA-256 of the full form) and the full form lives beside it
/// (an extended attribute): `StoredName.long`.
///
/// A symlink target is sealed with a random nonce (it is never looked up): `~c3` ‖ key tag ‖ `:` ‖
/// base64url(nonce ‖ ciphertext ‖ GCM tag). The associated data binds each kind, so a name cannot
/// be passed off as a target.
public final class NameKey: Sendable {
    /// Six base64url characters (36 bits) from the key: which identity's key opens a stored name.
    public let tag: String
    private let cipher: AESGCMKey
    private let nonceKey: SecretBytes

    /// The name key of an identity, from its key `secret` (32 bytes or more).
    public init(deriving secret: SecretBytes) throws(CryptoError) {
        cipher = try AESGCMKey(HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 cipher".utf8), count: 32))
        nonceKey = try HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 nonce".utf8), count: 32)
        let tagBytes = try HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 tag".utf8), count: 6)
        tag = String(Base64URL.encode(tagBytes.withUnsafeBytes { Array($0) }).prefix(6))
    }

    func seal(_ plaintext: [UInt8], nonce: [UInt8], aad: [UInt8]) throws(CryptoError) -> [UInt8] {
        var output = nonce + plaintext + [UInt8](repeating: 0, count: AESGCMKey.tagSize)
        var failure: CryptoError?
        output.withUnsafeMutableBytes { out in
            nonce.withUnsafeBytes { nonceBytes in
                aad.withUnsafeBytes { aadBytes in
                    guard let base = out.baseAddress else { return }
                    let plain = UnsafeRawBufferPointer(start: base + nonce.count, count: plaintext.count)
                    do throws(CryptoError) {
                        try cipher.seal(nonce: nonceBytes, aad: aadBytes, plaintext: plain,
                                        ciphertext: base + nonce.count, tag: base + nonce.count + plaintext.count)
                    } catch {
                        failure = error
                    }
                }
            }
        }
        if let failure { throw failure }
        return output
    }

    func open(_ sealed: [UInt8], aad: [UInt8]) throws(CryptoError) -> [UInt8] {
        let nonceSize = AESGCMKey.nonceSize, tagSize = AESGCMKey.tagSize
        guard sealed.count >= nonceSize + tagSize else { throw .authenticationFailed }
        let length = sealed.count - nonceSize - tagSize
        // One spare byte, so that an empty name still has an address to decrypt into.
        var plaintext = [UInt8](repeating: 0, count: length + 1)
        var failure: CryptoError?
        sealed.withUnsafeBytes { all in
            aad.withUnsafeBytes { aadBytes in
                plaintext.withUnsafeMutableBytes { out in
                    guard let base = all.baseAddress, let target = out.baseAddress else {
                        failure = .authenticationFailed
                        return
                    }
                    do throws(CryptoError) {
                        try cipher.open(nonce: UnsafeRawBufferPointer(start: base, count: nonceSize), aad: aadBytes,
                                        ciphertext: UnsafeRawBufferPointer(start: base + nonceSize, count: length),
                                        tag: base + nonceSize + length, plaintext: target)
                    } catch {
                        failure = error
                    }
                }
            }
        }
        if let failure { throw failure }
        plaintext.removeLast()
        return plaintext
    }

    /// The nonce of `name` in the directory with `tweak`. Not a secret (it is stored in the name):
    /// derived into an ordinary array, with no secure allocation per name.
    func nonce(for name: [UInt8], tweak: [UInt8]) throws(CryptoError) -> [UInt8] {
        var nonce = [UInt8](repeating: 0, count: AESGCMKey.nonceSize)
        let info = [UInt8(truncatingIfNeeded: tweak.count)] + tweak + name
        var failure: CryptoError?
        nonceKey.withUnsafeBytes { key in
            nonce.withUnsafeMutableBytes { out in
                do throws(CryptoError) { try HKDF.derive(.sha256, key: key, salt: [], info: info, into: out) } catch { failure = error }
            }
        }
        if let failure { throw failure }
        return nonce
    }
}

/// A name as the backing directory holds it.
public enum StoredName: Equatable, Sendable {
    /// Not encrypted (no owner, an unmanaged owner, or a name too short to be one of ours).
    case plain([UInt8])
    /// Encrypted, short enough to be the entry's name.
    case short(String)
    /// Encrypted and too long: `name` is the entry's name, `full` the encrypted form kept beside it.
    case long(name: String, full: String)

    /// The bytes of the entry's name in the backing directory.
    public var entryName: [UInt8] {
        switch self {
        case .plain(let bytes): return bytes
        case .short(let name), .long(let name, _): return Array(name.utf8)
        }
    }
}

public enum NameCipher {
    /// Every encrypted name and target starts so; a plain name that does too cannot be stored
    /// (`isReserved`).
    public static let prefix = "~c3"
    /// The longest stored entry name: what every Linux file system allows.
    public static let maxStoredLength = 255
    /// Bytes of a directory's tweak.
    public static let tweakSize = 16
    static let nameData = Array("custody v3 name".utf8)
    static let targetData = Array("custody v3 symlink target".utf8)

    /// Encrypts `name` (1…255 bytes, no slash, no NUL, not `.` or `..`) for the directory whose
    /// tweak is `tweak`.
    public static func encrypt(_ name: [UInt8], tweak: [UInt8], key: NameKey) throws(FormatError) -> StoredName {
        try check(name)
        let sealed: [UInt8]
        do {
            let nonce = try key.nonce(for: name, tweak: tweak)
            sealed = try key.seal(name, nonce: nonce, aad: nameData + tweak)
        } catch {
            throw .crypto(error)
        }
        let full = prefix + key.tag + "." + Base64URL.encode(sealed)
        if full.utf8.count <= maxStoredLength { return .short(full) }
        return .long(name: prefix + key.tag + "-" + Base64URL.encode(full.utf8.withContiguousStorageIfAvailable { sha256(UnsafeRawBufferPointer($0)) } ?? Array(full.utf8).withUnsafeBytes { sha256($0) }), full: full)
    }

    /// The name `stored` stands for; `full` is the long form kept beside a `.long` entry. Throws
    /// `FormatError.corruptName` for a stored name that does not open with `key` in this directory
    /// (changed, moved from another directory, or another identity's).
    public static func decrypt(_ stored: String, full: String? = nil, tweak: [UInt8], key: NameKey) throws(FormatError) -> [UInt8] {
        try decrypt(stored, full: full, associatedData: associatedData(tweak: tweak), key: key)
    }

    /// What a name is bound to in the directory with `tweak` (for `decrypt` over a listing: once
    /// per directory rather than per name).
    public static func associatedData(tweak: [UInt8]) -> [UInt8] { nameData + tweak }

    public static func decrypt(_ stored: String, full: String? = nil, associatedData: [UInt8], key: NameKey) throws(FormatError) -> [UInt8] {
        guard let kind = self.kind(of: stored), kind.tag == key.tag else { throw .corruptName("not a name of this key") }
        var body = kind.body
        if kind.separator == "-" {
            guard let full, let longKind = self.kind(of: full), longKind.separator == ".", longKind.tag == key.tag,
                  Base64URL.encode(full.utf8.withContiguousStorageIfAvailable { sha256(UnsafeRawBufferPointer($0)) } ?? Array(full.utf8).withUnsafeBytes { sha256($0) }) == kind.body else {
                throw .corruptName("the long form does not match the name")
            }
            body = longKind.body
        } else if kind.separator != "." {
            throw .corruptName("not a name")
        }
        guard let sealed = Base64URL.decode(body) else { throw .corruptName("not base64url") }
        let name: [UInt8]
        do { name = try key.open(sealed, aad: associatedData) } catch { throw .corruptName("authentication failed") }
        try check(name)
        return name
    }

    /// Seals a symlink's target (1…4095 bytes).
    public static func sealTarget(_ target: [UInt8], key: NameKey) throws(FormatError) -> String {
        guard !target.isEmpty, target.count < 4096, !target.contains(0) else { throw .corruptName("a symlink target of \(target.count) bytes") }
        do {
            let sealed = try key.seal(target, nonce: try Random.bytes(AESGCMKey.nonceSize), aad: targetData)
            return prefix + key.tag + ":" + Base64URL.encode(sealed)
        } catch {
            throw .crypto(error)
        }
    }

    public static func openTarget(_ stored: String, key: NameKey) throws(FormatError) -> [UInt8] {
        guard let kind = self.kind(of: stored), kind.separator == ":", kind.tag == key.tag, let sealed = Base64URL.decode(kind.body) else {
            throw .corruptName("not a symlink target of this key")
        }
        do { return try key.open(sealed, aad: targetData) } catch { throw .corruptName("authentication failed") }
    }

    /// Whether a stored name is the short form of a long one (its full form is kept beside it).
    public static func isLong(_ stored: String) -> Bool { kind(of: stored)?.separator == "-" }

    /// The key tag of a stored name or target, nil for a plain one.
    public static func keyTag(of stored: String) -> String? { kind(of: stored)?.tag }

    /// Whether a plain name would read as an encrypted one (the mount refuses to create it).
    public static func isReserved(_ name: [UInt8]) -> Bool { name.starts(with: Array(prefix.utf8)) }

    static func kind(of stored: String) -> (tag: String, separator: Character, body: Substring)? {
        // On the UTF-8 bytes: a listing asks this of every name.
        let bytes = stored.utf8
        guard bytes.count > prefix.utf8.count + 7, bytes.starts(with: prefix.utf8) else { return nil }
        let tagStart = bytes.index(bytes.startIndex, offsetBy: prefix.utf8.count)
        let separatorAt = bytes.index(tagStart, offsetBy: 6)
        guard bytes[tagStart..<separatorAt].allSatisfy({ Base64URL.value(of: $0) != nil }) else { return nil }
        let separator = bytes[separatorAt]
        guard separator == UInt8(ascii: ":") || separator == UInt8(ascii: ".") || separator == UInt8(ascii: "-") else { return nil }
        let bodyStart = bytes.index(after: separatorAt)
        return (String(Substring(bytes[tagStart..<separatorAt])), Character(Unicode.Scalar(separator)), Substring(bytes[bodyStart...]))
    }

    static func check(_ name: [UInt8]) throws(FormatError) {
        guard !name.isEmpty, name.count <= 255, !name.contains(0), !name.contains(UInt8(ascii: "/")), name != [0x2e], name != [0x2e, 0x2e] else {
            throw .corruptName("not a file name (\(name.count) bytes)")
        }
    }
}

/// base64url without padding (RFC 4648, section 5): names may not hold a slash.
enum Base64URL {
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    /// Each byte's digit value, 0xFF for a byte that is not a digit.
    static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (value, digit) in alphabet.enumerated() { table[Int(digit)] = UInt8(value) }
        return table
    }()

    static func value(of byte: UInt8) -> UInt8? {
        let value = values[Int(byte)]
        return value == 0xFF ? nil : value
    }

    static func encode(_ bytes: [UInt8]) -> String {
        var output: [UInt8] = []
        output.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            for shift in [18, 12, 6, 0] { output.append(alphabet[Int(value >> UInt32(shift) & 63)]) }
            index += 3
        }
        let left = bytes.count - index
        if left > 0 {
            var value = UInt32(bytes[index]) << 16
            if left == 2 { value |= UInt32(bytes[index + 1]) << 8 }
            for shift in [18, 12, 6].prefix(left + 1) { output.append(alphabet[Int(value >> UInt32(shift) & 63)]) }
        }
        return String(decoding: output, as: UTF8.self)
    }

    static func decode<S: StringProtocol>(_ text: S) -> [UInt8]? {
        // Every listed name passes here: one pass over the bytes, one allocation.
        var output: [UInt8] = []
        output.reserveCapacity(text.utf8.count * 3 / 4)
        var group: UInt32 = 0, digits = 0
        for byte in text.utf8 {
            let value = values[Int(byte)]
            guard value != 0xFF else { return nil }
            group = group << 6 | UInt32(value)
            digits += 1
            if digits == 4 {
                output.append(UInt8(group >> 16 & 255))
                output.append(UInt8(group >> 8 & 255))
                output.append(UInt8(group & 255))
                group = 0
                digits = 0
            }
        }
        switch digits {
        case 0: break
        case 2:
            // Bits past the last byte must be zero: one spelling per value.
            guard group & 0xF == 0 else { return nil }
            output.append(UInt8(group >> 4 & 255))
        case 3:
            guard group & 0x3 == 0 else { return nil }
            output.append(UInt8(group >> 10 & 255))
            output.append(UInt8(group >> 2 & 255))
        default:
            return nil
        }
        return output
    }
}
