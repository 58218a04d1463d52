import CustodyCrypto
import CustodyFormat
import FoundationEssentials

/// The lock state machine: lock needs no passphrase and takes effect after the grace period;
/// unlock needs the passphrase (when one is set) and is rate-limited after wrong ones.
extension Engine {
    /// The lock state of an enrolled identity.
    public func lockStatus(_ identity: String) throws(EngineError) -> LockStatus {
        processDeadlines()
        let account = try self.account(identity)
        let now = clock.now()
        return try state.withLock { (state) throws(EngineError) -> LockStatus in
            guard let keys = state.keys[account.key] else { throw missingKeys(account, state) }
            switch keys.lock {
            case .locked: return .locked
            case .unlocked: return .unlocked
            case .locking(let until): return .locking(remaining: max(0, until - now))
            }
        }
    }

    /// Whether class C is available (the identity was unlocked at least once since the daemon started).
    public func hasBeenUnlocked(_ identity: String) throws(EngineError) -> Bool {
        let account = try self.account(identity)
        return state.withLock { $0.keys[account.key]?.classC != nil }
    }

    /// Requests a lock. Class A keys (and open class A files) go when the grace period ends (at
    /// once with `immediately`, as before a suspend); the class B private key too (open class B
    /// files keep working). `cause` says why, in the events: manual, sessionLock, suspend, logout.
    public func lock(_ identity: String, cause: LockCause = .manual, immediately: Bool = false) throws(EngineError) {
        let account = try self.account(identity)
        let grace = immediately ? 0 : settings.lockGracePeriod
        let deadline = clock.now() + grace
        let requested = try state.withLock { (state) throws(EngineError) -> Bool in
            let key = account.key
            guard var keys = state.keys[key] else { throw missingKeys(account, state) }
            switch keys.lock {
            case .locked: return false
            case .locking(let until) where until <= deadline: return false
            case .locking, .unlocked: break
            }
            keys.lock = .locking(until: deadline)
            state.keys[key] = keys
            if deadline < Double(bitPattern: earliestLockDeadline.load(ordering: .acquiring)) {
                earliestLockDeadline.store(deadline.bitPattern, ordering: .releasing)
            }
            return true
        }
        if requested {
            pokeDeadlineTimer()
            for volume in volumes { volume.lockRequested(account) }
            events.emit(.lockRequested, identity: account.upn, "lock requested for \(account.upn) (\(cause.rawValue)); class A keys go in \(grace) s",
                        details: ["gracePeriod": "\(grace)", "cause": cause.rawValue])
        }
        processDeadlines()
    }

    /// A lock still in its grace period is called off (the keys never left): the user came back
    /// in time, as on iOS. True when one was.
    @discardableResult
    public func cancelPendingLock(_ identity: String) throws(EngineError) -> Bool {
        processDeadlines()
        let account = try self.account(identity)
        let cancelled = state.withLock { state -> Bool in
            let key = account.key
            guard var keys = state.keys[key], case .locking = keys.lock else { return false }
            keys.lock = .unlocked
            state.keys[key] = keys
            return true
        }
        if cancelled { events.emit(.unlocked, identity: account.upn, "lock of \(account.upn) called off within the grace period", details: ["cause": "graceCancelled"]) }
        return cancelled
    }

    /// Locks every enrolled identity.
    public func lockAll() {
        for account in accounts() where account.isEnrolled { try? lock(account.id) }
    }

    /// What unlocks an identity: its passphrase (nil when it has none), or its owner's login
    /// password through the login protector.
    public enum Credential {
        case passphrase(SecretBytes?)
        case login(SecretBytes)
        case recovery(RecoveryKey)
    }

    /// Unlocks with the passphrase (nil for an identity that has none). A wrong passphrase fails
    /// with `wrongPassphrase`; after three in a row, attempts wait (see UnlockAttempts.swift).
    public func unlock(_ identity: String, passphrase: SecretBytes?) throws(EngineError) {
        try unlock(identity, using: .passphrase(passphrase))
    }

