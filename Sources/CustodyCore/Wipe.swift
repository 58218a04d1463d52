import CustodySystem

/// Deletes an identity's files during a wipe (each mount is one; see `ProtectedVolume`).
public protocol WipeHandler: Sendable {
    func wipeFiles(of account: Account, progress: (_ scanned: Int, _ deleted: Int, _ bytesFreed: UInt64) -> Void) throws(Errno)
}

/// How far a wipe has come: when the keys were gone (from the start), and the files so far.
public struct WipeProgress: Equatable, Sendable {
    public struct Files: Equatable, Sendable {
        public var scanned = 0
        public var deleted = 0
        public var bytesFreed: UInt64 = 0

        public init(scanned: Int = 0, deleted: Int = 0, bytesFreed: UInt64 = 0) {
            self.scanned = scanned
            self.deleted = deleted
            self.bytesFreed = bytesFreed
        }

        static func + (a: Files, b: Files) -> Files {
            Files(scanned: a.scanned + b.scanned, deleted: a.deleted + b.deleted, bytesFreed: a.bytesFreed + b.bytesFreed)
        }
    }

    /// Seconds from the wipe's start until the identity's keys were destroyed (its data unreadable).
    public var keysDestroyedSeconds: Double
    public var files = Files()

    public init(keysDestroyedSeconds: Double, files: Files = Files()) {
        self.keysDestroyedSeconds = keysDestroyedSeconds
        self.files = files
    }

    /// As a progress event's details: the keys' time once (the event that reports them gone),
    /// the file counts after it.
    func details(keysGone: Bool) -> [String: String] {
        keysGone ? ["keysDestroyedSeconds": String(keysDestroyedSeconds)]
            : ["scanned": "\(files.scanned)", "deleted": "\(files.deleted)", "bytesFreed": "\(files.bytesFreed)"]
    }
}

/// The selective wipe, top to bottom (`docs/wipe.md`): journaled, then the keys destroyed (in
/// memory and on disk: from then on every copy of the identity's files is unreadable), then its
/// files deleted in every mount, then the account and its bindings dropped, then the journal.
/// A daemon stopped midway finds the journal at its next start (`Engine.init` loads it into
/// `pendingWipes`) and finishes the wipe once its mounts are attached (`completePendingWipes`).
extension Engine {
    /// Deregisters an account. With `wipe`: its keys are destroyed first (in memory and on disk),
    /// then its files are deleted (the wipe handler), then it is unregistered. Without: its keybag
    /// stays sealed on disk, so enrolling it again restores access to its (still encrypted) files.
    public func deregister(_ identity: String, wipe: Bool, progress: (WipeProgress) -> Void = { _ in }) throws(EngineError) {
        var account = try self.account(identity)
        // The wipe finds the identity's names by their tag, also after a restart (the journal).
        if account.nameTag == nil { account.nameTag = nameKey(for: account.id)?.tag }
        let key = account.key
        if wipe {
            for volume in volumes { volume.wipeStarting(account) }
            events.emit(.wipeStarted, identity: account.upn, code: 102, "wipe received for \(account.upn)")
            // Journaled first: a daemon killed from here on finishes the wipe when it starts again.
            let started = clock.now()
            try files.write(account, to: files.wipeJournalName(account.id))
            dropKeys(key)
            for volume in volumes { volume.namesHidden(account) }
            try files.destroy(files.keybagName(account.id))
            try files.seal?.removeRecoveryWrap(of: account.id)
            // From here every copy of its encrypted files is unreadable.
            var done = WipeProgress(keysDestroyedSeconds: clock.now() - started)
            report(done, of: account, progress, keysGone: true, "keys of \(account.upn) destroyed")
            try deleteFiles(of: account) { files in
                done.files = files
                report(done, of: account, progress, keysGone: false, "wiping \(account.upn)")
            }
        } else {
            try keep(account)
            dropKeys(key)
            for volume in volumes { volume.namesHidden(account) }
        }
        let (accounts, bindings) = state.withLock { state in
            state.accounts.removeAll { $0.matches(account.id) }
            state.processBindings = state.processBindings.filter { !account.matches($0.value) }
            state.threadBindings = state.threadBindings.filter { !account.matches($0.value) }
            return (accountsSnapshot(state), bindingsSnapshot(state))
        }
        try files.save(accounts)
        try files.save(bindings)
        if wipe {
            try files.destroy(files.wipeJournalName(account.id))
            events.emit(.wipeFinished, identity: account.upn, code: 102, "wiped \(account.upn)")
        }
        events.emit(.deregistered, identity: account.upn, code: 104, "unenrolled and deregistered \(account.upn)",
                    details: ["wipe": "\(wipe)"])
    }

