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
        updated.recoveryProtector = try Keybags.protector(stored, keys: keys, password: recovery.digits, uid: 0, cost: settings.passphraseCost,
                                                          machineKey: machineKey, file: files.path(Self.keybagName(account.id)))
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "recovery key created for \(account.upn)\(escrow == nil ? "" : ", escrowed")",
                    details: ["protector": "recovery", "escrowed": "\(escrow != nil)"])
        return (recovery, escrow)
    }

    /// Removes the recovery key of `identity`.
    public func removeRecoveryKey(_ identity: String) throws(EngineError) {
        let account = try self.account(identity)
        guard var stored = state.withLock({ $0.keys[Account.canonical(account.id)]?.stored }) else { throw .notEnrolled(account.upn) }
        guard stored.recoveryProtector != nil else { return }
        stored.recoveryProtector = nil
        try saveKeybag(stored, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "recovery key removed for \(account.upn)", details: ["protector": "recovery"])
    }

    /// Unlocks `identity` with its recovery key and, with `newPassphrase`, replaces its passphrase
    /// (nil there keeps it; `removePassphrase` leaves it without one).
    public func recover(_ identity: String, with recovery: RecoveryKey, newPassphrase: SecretBytes?, removePassphrase: Bool = false) throws(EngineError) {
        let account = try self.account(identity)
        try unlock(account.id, using: .recovery(recovery))
        guard newPassphrase != nil || removePassphrase else { return }
        let (stored, keys) = try unlockedKeybag(of: account)
        let updated = try Keybags.rewrap(stored, keys: keys, newPassphrase: newPassphrase, cost: settings.passphraseCost,
                                         machineKey: machineKey, file: files.path(Self.keybagName(account.id)))
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "passphrase of \(account.upn) reset with its recovery key", details: ["protector": "recovery"])
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
