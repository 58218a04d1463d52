import CustodyCrypto
import CustodySystem
import FoundationEssentials

/// Recovery keys: a printable key that unlocks an identity and lets its passphrase be reset when
/// the passphrase is lost (another wrap of its class keys, a `KeyProtector`), and its escrow to
/// an administrator's public key. A wipe destroys the keybag and with it every wrap: an escrowed
/// recovery key then opens nothing.
extension Engine {
    /// Makes a new recovery key for `identity` (replacing any earlier one), which must be unlocked.
    /// Returns the key (to show once) and, with `escrowTo`, the key sealed to that public key.
    public func createRecoveryKey(_ identity: String, escrowTo publicKey: [UInt8]? = nil) throws(EngineError) -> (key: RecoveryKey, escrow: EscrowedRecoveryKey?) {
        let account = try self.account(identity)
        let (stored, keys) = try unlockedKeybag(of: account)
        let recovery = try RecoveryKey.generate()
        var escrow: EscrowedRecoveryKey?
        if let publicKey {
            escrow = try seal(recovery, of: account, to: publicKey)
        }
        var updated = stored
        // Independent of the machine key (and holding class D), so that it still opens the
        // identity when the machine key is lost; the key's ~133 bits make guessing it hopeless.
        let classD = state.withLock { $0.keys[account.key]?.rootClassD }
        updated.recoveryProtector = try Keybags.protector(stored, keys: keys, password: recovery.digits, uid: 0, cost: settings.passphraseCost,
                                                          machineSecret: nil, independentWith: classD, file: files.path(files.keybagName(account.id)))
        try saveKeybag(updated, of: account)
        try wrapStateKey(for: account, under: recovery)
        events.emit(.passphraseChanged, identity: account.upn, "recovery key created for \(account.upn)\(escrow == nil ? "" : ", escrowed")",
                    details: ["protector": "recovery", "escrowed": "\(escrow != nil)"])
        return (recovery, escrow)
    }

    /// The same key opens the state directory when no machine key does (`StateSeal`).
    private func wrapStateKey(for account: Account, under recovery: RecoveryKey) throws(EngineError) {
        try files.seal?.addRecoveryWrap(of: account.id, recoveryKey: recovery.digits, cost: settings.passphraseCost)
        state.withLock { $0.problems.removeAll { $0.kind == .recoveryKeyOutdated && $0.identity == account.id } }
    }

    /// Removes the recovery key of `identity`.
    public func removeRecoveryKey(_ identity: String) throws(EngineError) {
        let account = try self.account(identity)
        guard var stored = state.withLock({ $0.keys[account.key]?.stored }) else { throw missingKeys(account) }
        guard stored.recoveryProtector != nil else { return }
        stored.recoveryProtector = nil
        try saveKeybag(stored, of: account)
        try files.seal?.removeRecoveryWrap(of: account.id)
        events.emit(.passphraseChanged, identity: account.upn, "recovery key removed for \(account.upn)", details: ["protector": "recovery"])
    }

