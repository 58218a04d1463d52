import CustodyCrypto
import CustodySystem

/// What a header's body holds.
public enum ContentKind: UInt8, Sendable {
    /// Blocks encrypted with the file key (a managed owner).
    case encrypted = 1
    /// Plain bytes after the header: the owner is recorded, the data is not encrypted
    /// (an unmanaged owner's protected buffer).
    case plain = 2
}

/// How the file key is wrapped.
public enum WrapMethod: UInt8, Sendable {
    /// No file key (plain kind).
    case none = 0
    /// AES-256-GCM with the class key (classes A, C, D).
    case classKey = 1
    /// AES-256-GCM with a key from an X25519 agreement between an ephemeral key and the class
    /// public key (class B: files can be created while the class private key is locked away).
    case classAgreement = 2
}

/// A class key as the format needs it, provided by the engine.
public enum ClassKey: Sendable {
    /// Classes A, C and D: a 32-byte symmetric key with its 8-byte ID.
    case symmetric(id: [UInt8], key: AESGCMKey)
    /// Class B: the public key always; the private key only while unlocked (nil otherwise).
    case agreement(id: [UInt8], publicKey: [UInt8], privateKey: SecretBytes?)

    public var id: [UInt8] {
        switch self {
        case .symmetric(let id, _), .agreement(let id, _, _): return id
        }
    }
}

/// The fixed 512-byte header at the start of every protected file or buffer (see docs/format.md).
public struct FileHeader: Equatable, Sendable {
    public static let length = 512
    public static let magic: [UInt8] = [0x89, 0x43, 0x55, 0x53, 0x54, 0x44, 0x59, 0x0A]  // "\x89CUSTDY\n"
    /// Version 3 (what is written for encrypted content): as version 2, and the owner is not
    /// written: the class key ID says whose it is, to whoever holds that identity's keybag.
    /// Version 2 (still read and written as such): zero blocks are holes only where the file's
    /// hole record lists them. Version 1 (likewise): every zero block is a hole.
    public static let currentVersion: UInt16 = 3
    public static let supportedVersions: ClosedRange<UInt16> = 1...3
    /// The first version that does not write the owner.
    public static let hiddenOwnerVersion: UInt16 = 3
    public static let defaultBlockSize: UInt32 = 4096
    public static let fileIDSize = 16
    public static let classKeyIDSize = 8
    /// Bytes [0, 440) are the associated data of the file-key wrap (or the input of the plain kind's check).
    static let authenticatedLength = 440

    enum Offset {
        static let version = 8, kind = 10, protectionClass = 11, headerLength = 12, fileID = 16
        static let blockSize = 32, wrapMethod = 36, canonicalLength = 37, displayLength = 38, reserved = 39
        static let classKeyID = 40, ephemeralPublicKey = 48, canonical = 80, display = 260
        static let wrappedKey = 440, check = 440, tail = 500
    }

    public var version: UInt16 = FileHeader.currentVersion
    public var kind: ContentKind
    public var protectionClass: ProtectionClass
    public var fileID: [UInt8]
    public var blockSize: UInt32
    public var wrapMethod: WrapMethod
    /// The owner as written (versions 1 and 2, and every plain-kind header); nil from version 3,
    /// where the class key ID identifies the owner.
    public var owner: Owner?
    public var classKeyID: [UInt8]
    public var ephemeralPublicKey: [UInt8]
    /// nonce ‖ wrapped key ‖ tag (60 bytes), or empty for the plain kind.
    public var wrappedFileKey: [UInt8]

    /// True when `prefix` starts with the Custody magic.
    public static func hasMagic(_ prefix: UnsafeRawBufferPointer) -> Bool {
        prefix.count >= magic.count && zip(prefix.prefix(magic.count), magic).allSatisfy { $0 == $1 }
    }

    // MARK: Creating

    /// A header for a plain-kind buffer or file (unmanaged owner).
    public static func plain(owner: Owner, fileID: [UInt8]? = nil) throws(FormatError) -> FileHeader {
        let fileID = try fileIDOrNew(fileID)
        var header = FileHeader(kind: .plain, protectionClass: .none, fileID: fileID, blockSize: 0,
                                wrapMethod: .none, owner: owner, classKeyID: [UInt8](repeating: 0, count: classKeyIDSize),
                                ephemeralPublicKey: [UInt8](repeating: 0, count: X25519.keySize), wrappedFileKey: [])
        // Version 2 changes only what encrypted content means: plain headers stay version 1.
        header.version = 1
        return header
    }

