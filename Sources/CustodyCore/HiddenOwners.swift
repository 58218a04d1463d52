import CustodyFormat
import FoundationEssentials

/// Owners the disk does not name. From format version 3 an encrypted file's header carries no
/// owner, and a managed identity's owner record carries a key ID instead of the identity
/// (`docs/format.md`): the ID of one of the identity's class keys, which only its keybag links to
/// the identity. Whoever holds the keybag (this engine) finds the account; a copy of the disk
/// does not.
extension Engine {
    /// The account whose keybag holds a class key with the ID `id` (of any class); nil when none
    /// here does (an identity enrolled elsewhere, or wiped).
    public func account(forKeyID id: [UInt8]) -> Account? {
        indexed(keyID: id)?.account
    }

    /// Changes whenever what `account(forKeyID:)` answers may change (accounts, their keys,
    /// bindings, settings): a caller may keep answers of one generation.
    public var ownerGeneration: UInt64 { resolutionGeneration.load(ordering: .acquiring) }

    /// The identity of `account(forKeyID:)`, without a copy of its account: every file created
    /// asks (`adoptFileKey`).
    func identityKey(forKeyID id: [UInt8]) -> IdentityKey? {
        indexed(keyID: id)?.key
    }

    /// The entry of the account whose keybag holds the class key `id`. Every file created or
    /// probed asks: an index by the ID as a number, made again when accounts or their keys change.
    private func indexed(keyID id: [UInt8]) -> IndexedAccount? {
        guard let wanted = Self.keyIDNumber(id) else { return nil }
        let generation = resolutionGeneration.load(ordering: .acquiring)
        let found = keyIDIndex.withLock { index -> IndexedAccount?? in
            guard let index, index.generation == generation else { return nil }
            return .some(index.accounts[wanted])
        }
        if let found { return found }
        return keyIDIndex(generation)[wanted]
    }

    /// A class key ID as the index holds it: its eight bytes as a big-endian number (nil for
    /// another length).
    static func keyIDNumber(_ id: some Collection<UInt8>) -> UInt64? {
        guard id.count == FileHeader.classKeyIDSize else { return nil }
        return id.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Makes the index of accounts by key ID for `generation`.
    private func keyIDIndex(_ generation: UInt64) -> [UInt64: IndexedAccount] {
        var accounts: [UInt64: IndexedAccount] = [:]
        let known = self.accounts()
        state.withLock { state in
            for account in known {
                let entry = IndexedAccount(account)
                // As the account keeps them (hex, the same number read big-endian), and as its keybag does.
                for hex in account.keyIDs ?? [] where hex.utf8.count == 2 * FileHeader.classKeyIDSize {
                    if let id = UInt64(hex, radix: 16) { accounts[id] = entry }
                }
                if let stored = state.keys[account.key]?.stored {
                    for wrapped in stored.allWrappedKeys { if let id = Self.keyIDNumber(wrapped.id) { accounts[id] = entry } }
                }
            }
        }
        keyIDIndex.withLock { $0 = (generation, accounts) }
        return accounts
    }

    /// The identity a header belongs to, as `account(of:)` finds it.
    func identityKey(of header: FileHeader) throws(EngineError) -> IdentityKey {
        if header.owner == nil, let key = identityKey(forKeyID: header.classKeyID) { return key }
        return try account(of: header).key
    }

    /// The account a header belongs to: the one it names (versions 1 and 2), or the one whose
    /// keybag holds its class key (version 3).
    public func account(of header: FileHeader) throws(EngineError) -> Account {
        if let owner = header.owner { return try account(owner.canonical) }
        guard let account = account(forKeyID: header.classKeyID) else {
            if let reason = sealedState {
                throw .machineKeyUnavailable("the owner of key \(hexString(header.classKeyID)) cannot be looked up: \(reason)")
            }
            throw .unknownAccount("the owner of key \(hexString(header.classKeyID))")
        }
        return account
    }

    /// The owner of a header as shown to people: the account's UPN when it is known here, else
    /// the owner it names, else that its identity is not known here.
    public func ownerName(of header: FileHeader) -> String {
        if let account = try? account(of: header) { return account.upn }
        return header.owner?.display ?? unknownOwner(keyID: header.classKeyID)
    }

    /// The account an owner record names, by name or by key ID; nil when none here matches.
    public func account(of record: OwnerRecord) -> Account? {
        switch record.holder {
        case .named(let owner): return try? account(owner.canonical)
        case .keyID(let id): return account(forKeyID: id)
        }
    }

    /// The owner of a record as shown to people (as for headers).
    public func ownerName(of record: OwnerRecord) -> String {
        switch record.holder {
        case .named(let owner): return (try? account(owner.canonical))?.upn ?? owner.display
        case .keyID(let id): return account(forKeyID: id)?.upn ?? unknownOwner(keyID: id)
        }
    }

    /// How an owner that no account here names is shown: the identity of a keybag in the state
    /// directory that holds the key (one no account names: enrolling that object ID again takes
    /// it up), else that it is not known here.
    public func unknownOwner(keyID: [UInt8]) -> String {
        // Every file of such an owner asks (each lookup, until an enrolment names it), and the
        // answer reads every keybag: kept per key ID for the resolution generation.
        let generation = resolutionGeneration.load(ordering: .acquiring), hex = hexString(keyID)
        if let known = unknownOwners.withLock({ $0.generation == generation ? $0.names[hex] : nil }) { return known }
        let wanted = Data(keyID)
        var found = "an identity not known here (key \(hex))"
        for name in files.list("keybags") where name.hasSuffix(".json") && !name.contains(".tmp-") {
            if let stored = try? files.read(StoredKeybag.self, from: "keybags/" + name), stored.allWrappedKeys.contains(where: { $0.id == wanted }) {
                found = stored.identity
                break
            }
        }
        unknownOwners.withLock { cache in
            if cache.generation != generation { cache = (generation, [:]) }
            cache.names[hex] = found
        }
        return found
    }

    /// The IDs (hex) of every class key of a keybag, of every generation.
    static func keyIDs(of stored: StoredKeybag) -> [String] {
        stored.allWrappedKeys.map { hexString(Array($0.id)) }
    }
}

/// An account in the index by key ID, with the key it is filed under (not made again per look).
final class IndexedAccount: Sendable {
    let account: Account
    let key: IdentityKey

    init(_ account: Account) {
        self.account = account
        self.key = account.key
    }
}
