import CustodyCrypto
import CustodyFormat
import CustodySystem
import FoundationEssentials

/// One identity on several hosts: its class keys leave a daemon only sealed to another host's
/// key, and that host enrolls them under its own protectors. Files the identity encrypted on
/// either host then open on both (a file names its class key by ID, and the IDs travel with the
/// keys), and so do its encrypted names (the name key comes from class C).
///
/// A host's receiving key is an X25519 key pair derived from its current machine key, so that it
/// is held as the machine key is (sealed to the TPM where there is one) and nothing more is
/// stored; it changes when the machine key is migrated or reset, and an export sealed to the old
/// one must then be made again.

/// The public half of this host's receiving key.
public struct HostKey: Equatable, Sendable {
    public let publicKey: [UInt8]
    /// 8 bytes of SHA-256 of the public key, in hex: what people compare.
    public let fingerprint: String

    public init(publicKey: [UInt8]) {
        self.publicKey = publicKey
        fingerprint = publicKey.withUnsafeBytes { hexString(sha256($0).prefix(8)) }
    }
}

/// An identity's keys sealed to one host, as a file or a playbook carries them. The outer fields
/// are for people and for choosing; the sealed content repeats the account, the identity and
/// the receiving key, and an import refuses an export whose outer fields say otherwise.
public struct IdentityExport: Codable, Equatable, Sendable {
    public static let currentFormat = "custody-identity-export/1"
    public var format: String
    public var accountID: String
    public var upn: String
    /// The receiving host's public key (base64) and its fingerprint.
    public var to: String
    public var toFingerprint: String
    /// The sending host's fingerprint.
    public var from: String
    /// Wall-clock seconds since 1970.
    public var created: Double
    /// A libsodium sealed box (base64) to `to`, of the content `IdentityTransfer` writes.
    public var sealed: String

    public init(format: String, accountID: String, upn: String, to: String, toFingerprint: String, from: String, created: Double, sealed: String) {
        self.format = format
        self.accountID = accountID
        self.upn = upn
        self.to = to
        self.toFingerprint = toFingerprint
        self.from = from
        self.created = created
        self.sealed = sealed
    }
}

/// The class keys of an identity as they travel: classes A, C and D (symmetric) and class B's
/// private key, each with its ID.
struct TransferredClassKeys {
    var symmetric: [ProtectionClass: (id: [UInt8], key: SecretBytes)]
    var classB: (id: [UInt8], privateKey: SecretBytes)

    /// The IDs (hex) of its four keys.
    var keyIDs: [String] {
        IdentityTransfer.keyOrder.map { hexString($0 == .completeUnlessOpen ? classB.id : symmetric[$0]?.id ?? []) }
    }
}

/// Every generation of an identity's class keys (`Engine.rotateKeys`) as they travel: the
/// keybag's `classes` first, then its later generations, and the one new files get.
struct TransferredKeys {
    var generations: [TransferredClassKeys]
    var current: Int
}

/// The sealed content: a 4-byte big-endian length, that many bytes of JSON (`Description`: who
/// the keys are and what each is called, nothing secret), then the four keys of 32 bytes of each
/// generation, in the order of `keyOrder`, generation after generation (the keybag's first, then
/// those `Description.generations` names). It is made and read in secure memory.
enum IdentityTransfer {
    struct Description: Codable {
        var format: String
        var accountID: String
        var upn: String
        /// The identity every wrap of the keybag is bound to (the folded object ID).
        var identity: String
        /// The receiving host's public key (base64), as in the outer fields.
        var to: String
        /// Class letter → key ID (hex), in `keyOrder`'s classes: the keybag's first generation.
        var keyIDs: [String: String]
        var policy: Policy?
        /// The identity's later generations of keys (`Engine.rotateKeys`), each as `keyIDs`;
        /// absent before its first rotation.
        var generations: [[String: String]]?
        /// The generation new files get (0: `keyIDs`'); absent is 0.
        var current: Int?