    /// Unlocks `identity` with its recovery key and, with `newPassphrase`, replaces its passphrase
    /// (nil there keeps it; `removePassphrase` leaves it without one).
    /// An identity whose machine key is lost (a cleared TPM, a state directory from another
    /// machine, after `resetMachineKey`) is rebuilt on the current machine key: it needs a new
    /// passphrase (or `removePassphrase`), as the old passphrase's wrap needed the lost key, and
    /// loses its login protector (set up again at the next login).
    /// While the state directory is sealed (no machine key opens it), the recovery key opens it
    /// first: then every account is known again, and the others recover with their own keys.
    public func recover(_ identity: String, with recovery: RecoveryKey, newPassphrase: SecretBytes?, removePassphrase: Bool = false) throws(EngineError) {
        try unsealState(with: recovery)
        let account = try self.account(identity)
        if state.withLock({ $0.stranded[account.key] }) != nil {
            return try recoverStranded(account, with: recovery, newPassphrase: newPassphrase, removePassphrase: removePassphrase)
        }
        try unlock(account.id, using: .recovery(recovery))
        // A key made before the state was sealed opens it from now on too.
        if files.seal?.hasRecoveryWrap(of: account.id) == false { try wrapStateKey(for: account, under: recovery) }
        guard newPassphrase != nil || removePassphrase else { return }
        let (stored, keys) = try unlockedKeybag(of: account)
        let updated = try rewrapPassphrase(stored, keys: keys, newPassphrase: newPassphrase, machineSecret: try machineSecret(of: account),
                                           file: files.path(files.keybagName(account.id)))
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "passphrase of \(account.upn) reset with its recovery key", details: ["protector": "recovery"])
    }

    private func recoverStranded(_ account: Account, with recovery: RecoveryKey, newPassphrase: SecretBytes?, removePassphrase: Bool) throws(EngineError) {
        let name = files.keybagName(account.id), file = files.path(name)
        let key = account.key
        guard let stored = try files.read(StoredKeybag.self, from: name) else { throw .corruptState(file: file, reason: "enrolled account \(account.id) has no keybag") }
        let reason = state.withLock { $0.stranded[key] } ?? "the machine key is lost"
        guard let protector = stored.recoveryProtector else { throw .noRecoveryKey(account.upn) }
        guard protector.independent == true else {
            throw .machineKeyUnavailable("\(account.upn): \(reason); its recovery key also needs that machine key (it was made before recovery keys stood alone)")
        }
        if stored.passphrase != nil, newPassphrase == nil, !removePassphrase {
            throw .passphraseRequired("\(account.upn) (its machine key is lost, and with it the wrap of its passphrase: give a new passphrase, which may be the old one)")
        }
        let current = try machineKeys.current()
        let view = protector.keybag(of: stored)
        let user = try Keybags.userKey(view, machineSecret: nil, passphrase: recovery.digits)
        let keys: ClassKeys, classD: ClassKeyEntry
        do {
            keys = try Keybags.unlock(view, with: user, file: file)
            classD = try Keybags.unwrapKey(view, .none, with: user, file: file)
        } catch .wrongPassphrase {
            events.emit(.unlockFailed, identity: account.upn, "wrong recovery key for \(account.upn)", details: ["protector": "recovery"])
            throw .wrongPassphrase(account.upn)
        }
        // A fresh machine secret on the current machine key; the keys themselves stay, so every
        // file of the identity opens as before.
        let secret: SecretBytes
        do { secret = try SecretBytes.random(count: 32) } catch { throw .crypto(error) }
        var rebuilt = try Keybags.bind(stored, secret: secret, to: current)
        rebuilt.loginProtector = nil
        rebuilt = try rewrapPassphrase(rebuilt, keys: keys, newPassphrase: newPassphrase, machineSecret: secret, file: file)
        guard let dStored = stored[.none] else { throw .corruptState(file: file, reason: "class D key is missing") }
        rebuilt[.none] = .init(id: dStored.id, wrapped: try Keybags.wrap(classD.key.secret, identity: stored.identity, .none, id: dStored.id,
                                                                       with: try Keybags.classDKey(rebuilt, machineSecret: secret)))
        var identityKeys = try Keyring.load(rebuilt, machineSecret: secret, file: file)
        identityKeys.install(keys)
        state.withLock { state in
            state.keys[key] = identityKeys
            state.stranded[key] = nil
        }
        nameKeyInstalled(key)
        try saveKeybag(rebuilt, of: account)
        try finishMachineKeyMigration()
        events.emit(.passphraseChanged, identity: account.upn, "\(account.upn) recovered onto machine key \(current.id) with its recovery key",
                    details: ["protector": "recovery", "machineKey": current.id])
        events.emit(.unlocked, identity: account.upn, "unlocked \(account.upn)", details: ["cause": "recovery"])
    }

    private func seal(_ recovery: RecoveryKey, of account: Account, to publicKey: [UInt8]) throws(EngineError) -> EscrowedRecoveryKey {
        let content = EscrowContent(accountID: account.id, upn: account.upn, recoveryKey: recovery.printable)
        var json: [UInt8]
        do { json = Array(try JSONEncoder().encode(content)) } catch { throw .crypto(.library("cannot encode the escrow")) }
        defer { for index in json.indices { json[index] = 0 } }
        do {
            let secret = try json.withBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) }
            let sealed = try SealedBox.seal(secret, to: publicKey)
            return EscrowedRecoveryKey(accountID: account.id, upn: account.upn, created: wallClockSeconds(),
                                       publicKey: Data(publicKey).base64EncodedString(), sealed: Data(sealed).base64EncodedString())
        } catch {
            throw .crypto(error)
        }
    }
}
