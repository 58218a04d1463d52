import Synchronization

/// The login sessions PAM opened and closes (pam_custody's `lock_on_close`), so that closing one
/// session of a user locks its identities only when it was the user's last: logging out of one
/// ssh session must not lock the identities under the user's still-open desktop. pam_fscrypt
/// keeps the same rule.
///
/// A session is the PAM process that opened it (`TaskKey`: its PID and start time, so a reused
/// PID is not taken for it; the PAM stack closes the session from the process that opened it).
/// Sessions whose process has gone without closing (killed) do not count. Where login sessions
/// are followed through logind too, `otherLoginSessions` tells how many logind knows for the user
/// besides the one closing (named by its logind ID, `XDG_SESSION_ID`): while it knows any, a PAM
/// close does not lock, and logind's end of the user's last session does.
final class LoginSessions: Sendable {
    private let open = Mutex<[UInt32: Set<TaskKey>]>([:])
    let otherLoginSessions = Mutex<(@Sendable (UInt32, String?) -> Int)?>(nil)

    func opened(_ uid: UInt32, _ session: TaskKey) {
        _ = open.withLock { $0[uid, default: []].insert(session) }
    }

    /// Closes `session` (nil: the caller names none, and nothing else counts); returns how many
    /// other sessions of `uid` are still open, PAM's live ones and logind's.
    func closed(_ uid: UInt32, _ session: TaskKey?, loginSession: String?, isLive: (TaskKey) -> Bool) -> Int {
        guard let session else { return 0 }
        let remaining = open.withLock { open -> Int in
            var sessions = open[uid] ?? []
            sessions.remove(session)
            sessions = sessions.filter(isLive)
            open[uid] = sessions.isEmpty ? nil : sessions
            return sessions.count
        }
        return remaining + logind(uid, excluding: loginSession)
    }

    /// Sessions logind knows for `uid`, other than `excluding` (0 when logind is not followed).
    func logind(_ uid: UInt32, excluding: String?) -> Int {
        otherLoginSessions.withLock { $0 }?(uid, excluding) ?? 0
    }

    func count(_ uid: UInt32, isLive: (TaskKey) -> Bool) -> Int {
        open.withLock { ($0[uid] ?? []).filter(isLive).count }
    }
}

extension Engine {
    /// A login session of `uid` was opened by process `pid` (PAM's open_session).
    public func loginSessionOpened(uid: UInt32, pid: Int32) throws(EngineError) {
        guard let start = processes.startTime(of: pid) else { throw .noSuchProcess(pid) }
        loginSessions.opened(uid, TaskKey(id: pid, startTime: start))
    }

    /// A login session of `uid` closed (PAM's close_session, from the process that opened it,
    /// `pid`, with its logind ID `loginSession` where it has one; no `pid` when the caller names
    /// no session). The user's identities lock (those whose policy says so) when no other session
    /// of the user is open; returns how many are.
    @discardableResult
    public func loginSessionClosed(uid: UInt32, pid: Int32?, loginSession: String? = nil) -> Int {
        let session = pid.flatMap { pid in processes.startTime(of: pid).map { TaskKey(id: pid, startTime: $0) } }
        // A named session whose process is already gone closes too: gone processes do not count.
        let remaining = pid != nil && session == nil
            ? loginSessions.count(uid, isLive: isLive) + loginSessions.logind(uid, excluding: loginSession)
            : loginSessions.closed(uid, session, loginSession: loginSession, isLive: isLive)
        if remaining == 0 { userLeft(uid, cause: .logout) }
        return remaining
    }

    /// How many login sessions logind knows for a user, other than one named by its ID (set by the
    /// session monitor while it follows logind; nil when it stops).
    public func followLoginSessions(_ count: (@Sendable (UInt32, String?) -> Int)?) {
        loginSessions.otherLoginSessions.withLock { $0 = count }
    }
}
