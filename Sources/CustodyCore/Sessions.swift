/// Why an identity locks (in the `lockRequested` event's `cause`).
public enum LockCause: String, Sendable {
    case manual, sessionLock, suspend, logout
}

/// The login session as the device lock (see docs/identity.md, "Sessions"): what the daemon does
/// when a user's sessions lock, unlock, end, or the machine suspends. The session monitor
/// (CustodySessions, over logind) calls these; the engine knows nothing of D-Bus.
extension Engine {
    /// The enrolled accounts that belong to local user `uid`.
    public func accounts(ofUser uid: UInt32) -> [Account] {
        accounts().filter { $0.uid == uid && $0.isEnrolled }
    }

    /// Whether `cause` locks `account`: its policy's choice, else the settings'.
    func locks(_ account: Account, on cause: LockCause) -> Bool {
        let settings = self.settings, policy = account.policy
        switch cause {
        case .manual: return true
        case .sessionLock: return policy?.lockOnSessionLock ?? settings.lockOnSessionLock
        case .suspend: return policy?.lockOnSuspend ?? settings.lockOnSuspend
        case .logout: return policy?.lockOnLogout ?? settings.lockOnLogout
        }
    }

    /// Every session of `uid` is locked, or its last one ended: its identities lock (after the
    /// grace period), those whose policy says so.
    public func userLeft(_ uid: UInt32, cause: LockCause) {
        for account in accounts(ofUser: uid) where locks(account, on: cause) {
            try? lock(account.id, cause: cause)
        }
    }

    /// A session of `uid` was unlocked: a lock still in its grace period is called off, and
    /// identities that unlock on authorization alone (no passphrase) unlock. The others wait
    /// for their credential (the passphrase, or the login password through PAM).
    public func userReturned(_ uid: UInt32) {
        for account in accounts(ofUser: uid) {
            if (try? cancelPendingLock(account.id)) == true { continue }
            if !account.hasPassphrase, (try? lockStatus(account.id)) == .locked { try? unlock(account.id, passphrase: nil) }
        }
    }

    /// The machine is about to sleep: every identity whose policy says so locks now, without a
    /// grace period, and the mounts drop their cached plaintext before this returns (the caller
    /// holds a sleep inhibitor until then).
    public func prepareForSleep() {
        for account in accounts() where account.isEnrolled && locks(account, on: .suspend) {
            try? lock(account.id, cause: .suspend, immediately: true)
        }
        processDeadlines()
        for volume in volumes { volume.settleCaches() }
    }
}