    /// A header for encrypted content, with `fileKey` wrapped by `classKey`. `owner` nil (what the
    /// daemon writes) makes a version 3 header, which names no owner; an owner given makes a
    /// version 2 one (or `version`, 1 or 2), which names it.
    /// `wrapNonce` and `ephemeralPrivateKey` are for reproducible test vectors only.
    public static func encrypted(owner: Owner?, protectionClass: ProtectionClass, classKey: ClassKey, fileKey: SecretBytes,
                                 fileID: [UInt8]? = nil, blockSize: UInt32 = defaultBlockSize,
                                 wrapNonce: [UInt8]? = nil, ephemeralPrivateKey: SecretBytes? = nil,
                                 version: UInt16? = nil) throws(FormatError) -> FileHeader {
        let version = version ?? (owner == nil ? currentVersion : hiddenOwnerVersion - 1)
        guard supportedVersions.contains(version) else { throw .unsupportedVersion(version) }
        guard (version >= hiddenOwnerVersion) == (owner == nil) else {
            throw .invalidOwner(owner == nil ? "a version \(version) header names its owner" : "a version \(version) header does not name its owner")
        }
        guard blockSize >= 16, blockSize <= 1 << 20, blockSize % 16 == 0 else {
            throw .unsupported("block size \(blockSize) (16 … 1 MiB, a multiple of 16)")
        }
        guard classKey.id.count == classKeyIDSize else { throw .corruptHeader("class key ID must be \(classKeyIDSize) bytes") }
        let fileID = try fileIDOrNew(fileID)
        var header = FileHeader(kind: .encrypted, protectionClass: protectionClass, fileID: fileID,
                                blockSize: blockSize, wrapMethod: .classKey, owner: owner, classKeyID: classKey.id,
                                ephemeralPublicKey: [UInt8](repeating: 0, count: X25519.keySize), wrappedFileKey: [])
        header.version = version
        guard header.fileID.count == fileIDSize else { throw .corruptHeader("file ID must be \(fileIDSize) bytes") }
        do throws(CryptoError) {
            let wrappingKey: AESGCMKey
            switch classKey {
            case .symmetric(_, let key):
                wrappingKey = key
            case .agreement(_, let classPublicKey, _):
                header.wrapMethod = .classAgreement
                let ephemeral: SecretBytes
                if let ephemeralPrivateKey { ephemeral = ephemeralPrivateKey } else { ephemeral = try X25519.generatePrivateKey() }
                header.ephemeralPublicKey = try X25519.publicKey(for: ephemeral)
                let shared = try X25519.sharedSecret(privateKey: ephemeral, publicKey: classPublicKey)
                wrappingKey = try agreementWrappingKey(shared: shared, ephemeralPublicKey: header.ephemeralPublicKey, classPublicKey: classPublicKey)
            }
            let context = header.authenticatedBytes()
            header.wrappedFileKey = try context.withBytes { (aad) throws(CryptoError) in
                try KeyWrap.wrap(fileKey, with: wrappingKey, context: aad, nonce: wrapNonce)
            }
        } catch {
            throw .crypto(error)
        }
        return header
    }

    /// The file key, if `classKey` is the one that wrapped it and the header is intact.
    public func unwrapFileKey(with classKey: ClassKey) throws(FormatError) -> SecretBytes {
        guard kind == .encrypted else { throw .unsupported("a plain-kind header has no file key") }
        guard constantTimeEquals(classKey.id, classKeyID) else { throw .wrongKey(keyID: classKeyID) }
        let wrappingKey: AESGCMKey
        do {
            switch (wrapMethod, classKey) {
            case (.classKey, .symmetric(_, let key)):
                wrappingKey = key
            case (.classAgreement, .agreement(_, let publicKey, let privateKey)):
                guard let privateKey else { throw FormatError.unsupported("class B files cannot be opened while the class private key is locked") }
                let shared = try X25519.sharedSecret(privateKey: privateKey, publicKey: ephemeralPublicKey)
                wrappingKey = try Self.agreementWrappingKey(shared: shared, ephemeralPublicKey: ephemeralPublicKey, classPublicKey: publicKey)
            default:
                throw FormatError.wrongKey(keyID: classKeyID)
            }
        } catch let error as FormatError {
            throw error
        } catch let error as CryptoError {
            throw error == .invalidPublicKey ? .headerAuthenticationFailed : .crypto(error)
        } catch {
            throw .headerAuthenticationFailed
        }
        let context = authenticatedBytes()
        do throws(CryptoError) {
            return try wrappedFileKey.withBytes { (wrapped) throws(CryptoError) in
                try context.withBytes { (aad) throws(CryptoError) in
                    try KeyWrap.unwrap(wrapped, with: wrappingKey, context: aad)
                }
            }
        } catch {
            throw error == .authenticationFailed ? .headerAuthenticationFailed : .crypto(error)
        }
    }

