import CustodyCrypto
import FoundationEssentials

/// Moving keybags between machine keys: to the TPM and back, to a fresh key (rotation), and
/// onto a new key after the old one was lost. Each keybag is rewritten on its own (atomically),
/// and a key is destroyed only once no keybag names it, so a daemon stopped at any point comes
/// back with every identity unlockable and finishes the move (`finishMachineKeyMigration`).
extension Engine {
    /// Where keys of a new state directory go for `mode`.
    static func storeForNewKeys(_ mode: MachineKeyMode, sealer: MachineKeySealer?) throws(EngineError) -> MachineKeyStore {
        switch mode {
        case .file: return .file
        case .tpm2:
            guard sealer != nil else { throw .machineKeyUnavailable("machine-key = \"tpm2\", and no TPM answers at the configured TCTI") }
            return .tpm2
        case .auto: return sealer == nil ? .file : .tpm2
        }
    }

    /// A keybag's machine secret, from the machine key it names.
    static func machineSecret(_ stored: StoredKeybag, keys: MachineKeys, file: String) throws(EngineError) -> SecretBytes {
        try Keybags.machineSecret(stored, machine: try keys.key(stored.machineKeyID), file: file)
    }

    /// The machine secret of an enrolled identity's keybag (held since the daemon started).
    func machineSecret(of account: Account) throws(EngineError) -> SecretBytes {
        try state.withLock { (state) throws(EngineError) -> SecretBytes in
            guard let keys = state.keys[account.key] else { throw missingKeys(account, state) }
            return keys.machineSecret
        }
    }

    /// Why an account has no keys: its machine key cannot be had, or it is not enrolled.
    func missingKeys(_ account: Account, _ state: State) -> EngineError {
        missingKeys(account.key, upn: account.upn, state)
    }

    func missingKeys(_ key: IdentityKey, upn: String, _ state: State) -> EngineError {
        if let reason = state.stranded[key] {
            return .machineKeyUnavailable("\(upn): \(reason); recover it with its recovery key (custodyctl recover)")
        }
        if let reason = state.unusable[key] { return .keysUnavailable("\(upn) is unavailable: \(reason)") }
        return .notEnrolled(upn)
    }

    func missingKeys(_ account: Account) -> EngineError { state.withLock { missingKeys(account, $0) } }

    /// Moves every keybag not yet on the current machine key onto it (rewrapping its machine
    /// secret only: no passphrase is needed) and destroys the keys no keybag names any more.
    /// Keybags whose key cannot be had are left as they are, and so is their key. Returns how
    /// many keybags moved.
    @discardableResult
    func finishMachineKeyMigration() throws(EngineError) -> Int {
        // Sealed state (no key opens it) names no keybag to move; nothing is dropped.
        guard sealedState == nil, let current = try? machineKeys.current() else { return 0 }
        try files.seal?.wrap(under: current)
        // With one key, every keybag is on it: nothing to read.
        guard machineKeys.count > 1 else { return 0 }
        var moved = 0
        var referenced: Set<String?> = [current.id]
        for name in files.list("keybags").sorted() where name.hasSuffix(".json") && !name.contains(".tmp-") {
            let relative = "keybags/" + name
            // Under `keybagWrites`: saveKeybag writes under it too, so neither overwrites the other.
            let didMove = try keybagWrites.withLock { (_) throws(EngineError) -> Bool in
                guard let stored = try files.read(StoredKeybag.self, from: relative) else { return false }
                if stored.machineKeyID == current.id, stored.machineSecret != nil { return false }
                let secret: SecretBytes
                do throws(EngineError) {
                    secret = try Self.machineSecret(stored, keys: machineKeys, file: files.path(relative))
                } catch .machineKeyUnavailable {
                    referenced.insert(stored.machineKeyID)
                    return false
                }
                let updated = try Keybags.bind(stored, secret: secret, to: current)
                try files.write(updated, to: relative)
                state.withLock { $0.keys[IdentityKey(stored.identity)]?.stored = updated }
                return true
            }
            if didMove { moved += 1 }
        }
        try machineKeys.dropUnreferenced(referenced)
        return moved
    }

    /// Moves the machine key to `store` (a fresh key: a copy of the old one opens nothing once
    /// the move is done), sealed with `pcrs` in a TPM (nil: the configured `tpm2-pcrs`). Moving
    /// to the store the key is in already rotates it.
    @discardableResult
    public func migrateMachineKey(to store: MachineKeyStore, pcrs: [Int]? = nil) throws(EngineError) -> MachineKeyStatus {
        let old = try machineKeys.current()
        let new = try machineKeys.create(store, pcrs: pcrs ?? settings.tpm2PCRs)
        let moved = try finishMachineKeyMigration()
        events.emit(.machineKeyChanged, "machine key moved to \(store.rawValue) (\(old.id) → \(new.id)); \(moved) keybag(s) rewrapped",
                    details: ["store": store.rawValue, "from": old.id, "to": new.id, "keybags": "\(moved)"])
        return machineKeyStatus()
    }

    /// Replaces a machine key that cannot be had (a cleared TPM, another machine's state) with a
    /// new one, so that new identities can enroll and stranded ones can be recovered onto it
    /// with their recovery keys. Refused while the current key is there (use `migrateMachineKey`).
    @discardableResult
    public func resetMachineKey() throws(EngineError) -> MachineKeyStatus {
        if let current = try? machineKeys.current() {
            throw .machineKeyInUse(current.id)
        }
        let old = machineKeys.currentID ?? "none"
        let new = try machineKeys.create(try Self.storeForNewKeys(settings.machineKey, sealer: machineKeys.sealer), pcrs: settings.tpm2PCRs)
        try files.seal?.wrap(under: new)
        let stranded = state.withLock { $0.stranded.count }
        events.emit(.machineKeyChanged, "machine key \(old) replaced by a new one (\(new.id)); \(stranded) identit\(stranded == 1 ? "y needs" : "ies need") recovery",
                    details: ["from": old, "to": new.id, "stranded": "\(stranded)"])
        return machineKeyStatus()
    }

    /// The machine key's store, IDs, problems and the identities that cannot be opened; with
    /// `counter`, also the TPM's dictionary-attack counter (a round trip to the TPM).
    public func machineKeyStatus(counter: Bool = true) -> MachineKeyStatus {
        var status = machineKeys.status
        if counter, status.store == .tpm2 { status.dictionaryAttack = machineKeys.sealer?.dictionaryAttack }
        let (stranded, sealed) = state.withLock { state in
            (state.stranded.keys.compactMap { key in state.accounts.first { $0.key == key }?.upn }.sorted(), state.sealed)
        }
        status.stranded = stranded
        if let sealed {
            status.problem = sealed + "; its identities are unknown until one is recovered with its recovery key"
        }
        if status.store == .file {
            status.warning = "the machine key is a file in the state directory: a copy of the disk can be attacked offline at Argon2id's speed"
                + (machineKeys.sealer == nil ? " (no TPM)" : "; a TPM is present: custodyctl machine-key migrate --to tpm2")
        }
        return status
    }
}