        /// Every generation's key IDs by class letter, the first one first.
        var allKeyIDs: [[String: String]] { [keyIDs] + (generations ?? []) }
    }

    static let keyOrder: [ProtectionClass] = [.complete, .completeUnlessOpen, .untilFirstAuthentication, .none]
    static let keySize = 32
    static let hostKeyInfo = Array("custody/v1/host-receiving-key".utf8)

    /// The receiving key pair of the host whose machine key is `machineKey`.
    static func hostKeyPair(machineKey: SecretBytes) throws(EngineError) -> (secret: SecretBytes, key: HostKey) {
        do {
            let secret = try HKDF.derive(.sha256, key: machineKey, salt: [], info: hostKeyInfo, count: X25519.keySize)
            return (secret, HostKey(publicKey: try X25519.publicKey(for: secret)))
        } catch {
            throw .crypto(error)
        }
    }

    static func seal(_ description: Description, keys: [TransferredClassKeys], to recipient: [UInt8]) throws(EngineError) -> [UInt8] {
        let metadata: [UInt8]
        do { metadata = Array(try JSONEncoder().encode(description)) } catch { throw .crypto(.library("cannot encode the export's description")) }
        var secrets: [SecretBytes] = []
        for generation in keys {
            for slot in keyOrder {
                guard let key = slot == .completeUnlessOpen ? generation.classB.privateKey : generation.symmetric[slot]?.key, key.count == keySize else {
                    throw .crypto(.library("class \(slot.letter) key is missing"))
                }
                secrets.append(key)
            }
        }
        do {
            let content = try SecretBytes(count: 4 + metadata.count + keySize * secrets.count)
            content.withUnsafeMutableBytes { out in
                var length = UInt32(metadata.count).bigEndian
                var offset = 0
                func append(_ part: UnsafeRawBufferPointer) {
                    UnsafeMutableRawBufferPointer(rebasing: out[offset..<(offset + part.count)]).copyMemory(from: part)
                    offset += part.count
                }
                withUnsafeBytes(of: &length) { append($0) }
                metadata.withUnsafeBytes { append($0) }
                for secret in secrets { secret.withUnsafeBytes { append($0) } }
            }
            return try SealedBox.seal(content, to: recipient)
        } catch {
            throw .crypto(error)
        }
    }