    /// The same file key wrapped for another class (and class key): what a protection-level change
    /// writes over the old header. The file ID and content are unchanged. `hidingOwner`: the
    /// header of the current version, which names no owner (a version 2 header's upgrade).
    public func rewrapped(fileKey: SecretBytes, to protectionClass: ProtectionClass, classKey: ClassKey,
                          hidingOwner: Bool = false) throws(FormatError) -> FileHeader {
        try FileHeader.encrypted(owner: hidingOwner ? nil : owner, protectionClass: protectionClass, classKey: classKey, fileKey: fileKey,
                                 fileID: fileID, blockSize: blockSize, version: hidingOwner ? nil : version)
    }

    static func agreementWrappingKey(shared: SecretBytes, ephemeralPublicKey: [UInt8], classPublicKey: [UInt8]) throws(CryptoError) -> AESGCMKey {
        let key = try HKDF.derive(.sha256, key: shared, salt: ephemeralPublicKey + classPublicKey,
                                  info: Array("custody/v1/class-b-wrap".utf8), count: 32)
        return try AESGCMKey(key)
    }

    static func fileIDOrNew(_ fileID: [UInt8]?) throws(FormatError) -> [UInt8] {
        if let fileID { return fileID }
        do { return try Random.bytes(fileIDSize) } catch { throw .crypto(error) }
    }

    // MARK: Encoding

    /// The 512 header bytes.
    public func encoded() -> [UInt8] {
        var bytes = authenticatedBytes()
        bytes.reserveCapacity(Self.length)
        switch kind {
        case .encrypted:
            bytes += wrappedFileKey
        case .plain:
            bytes += bytes.withUnsafeBytes { sha256($0) }.prefix(16)
        }
        bytes += [UInt8](repeating: 0, count: Self.length - bytes.count)
        return bytes
    }

