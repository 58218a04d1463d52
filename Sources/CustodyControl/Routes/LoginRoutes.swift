import CustodyAPI
import CustodyCore
import CustodySystem
import Glibc

// The login routes, for the PAM module (pam_custody.so) and `custodyctl protector`: a login
// unlocks the user's identities with its password (their login protectors), a password change
// rewraps the protectors, a logout locks.


extension ControlAPI {
    /// The uid a login route acts for: the caller's own, or (administrators) the named user's.
    func loginUser(_ name: String?, _ caller: Caller) throws(Failure) -> UInt32 {
        guard let name else { return caller.uid }
        guard let entry = getpwnam(name) else { throw Self.unknownUser(name) }
        let uid = entry.pointee.pw_uid
        guard caller.isAdmin || uid == caller.uid else { throw Self.notAuthorized("act for user \(name)") }
        return uid
    }

    func addLoginProtector(_ identity: String, _ body: ProtectorRequest) throws(Failure) -> HTTPResponse {
        return try run { () throws(EngineError) in
            try engine.addLoginProtector(identity, password: try Self.secret(body.password))
            return json(CustodyAccount(try engine.account(identity)))
        }
    }

    func removeLoginProtector(_ identity: String) throws(Failure) -> HTTPResponse {
        return try run { () throws(EngineError) in
            try engine.removeLoginProtector(identity)
            return HTTPResponse(status: 204, body: [])
        }
    }

    func login(_ body: LoginRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let uid = try loginUser(body.user, caller)
        // 200: every identity of the user is unlocked; 207: some stay locked (the body says which).
        return try run { () throws(EngineError) in
            let outcome = engine.login(uid: uid, password: try Self.secret(body.password), addProtectors: body.addProtectors ?? false)
            return json(LoginResult(outcome), status: outcome.stillLocked.isEmpty ? 200 : 207)
        }
    }

    func loginPasswordChanged(_ body: PasswordChangeRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let uid = try loginUser(body.user, caller)
        // Without the old password only an administrator (root's PAM stack) may rewrap from the
        // keys in memory.
        guard body.old != nil || caller.isAdmin else { throw Self.notAuthorized("change the login password's protectors without the old password") }
        return try run { () throws(EngineError) in
            let old = try body.old.map { (text) throws(EngineError) in try Self.secret(text) }
            let (rewrapped, stale) = engine.loginPasswordChanged(uid: uid, old: old, new: try Self.secret(body.new))
            // 200: every login protector follows the new password; 207: some could not (stale).
            return json(PasswordChangeResult(rewrapped: rewrapped, stale: stale), status: stale.isEmpty ? 200 : 207)
        }
    }

    /// A login session closed: the user's identities lock when it was the user's last session.
    func logout(_ body: SessionRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let uid = try loginUser(body.user, caller)
        let accounts = engine.accounts(ofUser: uid)
        let remaining = engine.loginSessionClosed(uid: uid, pid: body.session, loginSession: body.loginSession)
        return json(SessionClosed(locking: remaining == 0 ? accounts.map(\.upn) : [], otherSessions: remaining))
    }

    /// A login session opened (PAM's open_session), counted until it closes.
    func sessionOpened(_ body: SessionRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let uid = try loginUser(body.user, caller)
        guard let pid = body.session else { throw Self.badRequest("give the session: the PID of the process that opened it") }
        return try run { () throws(EngineError) in
            try engine.loginSessionOpened(uid: uid, pid: pid)
            return HTTPResponse(status: 204, body: [])
        }
    }
}