    /// Unlocks with a credential; wrong ones count against the same limit, whichever kind.
    public func unlock(_ identity: String, using credential: Credential) throws(EngineError) {
        let account = try self.account(identity)
        let key = account.key
        let now = clock.now()
        let (stored, machineSecret) = try state.withLock { (state) throws(EngineError) -> (StoredKeybag, SecretBytes) in
            guard let keys = state.keys[key] else { throw missingKeys(account, state) }
            if keys.retryAt > now { throw .rateLimited(account.upn, retryAfterSeconds: keys.retryAt - now) }
            return (keys.stored, keys.machineSecret)
        }
        // What unwraps the keys, what it is called, and its gate in the TPM (none for a recovery key).
        let (view, secret): (StoredKeybag, SecretBytes?)
        let what: String
        var bound: SecretBytes? = machineSecret
        var gate: (sealed: Data?, salt: Data)?
        switch credential {
        case .passphrase(let passphrase):
            (view, secret, what) = (stored, passphrase, "passphrase")
            gate = (stored.passphraseGate, stored.salt)
        case .login(let password):
            guard let protector = stored.loginProtector else { throw .passphraseRequired(account.upn) }
            (view, secret, what) = (protector.keybag(of: stored), password, "login password")
            gate = (protector.gate, protector.salt)
        case .recovery(let recovery):
            guard let protector = stored.recoveryProtector else { throw .noRecoveryKey(account.upn) }
            (view, secret, what) = (protector.keybag(of: stored), recovery.digits, "recovery key")
            if protector.independent == true { bound = nil }
        }
        let regate = try gate.map { (gate) throws(EngineError) in
            try passGate(gate.sealed, secret: secret, salt: gate.salt, account: account, what: what)
        } ?? false
        // Argon2id runs outside the lock: a slow unlock does not hold up other requests.
        let unlocked: ClassKeys
        do {
            unlocked = try Keybags.unlock(view, machineSecret: bound, passphrase: secret, file: files.path(files.keybagName(account.id)))
        } catch {
            if case .wrongPassphrase(let who) = error {
                let (failures, _) = recordFailedUnlock(account, what: what)
                throw wrongCredential(account, naming: who, failures: failures)
            }
            throw error
        }
        clearFailedUnlocks(key)
        let appeared = state.withLock { state -> Bool in
            let held = state.keys[key]?.nameKey != nil
            state.keys[key]?.install(unlocked)
            return !held
        }
        nameKeyInstalled(key, appeared: appeared)
        // A gate made before (or on another TPM) is made again now that the secret is known right.
        if regate, let current = state.withLock({ $0.keys[key]?.stored }), let updated = regated(current, credential: credential) {
            try? saveKeybag(updated, of: account)
        }
        if case .login = credential {
            events.emit(.unlocked, identity: account.upn, "unlocked \(account.upn) at login", details: ["cause": "login"])
        } else {
            let cause: String
            switch credential {
            case .recovery: cause = "recovery"
            case .passphrase(let passphrase): cause = passphrase == nil ? "noPassphrase" : "passphrase"
            case .login: cause = "login"
            }
            events.emit(.unlocked, identity: account.upn, "unlocked \(account.upn)", details: ["cause": cause])
        }
        if let unlocked = try? self.account(account.id), unlocked.reprotectPending {
            for volume in volumes { volume.unlocked(unlocked) }
        }
    }

    /// Unlocks every identity that has no passphrase; returns those that still need one.
    @discardableResult
    public func unlockAll() -> [String] {
        var stillLocked: [String] = []
        for account in accounts() where account.isEnrolled {
            if account.hasPassphrase {
                if (try? lockStatus(account.id)) != .unlocked { stillLocked.append(account.upn) }
            } else {
                try? unlock(account.id, passphrase: nil)
            }
        }
        return stillLocked
    }

    /// Sets, changes or removes an identity's passphrase. Needs the current one (nil when none).
    public func changePassphrase(_ identity: String, old: SecretBytes?, new: SecretBytes?) throws(EngineError) {
        let account = try self.account(identity)
        let file = files.path(files.keybagName(account.id))
        guard let (stored, _) = keybag(of: account) else { throw missingKeys(account) }
        let secret = try machineSecret(of: account)
        let unlocked = try Keybags.unlock(stored, machineSecret: secret, passphrase: old, file: file)
        let updated = try rewrapPassphrase(stored, keys: unlocked, newPassphrase: new, machineSecret: secret, file: file)
        try saveKeybag(updated, of: account)
        events.emit(.passphraseChanged, identity: account.upn, new == nil ? "passphrase removed for \(account.upn)" : "passphrase set for \(account.upn)")
    }

    /// Completes every lock whose grace period has ended: drops class A keys and the class B
    /// private key, and revokes open class A file keys. Call it from a timer (the mount does); the
    /// engine also calls it before answering anything that depends on lock state.
    public func processDeadlines() {
        let now = clock.now()
        guard Double(bitPattern: earliestLockDeadline.load(ordering: .acquiring)) <= now else { return }
        let completed: [(Account?, String, Int)] = state.withLock { state in
            var done: [(Account?, String, Int)] = []
            var next = Double.infinity
            for (key, var keys) in state.keys {
                guard case .locking(let until) = keys.lock else { continue }
                guard until <= now else {
                    next = min(next, until)
                    continue
                }
                keys.dropCompleteClasses()
                keys.lock = .locked
                state.keys[key] = keys
                let revoked = state.openKeys.revoke { $0.identity == key && $0.protectionClass == .complete }
                let account = state.accounts.first { $0.key == key }
                done.append((account, account?.upn ?? key.folded, revoked))
            }
            earliestLockDeadline.store(next.bitPattern, ordering: .releasing)
            return done
        }
        for (account, upn, revoked) in completed {
            if let account { for volume in volumes { volume.locked(account) } }
            events.emit(.locked, identity: upn, "locked \(upn): class A and B keys dropped",
                        details: ["revokedFileKeys": "\(revoked)", "classes": "A,B"])
        }
    }

    /// When the next lock completes (monotonic seconds), for a timer to sleep until.
    public func nextDeadline() -> Double? {
        state.withLock { state in
            state.keys.values.compactMap { keys -> Double? in
                if case .locking(let until) = keys.lock { return until }
                return nil
            }.min()
        }
    }
}