    /// Bytes [0, 440): everything the wrap authenticates.
    func authenticatedBytes() -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: Self.authenticatedLength)
        bytes.replaceSubrange(0..<8, with: Self.magic)
        bytes.storeLE(version, at: Offset.version)
        bytes[Offset.kind] = kind.rawValue
        bytes[Offset.protectionClass] = protectionClass.rawValue
        bytes.storeLE(UInt32(Self.length), at: Offset.headerLength)
        bytes.replaceSubrange(Offset.fileID..<Offset.fileID + Self.fileIDSize, with: fileID)
        bytes.storeLE(blockSize, at: Offset.blockSize)
        bytes[Offset.wrapMethod] = wrapMethod.rawValue
        let canonical = Array((owner?.canonical ?? "").utf8), display = Array((owner?.display ?? "").utf8)
        bytes[Offset.canonicalLength] = UInt8(canonical.count)
        bytes[Offset.displayLength] = UInt8(display.count)
        bytes.replaceSubrange(Offset.classKeyID..<Offset.classKeyID + Self.classKeyIDSize, with: classKeyID)
        bytes.replaceSubrange(Offset.ephemeralPublicKey..<Offset.ephemeralPublicKey + 32, with: ephemeralPublicKey)
        bytes.replaceSubrange(Offset.canonical..<Offset.canonical + canonical.count, with: canonical)
        bytes.replaceSubrange(Offset.display..<Offset.display + display.count, with: display)
        return bytes
    }

    // MARK: Decoding

    /// Parses and checks a header. Every byte is accounted for: unknown values, lengths out of
    /// range, non-zero padding or a failed plain-kind check are errors. (The wrap itself is
    /// verified by `unwrapFileKey`.)
    public static func decode(_ bytes: UnsafeRawBufferPointer) throws(FormatError) -> FileHeader {
        guard hasMagic(bytes) else { throw .notProtected }
        guard bytes.count >= 12 else { throw .corruptHeader("shorter than the fixed fields") }
        let version = bytes.loadLE(UInt16.self, at: Offset.version)
        guard supportedVersions.contains(version) else { throw .unsupportedVersion(version) }
        guard bytes.count >= length else { throw .corruptHeader("\(bytes.count) bytes, a header has \(length)") }
        guard let kind = ContentKind(rawValue: bytes[Offset.kind]) else { throw .corruptHeader("unknown content kind \(bytes[Offset.kind])") }
        guard let protectionClass = ProtectionClass(rawValue: bytes[Offset.protectionClass]) else {
            throw .corruptHeader("unknown protection class \(bytes[Offset.protectionClass])")
        }
        let headerLength = bytes.loadLE(UInt32.self, at: Offset.headerLength)
        guard headerLength == UInt32(length) else { throw .corruptHeader("header length \(headerLength), headers have \(length)") }
        let blockSize = bytes.loadLE(UInt32.self, at: Offset.blockSize)
        guard let wrapMethod = WrapMethod(rawValue: bytes[Offset.wrapMethod]) else {
            throw .corruptHeader("unknown wrap method \(bytes[Offset.wrapMethod])")
        }
        guard bytes[Offset.reserved] == 0 else { throw .corruptHeader("reserved byte is not zero") }
        let canonicalLength = Int(bytes[Offset.canonicalLength]), displayLength = Int(bytes[Offset.displayLength])
        // From version 3 an encrypted file does not name its owner; a plain-kind header always does.
        let hidesOwner = version >= hiddenOwnerVersion && kind == .encrypted
        let lengths: ClosedRange<Int> = hidesOwner ? 0...0 : 1...Owner.maxLength
        guard lengths.contains(canonicalLength), lengths.contains(displayLength) else {
            throw .corruptHeader("owner lengths \(canonicalLength)/\(displayLength) out of range")
        }
        func allZero(_ range: Range<Int>) -> Bool { bytes[range].allSatisfy { $0 == 0 } }
        guard allZero(Offset.canonical + canonicalLength..<Offset.display), allZero(Offset.display + displayLength..<authenticatedLength) else {
            throw .corruptHeader("owner padding is not zero")
        }
        var owner: Owner?
        if !hidesOwner {
            guard let canonical = String(validating: bytes[Offset.canonical..<Offset.canonical + canonicalLength], as: UTF8.self),
                  let display = String(validating: bytes[Offset.display..<Offset.display + displayLength], as: UTF8.self) else {
                throw .corruptHeader("owner is not valid UTF-8")
            }
            do { owner = try Owner(canonical: canonical, display: display) } catch { throw .corruptHeader("\(error)") }
        }

        let header = FileHeader(
            version: version, kind: kind, protectionClass: protectionClass,
            fileID: Array(bytes[Offset.fileID..<Offset.fileID + fileIDSize]), blockSize: blockSize, wrapMethod: wrapMethod,
            owner: owner, classKeyID: Array(bytes[Offset.classKeyID..<Offset.classKeyID + classKeyIDSize]),
            ephemeralPublicKey: Array(bytes[Offset.ephemeralPublicKey..<Offset.ephemeralPublicKey + 32]),
            wrappedFileKey: kind == .encrypted ? Array(bytes[Offset.wrappedKey..<Offset.wrappedKey + KeyWrap.wrappedSize]) : [])

        switch kind {
        case .encrypted:
            guard wrapMethod != .none else { throw .corruptHeader("encrypted content without a wrapped key") }
            guard blockSize >= 16, blockSize <= 1 << 20, blockSize % 16 == 0 else { throw .corruptHeader("block size \(blockSize)") }
            if wrapMethod == .classKey, !allZero(Offset.ephemeralPublicKey..<Offset.canonical) {
                throw .corruptHeader("ephemeral key set for a class-key wrap")
            }
            guard allZero(Offset.tail..<length) else { throw .corruptHeader("trailing bytes are not zero") }
        case .plain:
            guard wrapMethod == .none, blockSize == 0, protectionClass == .none,
                  allZero(Offset.classKeyID..<Offset.canonical) else {
                throw .corruptHeader("key fields set in a plain-kind header")
            }
            let expected = sha256(UnsafeRawBufferPointer(rebasing: bytes[0..<authenticatedLength])).prefix(16)
            guard constantTimeEquals(Array(bytes[Offset.check..<Offset.check + 16]), Array(expected)),
                  allZero(Offset.check + 16..<length) else {
                throw .corruptHeader("check value does not match")
            }
        }
        return header
    }
}

// MARK: Little-endian helpers

extension Array where Element == UInt8 {
    mutating func storeLE<T: FixedWidthInteger>(_ value: T, at offset: Int) {
        for index in 0..<MemoryLayout<T>.size {
            self[offset + index] = UInt8(truncatingIfNeeded: value >> (8 * index))
        }
    }
}

extension UnsafeRawBufferPointer {
    func loadLE<T: FixedWidthInteger>(_ type: T.Type, at offset: Int) -> T {
        var value: T = 0
        for index in 0..<MemoryLayout<T>.size {
            value |= T(self[offset + index]) << (8 * index)
        }
        return value
    }
}

func constantTimeEquals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    a.withUnsafeBytes { x in b.withUnsafeBytes { y in CustodyCrypto.constantTimeEquals(x, y) } }
}
