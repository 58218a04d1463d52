import CustodyFormat
import CustodySystem
import Synchronization

/// What the engine says of the owner of a new file or directory: how it is recorded, whether its
/// content and name are encrypted, and with which keys (`Engine.newFileOwner`). Everything a
/// creation asks of the accounts, read in one look (a class: what the engine keeps is handed out
/// without a copy of each part).
public final class NewFileOwner: Sendable {
    /// The owner to record: a registered account by its UPN, any other identity as given
    /// (trimmed); nil when that cannot name an owner (`Owner`).
    public let owner: Owner?
    /// The class its new files are encrypted with; nil: not encrypted (an unmanaged identity, or
    /// a policy that does not require encryption).
    public let protectionClass: ProtectionClass?
    /// How the names of its new entries are stored.
    public let nameKey: NameKeyChoice
    /// The key ID its owner records carry instead of its name (an enrolled identity's class D
    /// key ID); nil: it is recorded by name.
    public let keyID: [UInt8]?
    /// The account (enrolled or registered): where its keys are filed.
    let account: IdentityKey?

    init(owner: Owner?, protectionClass: ProtectionClass?, nameKey: NameKeyChoice, keyID: [UInt8]?, account: IdentityKey?) {
        self.owner = owner
        self.protectionClass = protectionClass
        self.nameKey = nameKey
        self.keyID = keyID
        self.account = account
    }
}

extension Engine {
    /// What a new file owned by `identity` is made as. Asked for every file and directory
    /// created: kept by the identity as given while no account, binding, setting or name key
    /// changes (the resolution and name-key generations); else one look under the lock.
    public func newFileOwner(_ identity: String) -> NewFileOwner {
        let generation = resolutionGeneration.load(ordering: .acquiring), keys = nameKeyGenerationCounter.load(ordering: .acquiring)
        if let known = newFileOwners.withLock({ $0.generation == generation && $0.keys == keys ? $0.owners[identity] : nil }) {
            return known
        }
        let maxLevel = settings.maxFileProtectionLevel
        let made = state.withLock { state -> NewFileOwner in
            guard let index = state.accountIndex(identity) else {
                return NewFileOwner(owner: try? Owner(identity), protectionClass: nil, nameKey: .plain, keyID: nil, account: nil)
            }
            let account = state.accounts[index]
            let owner = try? Owner(account.upn)
            guard let policy = account.policy else {
                return NewFileOwner(owner: owner, protectionClass: nil, nameKey: .plain, keyID: nil, account: account.key)
            }
            let protectionClass = policy.fileEncryptionRequired ? min(policy.protectionLevel, maxLevel) : nil
            let held = state.withKeyring(account.key) { (nameKey: $0.nameKey, keyID: $0.classD.id) }
            let nameKey: NameKeyChoice = held?.nameKey.map { .key($0) } ?? .unavailable(account.upn)
            return NewFileOwner(owner: owner, protectionClass: protectionClass, nameKey: nameKey, keyID: held?.keyID, account: account.key)
        }
        newFileOwners.withLock { cache in
            if cache.generation != generation || cache.keys != keys || cache.owners.count >= Self.newFileOwnersKept {
                cache = (generation, keys, [:])
            }
            cache.owners[identity] = made
        }
        return made
    }

    /// How many identities `newFileOwner` keeps at once (a mount's creators, bound processes'
    /// identities, directories' owners): past that it starts again.
    static let newFileOwnersKept = 1024

    /// The class key a new file of `owner` is encrypted with (its `protectionClass`), or `locked`
    /// when the lock state withholds it; as `classKey(for:_:purpose:)` with `.create`, without
    /// looking for the account again.
    public func classKey(forNewFileOf owner: NewFileOwner) throws(EngineError) -> ClassKey {
        guard let account = owner.account, let protectionClass = owner.protectionClass else { throw .notEnrolled(owner.owner?.display ?? "") }
        processDeadlines()
        return try classKey(of: account, protectionClass, purpose: .create)
    }

    /// The key ID an owner record of `identity` carries instead of its name (the ID of its class D
    /// key, which every enrolled identity has); nil for an unmanaged or unknown identity.
    public func ownerKeyID(for identity: String) -> [UInt8]? {
        newFileOwner(identity).keyID
    }
}
