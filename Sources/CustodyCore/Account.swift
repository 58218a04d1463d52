import CustodyFormat
import CustodySystem

/// What an enrolled account's files must get. Set at enrollment, pushed later over the socket.
public struct Policy: Codable, Equatable, Sendable {
    /// isFileEncryptionRequired: files this identity creates are stored encrypted.
    public var fileEncryptionRequired: Bool = true
    /// The "Encrypt org data" level: the protection class of its files (before MaxFileProtectionLevel).
    public var protectionLevel: ProtectionClass = .complete
    /// shouldFileProviderEncryptFiles: exports must be encrypted copies.
    public var fileProviderEncryptionRequired: Bool = false
    /// canReceiveSharedFile: whether other identities may receive its files.
    public var canShareWithOtherIdentities: Bool = false
    /// "Receive data from other apps": whether this identity may receive files of unmanaged
    /// identities and of no identity (`canReceiveSharedFile` for such files).
    public var canReceiveFromUnmanaged: Bool = true

    public init(fileEncryptionRequired: Bool = true, protectionLevel: ProtectionClass = .complete,
                fileProviderEncryptionRequired: Bool = false, canShareWithOtherIdentities: Bool = false,
                canReceiveFromUnmanaged: Bool = true) {
        self.fileEncryptionRequired = fileEncryptionRequired
        self.protectionLevel = protectionLevel
        self.fileProviderEncryptionRequired = fileProviderEncryptionRequired
        self.canShareWithOtherIdentities = canShareWithOtherIdentities
        self.canReceiveFromUnmanaged = canReceiveFromUnmanaged
    }

    enum CodingKeys: String, CodingKey {
        case fileEncryptionRequired, protectionLevel, fileProviderEncryptionRequired, canShareWithOtherIdentities, canReceiveFromUnmanaged
    }

    /// Accepts the level by any of its names (Apple's constants, short forms, the admin console's words).
    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Policy()
        fileEncryptionRequired = try container.decodeIfPresent(Bool.self, forKey: .fileEncryptionRequired) ?? defaults.fileEncryptionRequired
        if let name = try container.decodeIfPresent(String.self, forKey: .protectionLevel) {
            guard let level = ProtectionClass(name: name) else {
                throw DecodingError.dataCorruptedError(forKey: .protectionLevel, in: container, debugDescription: "unknown protection level \(name)")
            }
            protectionLevel = level
        }
        fileProviderEncryptionRequired = try container.decodeIfPresent(Bool.self, forKey: .fileProviderEncryptionRequired) ?? defaults.fileProviderEncryptionRequired
        canShareWithOtherIdentities = try container.decodeIfPresent(Bool.self, forKey: .canShareWithOtherIdentities) ?? defaults.canShareWithOtherIdentities
        canReceiveFromUnmanaged = try container.decodeIfPresent(Bool.self, forKey: .canReceiveFromUnmanaged) ?? defaults.canReceiveFromUnmanaged
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(fileEncryptionRequired, forKey: .fileEncryptionRequired)
        try container.encode(protectionLevel.description, forKey: .protectionLevel)
        try container.encode(fileProviderEncryptionRequired, forKey: .fileProviderEncryptionRequired)
        try container.encode(canShareWithOtherIdentities, forKey: .canShareWithOtherIdentities)
        try container.encode(canReceiveFromUnmanaged, forKey: .canReceiveFromUnmanaged)
    }
}

/// A registered account: an object ID and a UPN, matched case-insensitively. Enrolled accounts
/// have a policy and are managed; registered-only accounts are known but unmanaged.
public struct Account: Codable, Equatable, Sendable {
    public var id: String
    public var upn: String
    public var registeredAt: Double
    public var policy: Policy?
    /// The uid this account belongs to on this machine (who may lock, unlock and bind it).
    public var uid: UInt32?
    public var hasPassphrase: Bool = false
    /// Set when a policy change needs existing files re-protected; cleared once that is done.
    public var reprotectPending: Bool = false

    public var isEnrolled: Bool { policy != nil }

    /// True when `identity` is this account's object ID or UPN spelled exactly as stored.
    public func matchesAsStored(_ identity: String) -> Bool {
        identity == id || identity == upn
    }

    /// True when `identity` names this account by object ID or UPN, in any case.
    public func matches(_ identity: String) -> Bool {
        // Identities usually arrive spelled as stored (records, bindings): no folding needed.
        if matchesAsStored(identity) { return true }
        let key = Account.canonical(identity)
        return key == Account.canonical(id) || key == Account.canonical(upn)
    }

    /// The case-folded, trimmed form identities are compared in.
    public static func canonical(_ identity: String) -> String {
        identity.trimmingWhitespace().lowercased()
    }
}
