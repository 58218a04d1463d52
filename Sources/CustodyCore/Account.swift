import CustodyFormat
import CustodySystem

/// What an enrolled account's files must get, and where its data may go. Set at enrollment,
/// pushed later over the socket.
public struct Policy: Codable, Equatable, Sendable {
    /// isFileEncryptionRequired: files this identity creates are stored encrypted.
    public var fileEncryptionRequired: Bool = true
    /// The "Encrypt org data" level: the protection class of its files (before MaxFileProtectionLevel).
    public var protectionLevel: ProtectionClass = .complete
    /// shouldFileProviderEncryptFiles: exports must be encrypted copies.
    public var fileProviderEncryptionRequired: Bool = false
    /// "Send org data to other apps": which other identities may read (receive) its data.
    public var sendToOtherIdentities: TransferScope = .none
    /// "Receive data from other apps": from which other identities it accepts data (writes into
    /// its files, files given to it, reads of their files by its processes).
    public var receiveFromOtherIdentities: TransferScope = .all
    /// Locations its data may be saved to (`isSaveToAllowedForLocation`); nil: every location.
    public var saveToLocations: [String]?
    /// Locations data may be opened from into it (`isOpenFromAllowedForLocation`); nil: every location.
    public var openFromLocations: [String]?
    /// Programs (absolute executable paths) whose processes are exempt from the transfer rules
    /// for its data, whatever identity they run as (a backup agent, an indexer).
    public var transferExemptExecutables: [String] = []
    /// Users (uids) whose processes are exempt from the transfer rules for its data.
    public var transferExemptUids: [UInt32] = []
    /// Whether a screen lock, a suspend or a logout locks this identity (nil: the settings'
    /// `LockOnSessionLock`, `LockOnSuspend`, `LockOnLogout`).
    public var lockOnSessionLock: Bool?
    public var lockOnSuspend: Bool?
    public var lockOnLogout: Bool?

    /// canShareWithOtherIdentities, the older name: true is `sendToOtherIdentities = all`,
    /// false is `none`.
    public var canShareWithOtherIdentities: Bool {
        get { sendToOtherIdentities == .all }
        set { sendToOtherIdentities = newValue ? .all : .none }
    }

    /// canReceiveFromUnmanaged, the older name: true is `receiveFromOtherIdentities = all`,
    /// false is `managed`.
    public var canReceiveFromUnmanaged: Bool {
        get { receiveFromOtherIdentities == .all }
        set { receiveFromOtherIdentities = newValue ? .all : .managed }
    }

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
        case sendToOtherIdentities, receiveFromOtherIdentities, saveToLocations, openFromLocations
        case transferExemptExecutables, transferExemptUids
        case lockOnSessionLock, lockOnSuspend, lockOnLogout
    }

    /// Accepts the level by any of its names (Apple's constants, short forms, the admin console's
    /// words), and the older boolean sharing fields when the scopes are not given.
    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Policy()
        fileEncryptionRequired = try container.decodeIfPresent(Bool.self, forKey: .fileEncryptionRequired) ?? defaults.fileEncryptionRequired
        if let name = try container.decodeIfPresent(String.self, forKey: .protectionLevel) {
            guard let level = ProtectionClass(name: name) else {
                throw DecodingError.dataCorruptedError(forKey: .protectionLevel, in: container, debugDescription:
                    "unknown protection level \(name) (complete, completeUnlessOpen, untilFirstAuth or none, or Apple's NSFileProtection names)")
            }
            protectionLevel = level
        }
        fileProviderEncryptionRequired = try container.decodeIfPresent(Bool.self, forKey: .fileProviderEncryptionRequired) ?? defaults.fileProviderEncryptionRequired
        // Both forms are always decoded (a wrongly typed one is an error even when the other is
        // given); the scope wins.
        let share = try container.decodeIfPresent(Bool.self, forKey: .canShareWithOtherIdentities)
        let receive = try container.decodeIfPresent(Bool.self, forKey: .canReceiveFromUnmanaged)
        if let scope = try container.decodeIfPresent(TransferScope.self, forKey: .sendToOtherIdentities) {
            sendToOtherIdentities = scope
        } else if let share {
            canShareWithOtherIdentities = share
        }
        if let scope = try container.decodeIfPresent(TransferScope.self, forKey: .receiveFromOtherIdentities) {
            receiveFromOtherIdentities = scope
        } else if let receive {
            canReceiveFromUnmanaged = receive
        }
        saveToLocations = try Self.decodeLocations(container, .saveToLocations)
        openFromLocations = try Self.decodeLocations(container, .openFromLocations)
        transferExemptExecutables = try container.decodeIfPresent([String].self, forKey: .transferExemptExecutables) ?? []
        for path in transferExemptExecutables where !path.isAbsolutePath {
            throw DecodingError.dataCorruptedError(forKey: .transferExemptExecutables, in: container,
                                                   debugDescription: "executables are absolute paths, not \(path)")
        }
        transferExemptUids = try container.decodeIfPresent([UInt32].self, forKey: .transferExemptUids) ?? []
        lockOnSessionLock = try container.decodeIfPresent(Bool.self, forKey: .lockOnSessionLock)
        lockOnSuspend = try container.decodeIfPresent(Bool.self, forKey: .lockOnSuspend)
        lockOnLogout = try container.decodeIfPresent(Bool.self, forKey: .lockOnLogout)
    }

    private static func decodeLocations(_ container: KeyedDecodingContainer<CodingKeys>, _ key: CodingKeys) throws -> [String]? {
        guard let names = try container.decodeIfPresent([String].self, forKey: key) else { return nil }
        var result: [String] = []
        for name in names {
            guard let location = Location(name: name) else {
                throw DecodingError.dataCorruptedError(forKey: key, in: container, debugDescription: "unknown location \(name) (\(Location.knownNames))")
            }
            if !result.contains(location.name) { result.append(location.name) }
        }
        return result
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(fileEncryptionRequired, forKey: .fileEncryptionRequired)
        try container.encode(protectionLevel.description, forKey: .protectionLevel)
        try container.encode(fileProviderEncryptionRequired, forKey: .fileProviderEncryptionRequired)
        try container.encode(sendToOtherIdentities, forKey: .sendToOtherIdentities)
        try container.encode(receiveFromOtherIdentities, forKey: .receiveFromOtherIdentities)
        try container.encode(canShareWithOtherIdentities, forKey: .canShareWithOtherIdentities)
        try container.encode(canReceiveFromUnmanaged, forKey: .canReceiveFromUnmanaged)
        try container.encodeIfPresent(saveToLocations, forKey: .saveToLocations)
        try container.encodeIfPresent(openFromLocations, forKey: .openFromLocations)
        try container.encode(transferExemptExecutables, forKey: .transferExemptExecutables)
        try container.encode(transferExemptUids, forKey: .transferExemptUids)
        try container.encodeIfPresent(lockOnSessionLock, forKey: .lockOnSessionLock)
        try container.encodeIfPresent(lockOnSuspend, forKey: .lockOnSuspend)
        try container.encodeIfPresent(lockOnLogout, forKey: .lockOnLogout)
    }
}

