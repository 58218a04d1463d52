import CustodyCrypto
import CustodyFormat
import CustodySystem

/// New keys for an identity whose keys may have been taken (a lost or stolen host): a new
/// generation of class keys A, B, C and D that new files, names and owner records get from then
/// on, while the earlier generations stay in the keybag to open what they protected until the
/// mounts have brought it to the new one (`ProtectedVolume.keysRotated`: a new file key for
/// each file, its name and symlink target sealed again, its owner record by the new class D's
/// ID). Carried to the identity's other hosts as any export is: an import of an identity that
/// is enrolled there with an older set of its generations adds the new ones.
///
/// The earlier generations are wrapped under the keys the keybag's protectors wrap (its first
/// generation, `StoredKeybag.classes`), so passphrases, login protectors, recovery keys and TPM
/// gates stay as they are; a host that never had the new generation (the lost one) has nothing
/// that opens it.
extension Engine {
    /// Gives `identity` (enrolled and unlocked) a new generation of class keys and starts bringing
    /// its stored files to it.
    @discardableResult
    public func rotateKeys(_ identity: String) throws(EngineError) -> Account {
        let account = try self.account(identity)
        guard account.isEnrolled else { throw .notEnrolled(account.upn) }
        let (stored, root, secrets) = try firstGeneration(of: account)
        let fresh: TransferredClassKeys
        do {
            fresh = TransferredClassKeys(symmetric: [.complete: (try Random.bytes(FileHeader.classKeyIDSize), try SecretBytes.random(count: 32)),
                                                     .untilFirstAuthentication: (try Random.bytes(FileHeader.classKeyIDSize), try SecretBytes.random(count: 32)),
                                                     .none: (try Random.bytes(FileHeader.classKeyIDSize), try SecretBytes.random(count: 32))],
                                         classB: (try Random.bytes(FileHeader.classKeyIDSize), try X25519.generatePrivateKey()))
        } catch {
            throw .crypto(error)
        }
        var updated = stored
        updated.generations = (stored.generations ?? []) + [try Keybags.generation(of: fresh, in: stored, root: secrets, made: wallClockSeconds())]
        updated.currentGeneration = updated.generations?.count
        return try adoptGenerations(updated, of: account, root: root, from: nil)
    }

    /// Whether an export's generations (`theirs`, each generation's four key IDs) would add to
    /// `account`'s here: nil when they are the same or older (nothing to do), true when they hold
    /// every generation here and more; throws `alreadyEnrolled` for keys that are not this
    /// identity's here.
    static func addsGenerations(_ theirs: [[String]], to account: Account) throws(EngineError) -> Bool {
        let ours = Set(account.keyIDs ?? []), all = Set(theirs.joined().map { $0.lowercased() })
        if ours == all || all.isSubset(of: ours) { return false }
        guard ours.isSubset(of: all) else { throw .alreadyEnrolled(account.upn) }
        return true
    }

    /// Adds the generations of `keys` that `account`'s keybag lacks (an import of an identity
    /// rotated on another host; its generations here must all be among them), under this
    /// keybag's own first generation, and makes `keys`' current generation the one new files get.
    func addGenerations(_ keys: TransferredKeys, to account: Account, from host: String) throws(EngineError) -> Account {
        let (stored, root, secrets) = try firstGeneration(of: account)
        guard keys.generations.indices.contains(keys.current) else {
            throw .identityExportInvalid("its current generation \(keys.current) is not one of its \(keys.generations.count)")
        }
        var updated = stored
        var known = Self.generationIDs(of: stored)
        for generation in keys.generations where !known.contains(generation.keyIDs) {
            updated.generations = (updated.generations ?? []) + [try Keybags.generation(of: generation, in: stored, root: secrets, made: wallClockSeconds())]
            known.append(generation.keyIDs)
        }
        guard let current = known.firstIndex(of: keys.generations[keys.current].keyIDs) else {
            throw .identityExportInvalid("its current generation is not among its generations")
        }
        updated.currentGeneration = current
        return try adoptGenerations(updated, of: account, root: root, from: host)
    }

    /// `account`'s stored keybag, the classes A, B and C of its first generation (which its
    /// protectors wrap), and the secrets every later generation is wrapped under: `locked`
    /// unless it is unlocked.
    private func firstGeneration(of account: Account) throws(EngineError) -> (StoredKeybag, ClassKeys, [ProtectionClass: SecretBytes]) {
        let (stored, root) = try unlockedKeybag(of: account)
        guard let rootD = state.withLock({ $0.keys[account.key]?.rootClassD }), let secrets = Keybags.rootSecrets(root, classD: rootD) else {
            throw .locked(account.upn, .complete)
        }
        return (stored, root, secrets)
    }

    /// Each generation's four key IDs (hex, in `IdentityTransfer.keyOrder`), `classes` first.
    static func generationIDs(of stored: StoredKeybag) -> [[String]] {
        func ids(_ classes: [String: StoredKeybag.WrappedKey]) -> [String] {
            IdentityTransfer.keyOrder.map { classes[String($0.letter)].map { hexString(Array($0.id)) } ?? "" }
        }
        return [ids(stored.classes)] + (stored.generations ?? []).map { ids($0.classes) }
    }

    /// Takes a keybag with new generations (made here, or imported `from` another host): saved,
    /// the identity's keyring made again from it (with the lock state it has), its account's key
    /// IDs and name tags brought up to date, its files marked for re-protection, the event sent
    /// and the mounts told.
    private func adoptGenerations(_ updated: StoredKeybag, of account: Account, root: ClassKeys, from host: String?) throws(EngineError) -> Account {
        let file = files.path(files.keybagName(account.id))
        guard let secret = state.withLock({ $0.keys[account.key]?.machineSecret }) else { throw missingKeys(account) }
        var keys = try Keyring.load(updated, machineSecret: secret, file: file)
        keys.install(root)
        try saveKeybag(updated, of: account)
        let (rotated, snapshot) = try state.withLock { (state) throws(EngineError) -> (Account, OrderedStateFile<AccountsFile>.Snapshot) in
            guard let index = state.accounts.firstIndex(where: { $0.key == account.key }), let old = state.keys[account.key] else {
                throw .unknownAccount(account.upn)
            }
            keys.stored = old.stored
            keys.lock = old.lock
            keys.failures = old.failures
            keys.retryAt = old.retryAt
            // Locked meanwhile: what the lock withholds goes again.
            if old.lock == .locked { keys.dropCompleteClasses() }
            state.keys[account.key] = keys
            state.accounts[index].keyIDs = Self.keyIDs(of: old.stored)
            state.accounts[index].nameTag = keys.nameKey?.tag
            let earlier = keys.earlierNameKeys.map(\.tag)
            state.accounts[index].earlierNameTags = earlier.isEmpty ? nil : earlier
            state.accounts[index].reprotectPending = true
            return (state.accounts[index], accountsSnapshot(state))
        }
        try files.save(snapshot)
        nameKeyInstalled(account.key, appeared: false)
        var details = ["generation": "\(updated.currentGeneration ?? 0)", "generations": "\((updated.generations?.count ?? 0) + 1)"]
        if let host { details["importedFrom"] = host }
        events.emit(.keysRotated, identity: rotated.upn,
                    "\(rotated.upn) has \(host.map { "the new keys of host \($0)" } ?? "new keys"); its files are being brought to them", details: details)
        for volume in volumes { volume.keysRotated(rotated) }
        return rotated
    }
}
