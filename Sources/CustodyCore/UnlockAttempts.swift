import CustodySystem
import Dispatch
import Glibc

/// Wrong passphrases and login passwords, counted per identity and kept in the state directory
/// (`attempts.json`), so that stopping the daemon does not reset the count or the wait. After
/// three wrong ones in a row each attempt waits 1, 2, 4 … (at most 300) seconds; after
/// `MaxUnlockAttempts` (when set) `UnlockAttemptsAction` decides: keep backing off, or wipe the
/// identity (a selective wipe, as an administrator's).
extension Engine {
    struct AttemptsFile: Codable {
        var version = 1
        /// By canonical object ID.
        var identities: [String: Attempts] = [:]
    }

    struct Attempts: Codable, Equatable {
        var failures: Int
        /// Wall-clock seconds (since 1970) before which no attempt is taken.
        var retryAt: Double
    }

    static let attemptsFile = "attempts.json"

    /// Wrong attempts in a row after which each attempt waits the longest (`backoff`).
    static let backoffLimit = 3 + 9

    /// Applies the kept counters to freshly loaded keys (the engine's clock is monotonic: the
    /// wait left is carried over from the wall clock). A file that cannot be read is set aside,
    /// and every identity then counts as at the back-off limit (below `MaxUnlockAttempts` when
    /// that is set, `limit`): damaging the file cannot reset a guessing counter, and the next
    /// right credential clears it as usual.
    static func loadAttempts(_ files: StateFiles, into keys: inout [IdentityKey: Keyring], clock: EngineClock, limit: Int,
                             problems: inout [StateProblem]) {
        guard access(files.path(attemptsFile), F_OK) == 0 else { return }
        guard let kept = readOrSetAside(AttemptsFile.self, from: attemptsFile, files: files,
                                        what: "every identity counts as at the back-off limit until its next right credential",
                                        problems: &problems) else {
            let failures = limit > 0 ? min(backoffLimit, max(1, limit - 1)) : backoffLimit
            for key in Array(keys.keys) {
                let kept = keys[key]?.failures ?? 0
                keys[key]?.failures = max(kept, failures)
            }
            return
        }
        let wall = wallClockSeconds(), now = clock.now()
        for (name, attempts) in kept.identities where keys[IdentityKey(name)] != nil {
            let key = IdentityKey(name)
            keys[key]?.failures = attempts.failures
            keys[key]?.retryAt = attempts.retryAt > wall ? now + (attempts.retryAt - wall) : 0
        }
    }

    /// Every identity's counters (only those with failures), to write with `saveAttempts` once
    /// the lock is released (`OrderedStateFile`). Call it under the lock, after the change.
    func attemptsSnapshot(_ state: State) -> OrderedStateFile<AttemptsFile>.Snapshot {
        var file = AttemptsFile()
        let wall = wallClockSeconds(), now = clock.now()
        for (key, keys) in state.keys where keys.failures > 0 {
            file.identities[key.folded] = Attempts(failures: keys.failures, retryAt: keys.retryAt > now ? wall + (keys.retryAt - now) : 0)
        }
        return attemptsFileWriter.snapshot(file)
    }

    /// Writes the counters; a failure leaves the last file (the counters stay in memory).
    func saveAttempts(_ snapshot: OrderedStateFile<AttemptsFile>.Snapshot) {
        try? files.save(snapshot)
    }

    /// The wait after `failures` wrong attempts in a row.
    static func backoff(after failures: Int) -> Double {
        failures >= 3 ? min(300, Double(1 << min(failures - 3, 16))) : 0
    }

    /// Counts a wrong credential for `account`; returns the failures so far and the wait.
    func recordFailedUnlock(_ account: Account, what: String) -> (failures: Int, wait: Double) {
        let key = account.key
        let (failures, wait, snapshot) = state.withLock { state -> (Int, Double, OrderedStateFile<AttemptsFile>.Snapshot?) in
            guard var keys = state.keys[key] else { return (0, 0, nil) }
            keys.failures += 1
            let wait = Self.backoff(after: keys.failures)
            if wait > 0 { keys.retryAt = clock.now() + wait }
            state.keys[key] = keys
            return (keys.failures, wait, attemptsSnapshot(state))
        }
        if let snapshot { saveAttempts(snapshot) }
        let protector = what.hasPrefix("login") ? "login" : what.hasPrefix("recovery") ? "recovery" : "passphrase"
        events.emit(.unlockFailed, identity: account.upn, "wrong \(what) for \(account.upn)",
                    details: ["failures": "\(failures)", "retryAfterSeconds": "\(wait)", "protector": protector])
        let settings = self.settings
        if settings.maxUnlockAttempts > 0, failures >= settings.maxUnlockAttempts {
            if settings.unlockAttemptsAction == "wipe" {
                events.emit(.unlockAttemptsExceeded, identity: account.upn, code: 102,
                            "\(failures) wrong attempts for \(account.upn): wiping it (UnlockAttemptsAction = wipe)",
                            details: ["failures": "\(failures)", "action": "wipe"])
                // The wipe deletes files; the refused request does not wait for it.
                DispatchQueue.global().async { [self] in try? self.deregister(account.id, wipe: true) }
            } else if failures == settings.maxUnlockAttempts {
                events.emit(.unlockAttemptsExceeded, identity: account.upn, "\(failures) wrong attempts for \(account.upn): backing off",
                            details: ["failures": "\(failures)", "action": "backoff"])
            }
        }
        return (failures, wait)
    }

    /// The refusal of a wrong credential for `account` (named `who` in it) that was the
    /// `failures`th in a row: with `MaxUnlockAttempts` and `UnlockAttemptsAction = wipe` it says how
    /// many attempts are left before the identity is wiped, or that this one wipes it.
    func wrongCredential(_ account: Account, naming who: String, failures: Int) -> EngineError {
        let settings = self.settings
        guard settings.maxUnlockAttempts > 0, settings.unlockAttemptsAction == "wipe", failures > 0 else { return .wrongPassphrase(who) }
        let left = settings.maxUnlockAttempts - failures
        if left <= 0 {
            return .wrongPassphrase("\(who): that was wrong attempt \(failures) of \(settings.maxUnlockAttempts) (MaxUnlockAttempts), " +
                                    "and the identity is being wiped (UnlockAttemptsAction = wipe)")
        }
        return .wrongPassphrase("\(who) (\(left) attempt\(left == 1 ? "" : "s") left before the identity is wiped)")
    }

    /// A right credential: the counters start again.
    func clearFailedUnlocks(_ key: IdentityKey) {
        let snapshot = state.withLock { state -> OrderedStateFile<AttemptsFile>.Snapshot? in
            guard let keys = state.keys[key], keys.failures > 0 || keys.retryAt > 0 else { return nil }
            state.keys[key]?.failures = 0
            state.keys[key]?.retryAt = 0
            return attemptsSnapshot(state)
        }
        if let snapshot { saveAttempts(snapshot) }
    }

    /// Wrong attempts in a row for `identity`, and the seconds to wait before the next.
    public func unlockAttempts(_ identity: String) -> (failures: Int, retryAfter: Double) {
        guard let account = try? self.account(identity) else { return (0, 0) }
        let now = clock.now()
        return state.withLock { state in
            guard let keys = state.keys[account.key] else { return (0, 0) }
            return (keys.failures, max(0, keys.retryAt - now))
        }
    }
}
