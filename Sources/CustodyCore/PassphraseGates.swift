import CustodyCrypto
import FoundationEssentials

/// Passphrase gates: while the machine key is in the TPM, a passphrase (and a login password)
/// is first tried against a small object sealed in the TPM whose authorization value comes from
/// it, without the noDA attribute. A wrong one then counts against the TPM's own
/// dictionary-attack lockout as well as the engine's back-off (UnlockAttempts.swift), and while
/// the TPM is locked out even the right one waits. The gate rate-limits guessing on the running
/// machine; it is no part of any key, so a gate that cannot be used (the key moved to a file, no
/// TPM) is ignored and made again at the next right unlock.
extension Engine {
    static let gateInfo = "custody/v2/tpm-gate"

    /// The authorization value for a gate: HKDF of the secret, bound to the keybag (or
    /// protector) salt and the identity. It never leaves the process except into the TPM, over
    /// a salted, encrypted session.
    static func gateAuthorization(_ secret: SecretBytes, salt: Data, identity: String) throws(EngineError) -> SecretBytes {
        do {
            return try HKDF.derive(.sha256, key: secret, salt: Array(salt), info: Array("\(gateInfo)|\(identity)".utf8), count: 32)
        } catch {
            throw .crypto(error)
        }
    }

    /// A new gate for `secret`, when the machine key is sealed to a TPM that makes them.
    func makeGate(_ secret: SecretBytes?, salt: Data, identity: String) -> Data? {
        guard let secret, let sealer = machineKeys.sealer, machineKeys.currentStore == .tpm2,
              let authorization = try? Self.gateAuthorization(secret, salt: salt, identity: identity) else { return nil }
        return sealer.makeGate(authorization: authorization)
    }

    /// Tries `gate` with `secret`; true when it must be made again (it could not be used).
    /// A wrong secret is counted (and refused); a TPM lockout is refused as rate limited.
    func passGate(_ gate: Data?, secret: SecretBytes?, salt: Data, account: Account, what: String) throws(EngineError) -> Bool {
        guard let sealer = machineKeys.sealer, let secret else { return gate == nil }
        guard let gate else { return true }
        let answer = sealer.openGate(gate, authorization: try Self.gateAuthorization(secret, salt: salt, identity: account.key.folded))
        switch answer {
        case .open:
            return false
        case .wrong:
            let (failures, wait) = recordFailedUnlock(account, what: what + " (counted by the TPM too)")
            // Where wrong attempts end in a wipe, the count left matters more than the wait.
            let wipes = settings.maxUnlockAttempts > 0 && settings.unlockAttemptsAction == "wipe"
            if wait > 0, !wipes { throw .rateLimited(account.upn, retryAfterSeconds: wait) }
            throw wrongCredential(account, naming: account.upn, failures: failures)
        case .lockedOut(let seconds):
            events.emit(.unlockFailed, identity: account.upn, "the TPM is in dictionary-attack lockout: \(account.upn) cannot be unlocked for now",
                        details: ["tpmLockout": "true", "retryAfterSeconds": "\(seconds)"])
            throw .rateLimited(account.upn + " (the TPM's dictionary-attack lockout)", retryAfterSeconds: seconds)
        case .unusable:
            return true
        }
    }

    /// `stored` with its passphrase wrapped anew for `newPassphrase` (nil: none) and a gate for
    /// it. The two change together: a gate left for the old passphrase would refuse the new one.
    func rewrapPassphrase(_ stored: StoredKeybag, keys: ClassKeys, newPassphrase: SecretBytes?, machineSecret: SecretBytes,
                          file: String) throws(EngineError) -> StoredKeybag {
        var updated = try Keybags.rewrap(stored, keys: keys, newPassphrase: newPassphrase, cost: settings.passphraseCost,
                                         machineSecret: machineSecret, file: file)
        updated.passphraseGate = makeGate(newPassphrase, salt: updated.salt, identity: updated.identity)
        return updated
    }

    /// A login protector for `keys` under `password`, with its gate (the same pairing).
    func loginProtector(_ stored: StoredKeybag, keys: ClassKeys, password: SecretBytes, uid: UInt32, machineSecret: SecretBytes,
                        file: String) throws(EngineError) -> KeyProtector {
        var protector = try Keybags.protector(stored, keys: keys, password: password, uid: uid, cost: settings.passphraseCost,
                                              machineSecret: machineSecret, file: file)
        protector.gate = makeGate(password, salt: protector.salt, identity: stored.identity)
        return protector
    }

    /// The keybag with a fresh gate for the passphrase that unlocked it, or for the login
    /// password of its protector; nil when there is nothing to change.
    func regated(_ stored: StoredKeybag, credential: Credential) -> StoredKeybag? {
        var updated = stored
        switch credential {
        case .passphrase(let passphrase):
            guard let gate = makeGate(passphrase, salt: stored.salt, identity: stored.identity) else { return nil }
            updated.passphraseGate = gate
        case .login(let password):
            guard let protector = stored.loginProtector,
                  let gate = makeGate(password, salt: protector.salt, identity: stored.identity) else { return nil }
            updated.loginProtector?.gate = gate
        case .recovery:
            return nil
        }
        return updated
    }
}