/// An identity as a key: its name trimmed and case-folded, so that every spelling of one
/// identity finds the same entry (the engine's per-identity state, the transfer rules' managed
/// set, the keybag's name). Built once where an identity comes in, compared as a value after.
public struct IdentityKey: Hashable, Sendable, CustomStringConvertible {
    /// The folded name: what a keybag binds into its wraps and its file name is made from.
    public let folded: String

    public init(_ identity: String) { folded = identity.foldedIdentity() }

    public var description: String { folded }
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
    /// The owner's login password unlocks it too (a login protector); nil or false: not.
    public var hasLoginProtector: Bool?
    /// A recovery key unlocks it too; nil or false: not.
    public var hasRecoveryKey: Bool?
    /// Set when a policy change needs existing files re-protected; cleared once that is done.
    public var reprotectPending: Bool = false
    /// The tag of the identity's name key (`NameCipher`), once known: which stored names are its.
    public var nameTag: String?
    /// The tags of the name keys of its earlier generations of keys (`Engine.rotateKeys`): names
    /// stored before a rotation and not yet sealed again carry them.
    public var earlierNameTags: [String]?
    /// Every tag its stored names may carry: its name key's, then its earlier ones'.
    public var nameTags: [String] { (nameTag.map { [$0] } ?? []) + (earlierNameTags ?? []) }
    /// The IDs (hex) of its class keys, which its files' headers and owner records carry instead
    /// of its name (`HiddenOwners.swift`): kept here so that its files are known as its also while
    /// its keybag cannot be used, and by a wipe resumed after the keybag is gone.
    public var keyIDs: [String]?
    /// Declared in the configuration (`[[account]]`, `Provisioning.swift`): a reload that no
    /// longer declares it acts on it as `AllowedAccountsAction` says. Nil or false: made over the API.
    public var declared: Bool?

    public var isEnrolled: Bool {
        // Without copying the policy (asked for every file created).
        if case .none = policy { return false }
        return true
    }

    /// True when `identity` is this account's object ID or UPN spelled exactly as stored.
    public func matchesAsStored(_ identity: String) -> Bool {
        identity == id || identity == upn
    }

    /// True when `identity` names this account by object ID or UPN, in any case.
    public func matches(_ identity: String) -> Bool {
        // Identities usually arrive spelled as stored (records, bindings): no folding needed.
        if matchesAsStored(identity) { return true }
        let key = IdentityKey(identity)
        return key == IdentityKey(id) || key == IdentityKey(upn)
    }

    /// What the engine files this account's keys, its lock and attempts under: its object ID as
    /// an `IdentityKey`.
    public var key: IdentityKey { IdentityKey(id) }

    /// Both of its names as keys (object ID and UPN), for matching what a file or event names.
    public var keys: Set<IdentityKey> { [IdentityKey(id), IdentityKey(upn)] }

    /// `identity` trimmed, if it can name a file's owner (see `Owner`): some character that is
    /// not whitespace, no NUL, at most 180 bytes of UTF-8 in both spellings. Every way an
    /// identity enters (enrollment, registration, bindings, files and data protected for it)
    /// checks the same rule, so the control API's schema can state it once.
    public static func checkedName(_ identity: String) throws(EngineError) -> String {
        let trimmed = identity.trimmingWhitespace()
        guard !trimmed.isEmpty else { throw .invalidIdentity("an identity needs a character that is not whitespace") }
        do { _ = try Owner(trimmed) } catch { throw .invalidIdentity("\(error)") }
        return trimmed
    }
}