    /// Opens a sealed content with this host's receiving key; nil when it was not sealed to it
    /// (or was changed). Throws for content that opens but is not an export's.
    static func open(_ sealed: [UInt8], host: (secret: SecretBytes, key: HostKey)) throws(EngineError) -> (Description, TransferredKeys)? {
        guard let content = try? SealedBox.open(sealed, publicKey: host.key.publicKey, secretKey: host.secret) else { return nil }
        return try content.withUnsafeBytes { (bytes) throws(EngineError) -> (Description, TransferredKeys) in
            guard bytes.count > 4 else { throw malformed("it is too short") }
            let length = Int(bytes[0]) << 24 | Int(bytes[1]) << 16 | Int(bytes[2]) << 8 | Int(bytes[3])
            guard length > 0, bytes.count > 4 + length else { throw malformed("its parts do not add up") }
            let description: Description
            do {
                description = try JSONDecoder().decode(Description.self, from: Data(UnsafeRawBufferPointer(rebasing: bytes[4..<(4 + length)])))
            } catch {
                throw malformed("its description does not read")
            }
            guard description.format == IdentityExport.currentFormat else { throw malformed("format \(description.format) is not \(IdentityExport.currentFormat)") }
            let named = description.allKeyIDs
            guard bytes.count == 4 + length + keySize * keyOrder.count * named.count else { throw malformed("its parts do not add up") }
            var generations: [TransferredClassKeys] = []
            for (number, keyIDs) in named.enumerated() {
                var symmetric: [ProtectionClass: (id: [UInt8], key: SecretBytes)] = [:]
                var classB: (id: [UInt8], privateKey: SecretBytes)?
                for (index, slot) in keyOrder.enumerated() {
                    guard let hex = keyIDs[String(slot.letter)], let id = bytesOfHex(hex), id.count == FileHeader.classKeyIDSize else {
                        throw malformed("class \(slot.letter) of generation \(number) has no key ID")
                    }
                    let start = 4 + length + (number * keyOrder.count + index) * keySize
                    let key: SecretBytes
                    do throws(CryptoError) {
                        key = try SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes[start..<(start + keySize)]))
                    } catch {
                        throw .crypto(error)
                    }
                    if slot == .completeUnlessOpen { classB = (id, key) } else { symmetric[slot] = (id, key) }
                }
                guard let classB else { throw malformed("class B is missing") }
                generations.append(TransferredClassKeys(symmetric: symmetric, classB: classB))
            }
            let current = description.current ?? 0
            guard generations.indices.contains(current) else { throw malformed("its current generation \(current) is not one of its \(generations.count)") }
            return (description, TransferredKeys(generations: generations, current: current))
        }
    }

    static func malformed(_ reason: String) -> EngineError {
        .identityExportInvalid("the export opens here but \(reason)")
    }

    static func bytesOfHex(_ hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case 0x30...0x39: return digit - 0x30
        case 0x61...0x66: return digit - 0x61 + 10
        case 0x41...0x46: return digit - 0x41 + 10
        default: return nil
        }
    }
}

extension Engine {
    /// This host's receiving key (of its current machine key).
    public func hostKey() throws(EngineError) -> HostKey {
        try IdentityTransfer.hostKeyPair(machineKey: machineKeys.current().key).key
    }

    /// The keys of `identity` (enrolled and unlocked: classes A and B exist in clear only then)
    /// sealed to the host whose receiving key is `recipient` (32 bytes, from its `hostKey`).
    public func exportIdentity(_ identity: String, to recipient: [UInt8]) throws(EngineError) -> IdentityExport {
        guard recipient.count == X25519.keySize else { throw .identityExportInvalid("a host key is \(X25519.keySize) bytes, not \(recipient.count)") }
        let account = try self.account(identity)
        guard account.isEnrolled else { throw .notEnrolled(account.upn) }
        let (stored, _) = try unlockedKeybag(of: account)
        guard let (generations, current) = state.withLock({ state in state.keys[account.key].flatMap { keys in keys.transferable.map { ($0, keys.current) } } }),
              let first = generations.first else {
            throw .locked(account.upn, .complete)
        }
        let to = Data(recipient).base64EncodedString()
        func keyIDs(_ keys: TransferredClassKeys) -> [String: String] {
            Dictionary(uniqueKeysWithValues: zip(IdentityTransfer.keyOrder.map { String($0.letter) }, keys.keyIDs))
        }
        var description = IdentityTransfer.Description(format: IdentityExport.currentFormat, accountID: account.id, upn: account.upn,
                                                       identity: stored.identity, to: to, keyIDs: keyIDs(first), policy: account.policy)
        if generations.count > 1 {
            description.generations = generations.dropFirst().map(keyIDs)
            description.current = current
        }
        let sealed = try IdentityTransfer.seal(description, keys: generations, to: recipient)
        let receiver = HostKey(publicKey: recipient)
        let export = IdentityExport(format: IdentityExport.currentFormat, accountID: account.id, upn: account.upn, to: to,
                                    toFingerprint: receiver.fingerprint, from: try hostKey().fingerprint, created: wallClockSeconds(),
                                    sealed: Data(sealed).base64EncodedString())
        events.emit(.identityExported, identity: account.upn, "the keys of \(account.upn) were sealed to host \(receiver.fingerprint)",
                    details: ["to": receiver.fingerprint])
        return export
    }

