import CustodyCrypto
import CustodySystem

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
    /// Derives each name's nonce: HKDF keyed once, one HMAC per name.
    private let nonces: HKDF.SHA256Expander
    /// What every full form of a name under this key starts with: `~c3` ‖ tag ‖ `.`.
    private let formHead: [UInt8]

    /// The name key of an identity, from its key `secret` (32 bytes or more).
    public init(deriving secret: SecretBytes) throws(CryptoError) {
        cipher = try AESGCMKey(HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 cipher".utf8), count: 32))
        let nonceKey = try HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 nonce".utf8), count: 32)
        nonces = try HKDF.SHA256Expander(key: nonceKey, salt: [])
        let tagBytes = try HKDF.derive(key: secret, salt: Array("custody names".utf8), info: Array("v3 tag".utf8), count: 6)
        tag = String(Base64URL.encode(tagBytes.withUnsafeBytes { Array($0) }).prefix(6))
        formHead = Array((NameCipher.prefix + tag + ".").utf8)
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

    /// Whether `tag`, the six tag characters of a stored name, are this key's (compared as bytes:
    /// every name a listing or a removal meets is matched so).
    public func hasTag(_ tag: UnsafeRawBufferPointer) -> Bool {
        tag.count == 6 && tag.elementsEqual(formHead[NameCipher.prefixLength..<(NameCipher.prefixLength + 6)])
    }

    /// Opens `sealed` (nonce ‖ ciphertext ‖ tag) into `plaintext` (room for its length less 28
    /// bytes); returns how many bytes it wrote.
    func open(sealed: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, into plaintext: UnsafeMutableRawPointer) throws(CryptoError) -> Int {
        let nonceSize = AESGCMKey.nonceSize, tagSize = AESGCMKey.tagSize
        guard sealed.count >= nonceSize + tagSize, let base = sealed.baseAddress else { throw .authenticationFailed }
        let length = sealed.count - nonceSize - tagSize
        try cipher.open(nonce: UnsafeRawBufferPointer(start: base, count: nonceSize), aad: aad,
                        ciphertext: UnsafeRawBufferPointer(start: base + nonceSize, count: length),
                        tag: base + nonceSize + length, plaintext: plaintext)
        return length
    }

    /// Opens `sealed` (nonce ‖ ciphertext ‖ tag) in a caller's buffer.
    func open(sealed: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer) throws(CryptoError) -> [UInt8] {
        guard sealed.count >= AESGCMKey.nonceSize + AESGCMKey.tagSize else { throw .authenticationFailed }
        var failure: CryptoError?
        // One spare byte, so that an empty name still has an address to decrypt into.
        let plaintext = [UInt8](unsafeUninitializedCapacity: sealed.count - AESGCMKey.nonceSize - AESGCMKey.tagSize + 1) { out, initialized in
            guard let target = out.baseAddress else { failure = .authenticationFailed; return }
            do throws(CryptoError) {
                initialized = try open(sealed: sealed, aad: aad, into: target)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
        return plaintext
    }

    func open(_ sealed: [UInt8], aad: [UInt8]) throws(CryptoError) -> [UInt8] {
        try sealed.withBytes { (sealedBytes) throws(CryptoError) in
            try aad.withBytes { (aadBytes) throws(CryptoError) in try open(sealed: sealedBytes, aad: aadBytes) }
        }
    }

    /// The nonce of `name` in the directory with `tweak`: `HKDF(nonceKey, len(tweak) ‖ tweak ‖ name)`.
    /// Not a secret (it is stored in the name): derived into an ordinary array.
    func nonce(for name: [UInt8], tweak: [UInt8]) throws(CryptoError) -> [UInt8] {
        var nonce = [UInt8](repeating: 0, count: AESGCMKey.nonceSize)
        try name.withBytes { (nameBytes) throws(CryptoError) in
            try tweak.withBytes { (tweakBytes) throws(CryptoError) in
                try nonce.withMutableBytes { (out) throws(CryptoError) in try deriveNonce(name: nameBytes, tweak: tweakBytes, into: out) }
            }
        }
        return nonce
    }

    func deriveNonce(name: UnsafeRawBufferPointer, tweak: UnsafeRawBufferPointer, into nonce: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        var length = UInt8(truncatingIfNeeded: tweak.count)
        try withUnsafeMutableBytes(of: &length) { (lengthByte) throws(CryptoError) in
            try nonces.derive(info: [UnsafeRawBufferPointer(lengthByte), tweak, name], into: nonce)
        }
    }

    /// The full encrypted form of `name` (checked) in the directory with `tweak`, as a C string:
    /// `~c3` ‖ tag ‖ `.` ‖ base64url(nonce ‖ ciphertext ‖ GCM tag) ‖ NUL. Every lookup of a name the
    /// mount does not know and every creation makes one: sealed in one buffer on the stack and
    /// encoded straight into the name's own storage.
    func fullForm(of name: UnsafeRawBufferPointer, tweak: UnsafeRawBufferPointer) throws(CryptoError) -> [CChar] {
        let nonceSize = AESGCMKey.nonceSize, sealedCount = nonceSize + name.count + AESGCMKey.tagSize
        let aadCount = NameCipher.nameData.count + tweak.count
        return try withUnsafeTemporaryAllocation(byteCount: sealedCount + aadCount, alignment: 16) { (scratch) throws(CryptoError) -> [CChar] in
            guard let base = scratch.baseAddress else { throw .invalidLength(what: "name buffer", expected: sealedCount, actual: 0) }
            let aad = UnsafeMutableRawBufferPointer(start: base + sealedCount, count: aadCount)
            NameCipher.nameData.withUnsafeBytes { aad.copyMemory(from: $0) }
            if let tweakBase = tweak.baseAddress, tweak.count > 0 {
                (base + sealedCount + NameCipher.nameData.count).copyMemory(from: tweakBase, byteCount: tweak.count)
            }
            try deriveNonce(name: name, tweak: tweak, into: UnsafeMutableRawBufferPointer(start: base, count: nonceSize))
            try cipher.seal(nonce: UnsafeRawBufferPointer(start: base, count: nonceSize), aad: UnsafeRawBufferPointer(aad), plaintext: name,
                            ciphertext: base + nonceSize, tag: base + nonceSize + name.count)
            let sealed = UnsafeRawBufferPointer(start: base, count: sealedCount)
            let head = formHead
            let length = head.count + Base64URL.encodedCount(sealedCount)
            return [CChar](unsafeUninitializedCapacity: length + 1) { out, initialized in
                guard let start = out.baseAddress else { return }
                let written = start.withMemoryRebound(to: UInt8.self, capacity: length + 1) { target -> Int in
                    head.withUnsafeBufferPointer { if let from = $0.baseAddress { target.update(from: from, count: head.count) } }
                    return head.count + Base64URL.encode(sealed, into: target + head.count)
                }
                start[written] = 0
                initialized = written + 1
            }
        }
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
    static let prefixLength = 3
    /// The longest stored entry name: what every Linux file system allows.
    public static let maxStoredLength = 255
    /// Bytes of a directory's tweak.
    public static let tweakSize = 16
    static let nameData = Array("custody v3 name".utf8)
    static let targetData = Array("custody v3 symlink target".utf8)

    /// Encrypts `name` (1…255 bytes, no slash, no NUL, not `.` or `..`) for the directory whose
    /// tweak is `tweak`.
    public static func encrypt(_ name: [UInt8], tweak: [UInt8], key: NameKey) throws(FormatError) -> StoredName {
        try name.withBytes { (bytes) throws(FormatError) in try encrypt(bytes, tweak: tweak, key: key) }
    }

    /// The same, for a name in a caller's buffer.
    public static func encrypt(_ name: UnsafeRawBufferPointer, tweak: [UInt8], key: NameKey) throws(FormatError) -> StoredName {
        let (entry, full) = try tweak.withBytes { (tweakBytes) throws(FormatError) in try entryName(of: name, tweak: tweakBytes, key: key) }
        let text = String(decoding: entry.bytes, as: UTF8.self)
        if let full { return .long(name: text, full: full) }
        return .short(text)
    }

    /// `name` (checked as `encrypt` does) encrypted for the directory with `tweak`: the entry's
    /// name in the backing directory, and the full form kept beside it when that is too long to
    /// be the name (`StoredName.long`). What the mount names entries with: no string is made of
    /// a short form.
    public static func entryName(of name: UnsafeRawBufferPointer, tweak: UnsafeRawBufferPointer, key: NameKey) throws(FormatError) -> (entry: FileName, full: String?) {
        try check(name)
        let full: [CChar]
        do throws(CryptoError) { full = try key.fullForm(of: name, tweak: tweak) } catch { throw .crypto(error) }
        if full.count - 1 <= maxStoredLength { return (FileName(terminated: full), nil) }
        let text = full.withUnsafeBytes { String(decoding: UnsafeRawBufferPointer(rebasing: $0.dropLast()), as: UTF8.self) }
        return (FileName(longName(of: text, tag: key.tag)), text)
    }

    /// The entry name of the long form `full`: `~c3` ‖ tag ‖ `-` ‖ base64url(SHA-256 of `full`).
    static func longName(of full: String, tag: String) -> String {
        prefix + tag + "-" + Base64URL.encode(digest(of: full))
    }

    static func digest(of full: String) -> [UInt8] {
        var full = full
        return full.withUTF8 { sha256(UnsafeRawBufferPointer($0)) }
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
                  Base64URL.encode(digest(of: full)) == kind.body else {
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

    /// A stored name as bytes (a listing's), split: its key tag, separator and body; nil for a
    /// plain name.
    public static func parts(of stored: UnsafeRawBufferPointer) -> (tag: UnsafeRawBufferPointer, separator: UInt8, body: UnsafeRawBufferPointer)? {
        let head = prefixLength
        guard stored.count > head + 7, stored[0] == 0x7E, stored[1] == 0x63, stored[2] == 0x33 else { return nil }
        let tagBytes = UnsafeRawBufferPointer(rebasing: stored[head..<(head + 6)])
        guard tagBytes.allSatisfy({ Base64URL.value(of: $0) != nil }) else { return nil }
        let separator = stored[head + 6]
        guard separator == UInt8(ascii: ":") || separator == UInt8(ascii: ".") || separator == UInt8(ascii: "-") else { return nil }
        return (tagBytes, separator, UnsafeRawBufferPointer(rebasing: stored[(head + 7)...]))
    }

    /// The name the body of a short stored name (`parts(of:)`, separator `.`) stands for, for a
    /// listing: decoded on the stack, one array made.
    public static func decryptShort(body: UnsafeRawBufferPointer, associatedData: [UInt8], key: NameKey) throws(FormatError) -> [UInt8] {
        try decryptShortName(body: body, associatedData: associatedData, key: key).bytes
    }

    /// The same, as a name: decoded on the stack and opened straight into the name's storage.
    public static func decryptShortName(body: UnsafeRawBufferPointer, associatedData: [UInt8], key: NameKey) throws(FormatError) -> FileName {
        let capacity = body.count * 3 / 4 + 3
        return try withUnsafeTemporaryAllocation(byteCount: capacity, alignment: 16) { (scratch) throws(FormatError) -> FileName in
            let overhead = AESGCMKey.nonceSize + AESGCMKey.tagSize
            guard let base = scratch.baseAddress?.assumingMemoryBound(to: UInt8.self),
                  let count = Base64URL.decode(body, into: base, capacity: capacity) else { throw .corruptName("not base64url") }
            guard count > overhead else { throw .corruptName("not a file name (\(max(0, count - overhead)) bytes)") }
            var failed = false
            let cString = [CChar](unsafeUninitializedCapacity: count - overhead + 1) { out, initialized in
                guard let target = out.baseAddress else { failed = true; return }
                do throws(CryptoError) {
                    let length = try associatedData.withBytes { (aad) throws(CryptoError) in
                        try key.open(sealed: UnsafeRawBufferPointer(start: base, count: count), aad: aad, into: target)
                    }
                    target[length] = 0
                    initialized = length + 1
                } catch {
                    failed = true
                }
            }
            guard !failed else { throw .corruptName("authentication failed") }
            try cString.withBytes { (all) throws(FormatError) in try check(UnsafeRawBufferPointer(rebasing: all.dropLast())) }
            return FileName(terminated: cString)
        }
    }

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
        try name.withBytes { (bytes) throws(FormatError) in try check(bytes) }
    }

    static func check(_ name: UnsafeRawBufferPointer) throws(FormatError) {
        let isDots = (name.count == 1 || name.count == 2) && name.allSatisfy { $0 == 0x2e }
        guard !name.isEmpty, name.count <= 255, !isDots, !name.contains(where: { $0 == 0 || $0 == UInt8(ascii: "/") }) else {
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

    /// Digits that encode `count` bytes.
    static func encodedCount(_ count: Int) -> Int { (count * 4 + 2) / 3 }

    /// Writes the digits of `bytes` at `target` (room for `encodedCount(bytes.count)`); returns
    /// how many.
    static func encode(_ bytes: UnsafeRawBufferPointer, into target: UnsafeMutablePointer<UInt8>) -> Int {
        var written = 0, index = 0
        alphabet.withUnsafeBufferPointer { digits in
            func put(_ value: UInt32) {
                target[written] = digits[Int(value & 63)]
                written += 1
            }
            while index + 3 <= bytes.count {
                let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
                put(value >> 18); put(value >> 12); put(value >> 6); put(value)
                index += 3
            }
            let left = bytes.count - index
            if left > 0 {
                var value = UInt32(bytes[index]) << 16
                if left == 2 { value |= UInt32(bytes[index + 1]) << 8 }
                put(value >> 18); put(value >> 12)
                if left == 2 { put(value >> 6) }
            }
        }
        return written
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

    /// Decodes `digits` into `target` (room for `capacity` bytes); the count, or nil when they
    /// are not base64url (or do not fit).
    static func decode(_ digits: UnsafeRawBufferPointer, into target: UnsafeMutablePointer<UInt8>, capacity: Int) -> Int? {
        guard digits.count % 4 != 1, digits.count / 4 * 3 + 2 <= capacity else { return nil }
        var written = 0, group: UInt32 = 0, count = 0
        for byte in digits {
            let value = values[Int(byte)]
            guard value != 0xFF else { return nil }
            group = group << 6 | UInt32(value)
            count += 1
            if count == 4 {
                target[written] = UInt8(group >> 16 & 255)
                target[written + 1] = UInt8(group >> 8 & 255)
                target[written + 2] = UInt8(group & 255)
                written += 3
                group = 0
                count = 0
            }
        }
        switch count {
        case 0: break
        case 2:
            // Bits past the last byte must be zero: one spelling per value.
            guard group & 0xF == 0 else { return nil }
            target[written] = UInt8(group >> 4 & 255)
            written += 1
        case 3:
            guard group & 0x3 == 0 else { return nil }
            target[written] = UInt8(group >> 10 & 255)
            target[written + 1] = UInt8(group >> 2 & 255)
            written += 2
        default:
            return nil
        }
        return written
    }

    static func decode<S: StringProtocol>(_ text: S) -> [UInt8]? {
        let digits = Array(text.utf8), capacity = digits.count / 4 * 3 + 2
        var output = [UInt8](repeating: 0, count: capacity)
        let count = digits.withUnsafeBytes { source in
            output.withUnsafeMutableBufferPointer { target in target.baseAddress.flatMap { decode(source, into: $0, capacity: capacity) } }
        }
        guard let count else { return nil }
        output.removeLast(capacity - count)
        return output
    }
}
