/// Accounts declared in the configuration (`[[account]]` in custody.toml; the SDK's
/// AutoEnrollOnLaunch with its policy): a fleet's configuration management writes one file, and
/// the daemon brings its accounts to it at start and at every reload, idempotently. A declared
/// account is registered or enrolled when missing, enrolled when declared managed but only
/// registered, and given the declared policy when it differs; nothing happens when it is as
/// declared. An account a reload no longer declares is treated as one `AllowedAccounts` stops
/// naming (`AllowedAccountsAction`), once; it then stays as an account made over the API would.
public struct DeclaredAccount: Equatable, Sendable {
    public var id: String
    public var upn: String
    public var uid: UInt32?
    /// Managed (enrolled, with `policy` or the default policy); false: registered only.
    public var enroll: Bool
    public var policy: Policy?

    public init(id: String, upn: String, uid: UInt32? = nil, enroll: Bool = true, policy: Policy? = nil) {
        self.id = id
        self.upn = upn
        self.uid = uid
        self.enroll = enroll
        self.policy = policy
    }
}

extension Engine {
    /// Brings the accounts to `declared` (see `DeclaredAccount`). A declared account that cannot
    /// be brought there (not allowed, a passphrase its kept keys need, the single-account mode)
    /// is an `enrollmentFailed` event and is left as it is; the others go on. Returns what failed.
    @discardableResult
    public func provision(_ declared: [DeclaredAccount]) -> [(DeclaredAccount, EngineError)] {
        self.declared.withLock { $0.accounts = declared }
        var failures: [(DeclaredAccount, EngineError)] = []
        for wanted in declared {
            do throws(EngineError) {
                try provision(wanted)
            } catch {
                failures.append((wanted, error))
                events.emit(.enrollmentFailed, identity: wanted.upn, code: error.code,
                            "the configuration declares \(wanted.upn), which cannot be provisioned: \(error)")
            }
        }
        forgetUndeclared(declared)
        return failures
    }

    private func provision(_ wanted: DeclaredAccount) throws(EngineError) {
        let existing = try? account(wanted.id)
        if let existing, !existing.matches(wanted.upn) {
            throw .invalidIdentity("object ID \(wanted.id) belongs to \(existing.upn), not \(wanted.upn)")
        }
        let policy = wanted.policy ?? Policy()
        switch (existing, wanted.enroll) {
        case (.some(let existing), true) where existing.isEnrolled:
            if existing.policy != policy { try setPolicy(existing.id, policy) }
        case (_, true):
            // Missing, or registered only.
            try enroll(id: wanted.id, upn: wanted.upn, policy: policy, uid: wanted.uid)
        case (nil, false):
            try register(id: wanted.id, upn: wanted.upn, uid: wanted.uid)
        case (.some, false):
            // Declared unmanaged but enrolled (over the API): its keys are not dropped behind the
            // administrator's back; the status shows it enrolled.
            break
        }
        try markDeclared(wanted)
    }

    /// Records that the configuration declares the account (and its user, when given).
    private func markDeclared(_ wanted: DeclaredAccount) throws(EngineError) {
        let snapshot = state.withLock { state -> OrderedStateFile<AccountsFile>.Snapshot? in
            guard let index = state.accountIndex(wanted.id) else { return nil }
            let before = state.accounts[index]
            state.accounts[index].declared = true
            if let uid = wanted.uid { state.accounts[index].uid = uid }
            return state.accounts[index] == before ? nil : accountsSnapshot(state)
        }
        if let snapshot { try files.save(snapshot) }
    }

    /// Accounts declared before that `declared` no longer names: `AllowedAccountsAction`, once.
    private func forgetUndeclared(_ declared: [DeclaredAccount]) {
        let gone = accounts().filter { account in
            account.declared == true && !declared.contains { account.matches($0.id) || account.matches($0.upn) }
        }
        for account in gone {
            let snapshot = state.withLock { state -> OrderedStateFile<AccountsFile>.Snapshot? in
                guard let index = state.accountIndex(account.id) else { return nil }
                state.accounts[index].declared = nil
                return accountsSnapshot(state)
            }
            if let snapshot { try? files.save(snapshot) }
            guard account.isEnrolled else { continue }
            act(on: account, settings.allowedAccountsAction, because: "the configuration no longer declares it")
        }
    }

    // MARK: Mounts that require a policy

    /// The declared managed accounts that are not enrolled yet; with none declared, every
    /// account while none is enrolled (a mount that requires a policy waits for one).
    public func accountsAwaitingPolicy() -> [String] {
        let wanted = declared.withLock { $0.accounts }.filter(\.enroll)
        return state.withLock { state in
            let enrolled = state.accounts.filter(\.isEnrolled)
            if wanted.isEmpty { return enrolled.isEmpty ? ["any account"] : [] }
            return wanted.filter { declared in !enrolled.contains { $0.matches(declared.id) } }.map(\.upn)
        }
    }

    /// Whether a mount with `policy_required` may create: every declared managed account is
    /// enrolled (and, with none declared, some account is). When not, says so as an event, at
    /// most every 10 seconds per mount, and answers false (the mount refuses with EACCES).
    public func mayCreate(policyRequiredIn mountPoint: String) -> Bool {
        let missing = accountsAwaitingPolicy()
        guard !missing.isEmpty else { return true }
        let now = clock.now()
        let report = declared.withLock { state -> Bool in
            guard now - (state.refusalReported[mountPoint] ?? -.infinity) >= 10 else { return false }
            state.refusalReported[mountPoint] = now
            return true
        }
        if report {
            events.emit(.policyRequired, identity: nil, code: 214,
                        "\(mountPoint) creates nothing until its policy exists (policy_required): waiting for \(missing.joined(separator: ", ")) to be enrolled",
                        details: ["mountPoint": mountPoint, "waitingFor": "\(missing.count)"])
        }
        return false
    }
}