    /// What an import did, or (checking) would do.
    public enum ImportOutcome: Equatable, Sendable {
        /// Enrolled with the export's keys (checking: it would be).
        case imported(Account?)
        /// Enrolled here already with exactly the export's keys, or with every one of them and
        /// later ones: nothing to do.
        case alreadyHere(Account)
        /// Enrolled here with earlier generations of the export's keys (rotated on another host):
        /// the new generations were added (checking: they would be).
        case rotated(Account?)
    }

    /// Enrolls the identity of `export` here with the keys it carries, under this host's own
    /// protectors: `passphrase` (none: it unlocks on authorization alone, as an enrolment without
    /// one), then a login protector and a recovery key as for any identity. `policy` (nil: the
    /// one the export carries) and `uid` as for `enroll`. An account enrolled here with exactly
    /// those keys is left as it is (`alreadyHere`: an import is idempotent); one enrolled with
    /// other keys is refused, and so are keys of it kept here from an earlier enrolment. With
    /// `checking`, everything is checked and nothing is enrolled.
    public func importIdentity(_ export: IdentityExport, passphrase: SecretBytes?, policy: Policy?, uid: UInt32?,
                               checking: Bool = false) throws(EngineError) -> ImportOutcome {
        guard export.format == IdentityExport.currentFormat else {
            throw .identityExportInvalid("format \(export.format) is not \(IdentityExport.currentFormat)")
        }
        guard let sealed = Data(base64Encoded: export.sealed) else { throw .identityExportInvalid("its sealed content is not base64") }
        var opened: (IdentityTransfer.Description, TransferredKeys)?
        for host in receivingKeys() {
            if let found = try IdentityTransfer.open(Array(sealed), host: host) {
                opened = found
                break
            }
        }
        guard let (description, keys) = opened else {
            let here = (try? hostKey().fingerprint) ?? "unknown"
            throw .identityExportInvalid("it is sealed to host \(export.toFingerprint), not to this one (\(here)), or it was changed")
        }
        guard description.accountID == export.accountID, description.upn == export.upn, description.to == export.to else {
            throw .identityExportInvalid("its outer fields do not match what is sealed inside (\(description.upn), \(description.accountID))")
        }
        guard description.identity == IdentityKey(description.accountID).folded else {
            throw .identityExportInvalid("its keys are bound to another identity than \(description.accountID)")
        }
        if let existing = try? account(description.accountID), existing.isEnrolled {
            let theirs = description.allKeyIDs.map { ids in IdentityTransfer.keyOrder.map { ids[String($0.letter)] ?? "" } }
            guard try Self.addsGenerations(theirs, to: existing) else { return .alreadyHere(existing) }
            if checking {
                _ = try unlockedKeybag(of: existing)
                return .rotated(nil)
            }
            return .rotated(try addGenerations(keys, to: existing, from: export.from))
        }
        let policy = policy ?? description.policy
        if checking {
            _ = try checkEnrollable(id: description.accountID, upn: description.upn, policy: policy, imported: true)
            return .imported(nil)
        }
        return .imported(try enroll(id: description.accountID, upn: description.upn, policy: policy, passphrase: passphrase, uid: uid,
                                    imported: (keys, export.from)))
    }

    /// The receiving key pairs of every machine key held here (the current one first): an
    /// export made for this host before a machine key migration finished still opens.
    private func receivingKeys() -> [(secret: SecretBytes, key: HostKey)] {
        var keys: [(secret: SecretBytes, key: HostKey)] = []
        if let current = try? machineKeys.current(), let pair = try? IdentityTransfer.hostKeyPair(machineKey: current.key) { keys.append(pair) }
        for id in machineKeys.ids() where id != machineKeys.currentID {
            if let other = try? machineKeys.key(id), let pair = try? IdentityTransfer.hostKeyPair(machineKey: other.key) { keys.append(pair) }
        }
        return keys
    }
}
