import CustodyCrypto
import FoundationEssentials

/// The login password as a second key to an identity (see `KeyProtector`): set up by its owner,
/// used by the PAM module at login (`session open`), rewrapped when the password changes
/// (`chauthtok`). The identity's passphrase stays as it was.
extension Engine {
    /// Adds (or replaces) the login protector of `identity` under its owner's login `password`.
    /// The identity must be unlocked (its class keys in memory) and belong to a local user.
    public func addLoginProtector(_ identity: String, password: SecretBytes) throws(EngineError) {
        let account = try self.account(identity)
        guard let uid = account.uid else { throw .noLocalUser(account.upn) }
        let (stored, keys) = try unlockedKeybag(of: account)
        var updated = stored
        updated.loginProtector = try loginProtector(stored, keys: keys, password: password, uid: uid, machineSecret: try machineSecret(of: account),
                                                    file: files.path(files.keybagName(account.id)))
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "login protector set for \(account.upn)", details: ["protector": "login"])
    }

    /// Removes the login protector of `identity` (the passphrase still unlocks it).
    public func removeLoginProtector(_ identity: String) throws(EngineError) {
        let account = try self.account(identity)
        guard var stored = state.withLock({ $0.keys[account.key]?.stored }) else { throw missingKeys(account) }
        guard stored.loginProtector != nil else { return }
        stored.loginProtector = nil
        try saveKeybag(stored, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "login protector removed for \(account.upn)", details: ["protector": "login"])
    }

    /// What a login did to the user's identities.
    public struct LoginOutcome: Codable, Equatable, Sendable {
        public var unlocked: [String] = []
        /// Identities with a login protector that stayed locked (a wrong password, rate limited).
        public var stillLocked: [String] = []
        /// Identities that got a login protector now (`addProtectors`).
        public var protected: [String] = []
    }

    /// A login of local user `uid` with `password` (checked by the system already, as PAM does):
    /// each identity of the user with a login protector unlocks with it (a lock still in its
    /// grace period is called off); with `addProtectors`, unlocked identities without one get one.
    public func login(uid: UInt32, password: SecretBytes, addProtectors: Bool = false) -> LoginOutcome {
        var outcome = LoginOutcome()
        for account in accounts(ofUser: uid) {
            let stored = state.withLock { $0.keys[account.key]?.stored }
            guard let stored else { continue }
            if stored.loginProtector == nil {
                if addProtectors, (try? addLoginProtector(account.id, password: password)) != nil { outcome.protected.append(account.upn) }
                continue
            }
            if (try? cancelPendingLock(account.id)) == true || (try? lockStatus(account.id)) == .unlocked {
                outcome.unlocked.append(account.upn)
                continue
            }
            do {
                try unlock(account.id, using: .login(password))
                outcome.unlocked.append(account.upn)
            } catch {
                outcome.stillLocked.append(account.upn)
            }
        }
        return outcome
    }

    /// The login password of `uid` changed: every login protector of the user is rewrapped under
    /// `new`, with the keys of an unlocked identity, or those `old` unwraps (root changes a
    /// password without giving the old one). Returns the identities rewrapped and those left
    /// with a stale protector (locked, and no right old password).
    public func loginPasswordChanged(uid: UInt32, old: SecretBytes?, new: SecretBytes) -> (rewrapped: [String], stale: [String]) {
        var rewrapped: [String] = [], stale: [String] = []
        for account in accounts(ofUser: uid) {
            guard let (stored, inMemory) = keybag(of: account), let protector = stored.loginProtector,
                  let secret = try? machineSecret(of: account) else { continue }
            let file = files.path(files.keybagName(account.id))
            // The keys held in memory when unlocked; else those the old password unwraps.
            let keys = inMemory.isComplete ? inMemory
                : old.flatMap { try? Keybags.unlock(protector.keybag(of: stored), machineSecret: secret, passphrase: $0, file: file) }
            guard let keys, let fresh = try? loginProtector(stored, keys: keys, password: new, uid: protector.uid, machineSecret: secret, file: file) else {
                stale.append(account.upn)
                continue
            }
            var updated = stored
            updated.loginProtector = fresh
            if (try? saveKeybag(updated, of: account)) != nil { rewrapped.append(account.upn) } else { stale.append(account.upn) }
        }
        if !rewrapped.isEmpty || !stale.isEmpty {
            events.emit(.passphraseChanged, "login password of uid \(uid) changed: \(rewrapped.count) protector(s) rewrapped, \(stale.count) stale",
                        details: ["uid": "\(uid)", "rewrapped": "\(rewrapped.count)", "stale": "\(stale.count)"])
        }
        return (rewrapped, stale)
    }

    /// The stored keybag of `account` and the class keys held now (all three only while unlocked).
    func keybag(of account: Account) -> (StoredKeybag, ClassKeys)? {
        state.withLock { state in
            state.keys[account.key].map { ($0.stored, $0.unlockedClassKeys) }
        }
    }

    /// The same, for a change that needs every class key: `locked` unless unlocked.
    func unlockedKeybag(of account: Account) throws(EngineError) -> (StoredKeybag, ClassKeys) {
        guard let (stored, keys) = keybag(of: account) else { throw missingKeys(account) }
        guard keys.isComplete else { throw .locked(account.upn, .complete) }
        return (stored, keys)
    }
}
