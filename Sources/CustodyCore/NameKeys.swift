import CustodyFormat

/// The name keys held now (`Engine.nameKeys`): a snapshot the mounts keep until the engine's
/// name-key generation moves on.
public struct NameKeySet: Sendable {
    public let generation: UInt64
    /// By key tag: what a stored name carries (every key held, earlier generations' too).
    public let byTag: [String: NameKey]
    /// The keys a name that is not stored in plain is looked for in: each identity's current
    /// one, and its earlier generations' while its names are being brought to the current one.
    public let all: [NameKey]
    /// Every key held, for matching a stored name's tag.
    private let every: [NameKey]

    public init(generation: UInt64, byTag: [String: NameKey], all: [NameKey]) {
        self.generation = generation
        self.byTag = byTag
        self.all = all
        every = Array(byTag.values)
    }

    /// No key, of no generation the engine has (so that a mount's first look asks the engine).
    public static let empty = NameKeySet(generation: .max, byTag: [:], all: [])

    /// The key whose tag is `tag`, the six tag bytes of a stored name (a listing's, a removal's):
    /// compared byte for byte while few keys are held, as no string is made of it.
    public func key(tagged tag: UnsafeRawBufferPointer) -> NameKey? {
        if every.count <= 8 { return every.first { $0.hasTag(tag) } }
        return byTag[String(decoding: tag, as: UTF8.self)]
    }
}

/// Whether the name of an identity's new entry is encrypted, and with which key.
public enum NameKeyChoice: Sendable {
    /// No owner, or an unmanaged one: the name is stored as it is.
    case plain
    /// A managed identity's name key.
    case key(NameKey)
    /// A managed identity whose key is not held (not unlocked since the daemon started, or
    /// wiped): nothing may be named for it now.
    case unavailable(String)
}

/// The keys of managed identities' names (`NameCipher`). An identity's name key comes from its
/// class C key: it is there from the identity's first unlock (as on iOS, where a locked device
/// still lists its files) until the daemon stops or the identity is wiped, when it goes with the
/// identity's other keys. Its tag is kept with the account (`Account.nameTag`), so that a wipe
/// finds the identity's names even when the key was never held since the daemon started.
extension Engine {
    /// The name key of `identity` while it is held; nil before the identity's first unlock, for an
    /// unmanaged or unknown identity, and after a wipe.
    public func nameKey(for identity: String) -> NameKey? {
        guard let account = try? account(identity) else { return nil }
        return state.withLock { $0.keys[account.key]?.nameKey }
    }

    /// Changes whenever a name key appears (first unlock, enrolment, recovery) or goes (wipe).
    public var nameKeyGeneration: UInt64 { nameKeyGenerationCounter.load(ordering: .acquiring) }

    /// Every name key held now.
    public func nameKeys() -> NameKeySet {
        state.withLock { state in
            let generation = nameKeyGenerationCounter.load(ordering: .acquiring)
            var byTag: [String: NameKey] = [:], all: [NameKey] = []
            for (key, keys) in state.keys {
                for nameKey in keys.nameKeys { byTag[nameKey.tag] = nameKey }
                if let current = keys.nameKey { all.append(current) }
                // Earlier generations' names are looked for only while they are being sealed again.
                let earlier = keys.earlierNameKeys
                if !earlier.isEmpty, state.accounts.first(where: { $0.key == key })?.reprotectPending == true { all += earlier }
            }
            return NameKeySet(generation: generation, byTag: byTag, all: all)
        }
    }

    /// After `key`'s keys changed: a new name key is announced to the mounts (`appeared`: it was
    /// not held before), and its tag is kept with the account (written once, when it first appears).
    func nameKeyInstalled(_ key: IdentityKey, appeared: Bool = true) {
        let snapshot = state.withLock { state -> OrderedStateFile<AccountsFile>.Snapshot? in
            nameKeyGenerationCounter.add(1, ordering: .releasing)
            guard let keys = state.keys[key], let tag = keys.nameKey?.tag,
                  let index = state.accounts.firstIndex(where: { $0.key == key }) else { return nil }
            let earlier = keys.earlierNameKeys.map(\.tag)
            guard state.accounts[index].nameTag != tag || (state.accounts[index].earlierNameTags ?? []) != earlier else { return nil }
            state.accounts[index].earlierNameTags = earlier.isEmpty ? nil : earlier
            state.accounts[index].nameTag = tag
            return accountsSnapshot(state)
        }
        if let snapshot { try? files.save(snapshot) }
        if appeared, let account = accounts().first(where: { $0.key == key }) {
            for volume in volumes { volume.namesRevealed(account) }
        }
    }

    /// A name key went (`dropKeys`): the mounts drop their copies at their next name.
    func nameKeyDropped() {
        nameKeyGenerationCounter.add(1, ordering: .releasing)
    }
}
