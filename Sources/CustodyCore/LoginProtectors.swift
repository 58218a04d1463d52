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
        guard let uid = account.uid else { throw .invalidIdentity("\(account.upn) belongs to no local user (enroll it with --user)") }
        let key = Account.canonical(account.id)
        let name = Self.keybagName(account.id)
        guard let (stored, keys) = state.withLock({ state -> (StoredKeybag, ClassKeys)? in
            guard let identityKeys = state.keys[key] else { return nil }
            return (identityKeys.stored, identityKeys.unlockedClassKeys)
        }) else { throw .notEnrolled(account.upn) }
        guard keys.isComplete else { throw .locked(account.upn, .complete) }
        var updated = stored
        updated.loginProtector = try Keybags.loginProtector(stored, keys: keys, password: password, uid: uid, cost: settings.passphraseCost,
                                                            machineKey: machineKey, file: files.path(name))
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, "login protector set for \(account.upn)", details: ["protector": "login"])
    }

    /// Removes the login protector of `identity` (the passphrase still unlocks it).
    public func removeLoginProtector(_ identity: String) throws(EngineError) {
        let account = try self.account(identity)
        guard var stored = state.withLock({ $0.keys[Account.canonical(account.id)]?.stored }) else { throw .notEnrolled(account.upn) }
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
            let stored = state.withLock { $0.keys[Account.canonical(account.id)]?.stored }
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
    /// `new`, with the keys unwrapped by `old` or, when it is not given (root changed the
    /// password), those of an unlocked identity. Returns the identities rewrapped and those left
    /// with a stale protector (locked, and no right old password).
    public func loginPasswordChanged(uid: UInt32, old: SecretBytes?, new: SecretBytes) -> (rewrapped: [String], stale: [String]) {
        var rewrapped: [String] = [], stale: [String] = []
        for account in accounts(ofUser: uid) {
            let key = Account.canonical(account.id)
            guard let (stored, inMemory) = state.withLock({ state -> (StoredKeybag, ClassKeys)? in
                guard let keys = state.keys[key] else { return nil }
                return (keys.stored, keys.unlockedClassKeys)
            }), let protector = stored.loginProtector else { continue }
            let file = files.path(Self.keybagName(account.id))
            var keys: ClassKeys? = inMemory.isComplete ? inMemory : nil
            if let old, let unwrapped = try? Keybags.unlock(protector.keybag(of: stored), machineKey: machineKey, passphrase: old, file: file) {
                keys = unwrapped
            }
            guard let keys, var updated = Optional(stored),
                  let fresh = try? Keybags.loginProtector(stored, keys: keys, password: new, uid: protector.uid, cost: settings.passphraseCost,
                                                          machineKey: machineKey, file: file) else {
                stale.append(account.upn)
                continue
            }
            updated.loginProtector = fresh
            if (try? saveKeybag(updated, of: account)) != nil { rewrapped.append(account.upn) } else { stale.append(account.upn) }
        }
        if !rewrapped.isEmpty || !stale.isEmpty {
            events.emit(.passphraseChanged, "login password of uid \(uid) changed: \(rewrapped.count) protector(s) rewrapped, \(stale.count) stale",
                        details: ["uid": "\(uid)", "rewrapped": "\(rewrapped.count)", "stale": "\(stale.count)"])
        }
        return (rewrapped, stale)
    }

    /// Writes a keybag and keeps it in memory.
    func saveKeybag(_ stored: StoredKeybag, of account: Account) throws(EngineError) {
        let key = Account.canonical(account.id)
        try files.write(stored, to: Self.keybagName(account.id))
        try state.withLock { (state) throws(EngineError) in
            state.keys[key]?.stored = stored
            if let index = state.accounts.firstIndex(where: { $0.matches(account.id) }) {
                state.accounts[index].hasLoginProtector = stored.loginProtector != nil
                state.accounts[index].hasRecoveryKey = stored.recoveryProtector != nil
                try files.write(AccountsFile(accounts: state.accounts), to: "accounts.json")
            }
        }
    }
}

extension Engine.IdentityKeys {
    /// The class keys held now (all three only while unlocked).
    var unlockedClassKeys: ClassKeys {
        ClassKeys(complete: classA, completeUnlessOpenPrivate: classBPrivate, untilFirstAuthentication: classC)
    }
}

extension ClassKeys {
    var isComplete: Bool { complete != nil && completeUnlessOpenPrivate != nil && untilFirstAuthentication != nil }
}