    /// Writes a deregistered account's policy and user into its kept keybag, for an enrolment
    /// that names neither to restore (`enroll`).
    private func keep(_ account: Account) throws(EngineError) {
        guard let policy = account.policy else { return }
        let name = files.keybagName(account.id)
        try keybagWrites.withLock { (_) throws(EngineError) in
            guard var stored = try files.read(StoredKeybag.self, from: name) else { return }
            stored.kept = KeptAccount(policy: policy, uid: account.uid)
            try files.write(stored, to: name)
        }
    }

    /// Forgets an identity's keys in memory and revokes its open file keys.
    private func dropKeys(_ key: IdentityKey) {
        state.withLock { state in
            state.keys[key] = nil
            state.stranded[key] = nil
            _ = state.openKeys.revoke { $0.identity == key }
        }
        nameKeyDropped()
    }

    /// Deletes the files of a wiped account in every mount (and through `wipeHandler`, when set);
    /// `progress` gets the counts so far, added up across mounts.
    private func deleteFiles(of account: Account, progress: (WipeProgress.Files) -> Void = { _ in }) throws(EngineError) {
        let handlers: [WipeHandler] = (wipeHandler.map { [$0] } ?? []) + volumes.map { $0 as WipeHandler }
        var before = WipeProgress.Files()
        for handler in handlers {
            var last = WipeProgress.Files()
            do {
                try handler.wipeFiles(of: account) { scanned, deleted, bytes in
                    last = WipeProgress.Files(scanned: scanned, deleted: deleted, bytesFreed: bytes)
                    progress(before + last)
                }
            } catch {
                events.emit(.wipeFailed, identity: account.upn, code: 215, "wipe of \(account.upn) failed: \(error)")
                throw .corruptState(file: files.directory, reason: "wipe of \(account.upn) failed: \(error)")
            }
            before = before + last
        }
    }

    /// Tells the caller and the event's observers how far a wipe has come.
    private func report(_ done: WipeProgress, of account: Account, _ progress: (WipeProgress) -> Void, keysGone: Bool, _ message: String) {
        progress(done)
        events.emit(.wipeProgress, identity: account.upn, message, details: done.details(keysGone: keysGone))
    }

    /// Accounts whose journaled wipe has not finished yet.
    public var pendingWipes: [Account] { state.withLock { $0.pendingWipes } }

    /// Finishes wipes that a stopped daemon journaled: deletes the files (the keys are already
    /// gone), then drops the journal. The daemon calls it once every mount is attached.
    public func completePendingWipes() throws(EngineError) {
        for account in pendingWipes {
            for volume in volumes { volume.wipeStarting(account) }
            events.emit(.wipeStarted, identity: account.upn, code: 102, "completing the interrupted wipe of \(account.upn)")
            try deleteFiles(of: account) { files in
                report(WipeProgress(keysDestroyedSeconds: 0, files: files), of: account, { _ in }, keysGone: false, "wiping \(account.upn)")
            }
            let bindings = state.withLock { state in
                state.processBindings = state.processBindings.filter { !account.matches($0.value) }
                state.threadBindings = state.threadBindings.filter { !account.matches($0.value) }
                return bindingsSnapshot(state)
            }
            try files.save(bindings)
            try files.destroy(files.wipeJournalName(account.id))
            state.withLock { $0.pendingWipes.removeAll { $0.matches(account.id) } }
            events.emit(.wipeFinished, identity: account.upn, code: 102, "wiped \(account.upn)")
            events.emit(.deregistered, identity: account.upn, code: 104, "unenrolled and deregistered \(account.upn)", details: ["wipe": "true"])
        }
    }
}
