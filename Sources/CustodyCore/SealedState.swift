import CustodyCrypto
import CustodySystem
import FoundationEssentials
import Glibc

/// Loading the state, and the state while it is sealed (`StateSeal`): when no machine key opens
/// the state key, the accounts are unknown until a recovery key opens it. Nothing is written
/// meanwhile (enrolling, registering): the sealed files stay as they are, so that the machine key
/// coming back (PCRs restored) opens them again.
extension Engine {
    /// What loading changed that must be written once the engine holds the state.
    struct LoadChanges {
        var accountsUpdated = false
        var bindingsDropped = false
    }

    /// Reads accounts, wipe journals, keybags, unlock attempts and bindings into `loaded`.
    static func loadState(into loaded: inout State, files: StateFiles, machineKeys: MachineKeys, settings: Settings,
                          clock: EngineClock, processes: ProcessTable) throws(EngineError) -> LoadChanges {
        var changes = LoadChanges()
        loaded.accounts = try files.read(AccountsFile.self, from: "accounts.json")?.accounts ?? []
        // A wipe that was journaled is finished before anything of that account is served: its
        // keys are destroyed (again: it is idempotent) and the account dropped now; its files go
        // when the mount calls completePendingWipes.
        for name in files.list("wipes") where name.hasSuffix(".json") && !name.contains(".tmp-") {
            guard let pending = try files.read(Account.self, from: "wipes/" + name) else { continue }
            try files.destroy(files.keybagName(pending.id))
            try files.seal?.removeRecoveryWrap(of: pending.id)
            loaded.accounts.removeAll { $0.matches(pending.id) }
            loaded.pendingWipes.append(pending)
        }
        if !loaded.pendingWipes.isEmpty {
            try files.write(AccountsFile(accounts: loaded.accounts), to: "accounts.json")
        }
        for account in loaded.accounts where account.isEnrolled {
            let name = files.keybagName(account.id)
            do throws(EngineError) {
                guard let stored = try files.read(StoredKeybag.self, from: name) else {
                    throw .corruptState(file: files.path(name), reason: "it is missing")
                }
                let secret: SecretBytes
                do {
                    secret = try Self.machineSecret(stored, keys: machineKeys, file: files.path(name))
                } catch .machineKeyUnavailable(let reason) {
                    // Served as unavailable (with the reason) until recovered or wiped.
                    loaded.stranded[account.key] = reason
                    continue
                }
                var keys = try Keyring.load(stored, machineSecret: secret, file: files.path(name))
                if stored.passphrase == nil {
                    // Nothing to prove: an identity without a passphrase starts unlocked.
                    let unlocked = try Keybags.unlock(stored, machineSecret: secret, passphrase: nil, file: files.path(name))
                    keys.install(unlocked)
                }
                loaded.keys[account.key] = keys
                if let index = loaded.accounts.firstIndex(where: { $0.key == account.key }) {
                    // Kept with the account (written once): its name key's tag, its class keys' IDs.
                    if let tag = keys.nameKey?.tag, loaded.accounts[index].nameTag != tag {
                        loaded.accounts[index].nameTag = tag
                        changes.accountsUpdated = true
                    }
                    let earlier = keys.earlierNameKeys.map(\.tag)
                    if !earlier.isEmpty, loaded.accounts[index].earlierNameTags != earlier {
                        loaded.accounts[index].earlierNameTags = earlier
                        changes.accountsUpdated = true
                    }
                    if loaded.accounts[index].keyIDs == nil {
                        loaded.accounts[index].keyIDs = Self.keyIDs(of: stored)
                        changes.accountsUpdated = true
                    }
                }
            } catch {
                // One identity's keys, not the others': it is unavailable, and its keybag stays as found.
                let reason = "its keybag \(files.path(name)) cannot be used: \(error.description)"
                loaded.unusable[account.key] = reason
                loaded.problems.append(StateProblem(kind: .keybagUnusable, file: name,
                                                    message: "\(account.upn) is unavailable: \(reason); restore the keybag, or recover or wipe the identity",
                                                    identity: account.id))
            }
        }
        loaded.problems += Self.orphanedKeybags(files, accounts: loaded.accounts, pendingWipes: loaded.pendingWipes)
        if let seal = files.seal, seal.keyID != nil {
            for account in loaded.accounts where account.hasRecoveryKey == true && !seal.hasRecoveryWrap(of: account.id) {
                loaded.problems.append(StateProblem(kind: .recoveryKeyOutdated, file: StateSeal.keyFile,
                                                    message: "the recovery key of \(account.upn) was made before the state directory was sealed: it recovers the identity, " +
                                                        "but cannot open the state directory should the machine key be lost; make a new one (custodyctl recovery-key create or export)",
                                                    identity: account.id))
            }
        }
        Self.loadAttempts(files, into: &loaded.keys, clock: clock, limit: settings.maxUnlockAttempts, problems: &loaded.problems)
        if let bindings = Self.readOrSetAside(Bindings.self, from: "bindings.json", files: files,
                                              what: "processes bound to identities run as their user's default identity until bound again",
                                              problems: &loaded.problems) {
            // Bindings of processes that are gone (or whose PID was reused) are dropped, and of
            // identities whose wipe was interrupted.
            for binding in bindings.processes {
                if Self.isLive(binding.task, in: processes), !loaded.pendingWipes.contains(where: { $0.matches(binding.identity) }) {
                    loaded.processBindings[binding.task] = binding.identity
                } else {
                    changes.bindingsDropped = true
                }
            }
            for binding in bindings.threads {
                if Self.isLive(binding.task, in: processes), !loaded.pendingWipes.contains(where: { $0.matches(binding.identity) }) {
                    loaded.threadBindings[binding.task] = binding.identity
                } else {
                    changes.bindingsDropped = true
                }
            }
        }
        return changes
    }

    /// Writes what loading changed (under the engine's lock order: snapshots are taken of `loaded`).
    func saveLoaded(_ changes: LoadChanges, _ loaded: State) throws(EngineError) {
        // The file says only what holds: identities of exited processes do not linger in it.
        if changes.bindingsDropped { try files.save(bindingsSnapshot(loaded)) }
        if changes.accountsUpdated { try files.save(accountsSnapshot(loaded)) }
        // Counters that could not be read start again at the back-off limit, kept from now on.
        if loaded.problems.contains(where: { $0.kind == .setAside && $0.file == Self.attemptsFile }) { saveAttempts(attemptsSnapshot(loaded)) }
    }

    /// Seals the state files a state directory kept in clear before it had a state key, and
    /// renames keybags and wipe journals from a plain hash of the identity to a keyed one. Each
    /// file is written sealed before its plain copy goes, so a daemon stopped midway finds one or
    /// both (and finishes). A file that cannot be read is left as it is, for the load to report.
    static func sealPlainState(_ files: StateFiles) throws(EngineError) {
        try reseal(AccountsFile.self, "accounts.json", files)
        try reseal(Bindings.self, "bindings.json", files)
        try reseal(AttemptsFile.self, attemptsFile, files)
        for name in files.list("keybags") where name.hasSuffix(".json") && !name.contains(".tmp-") {
            try reseal(StoredKeybag.self, "keybags/" + name, files) { files.keybagName($0.identity) }
        }
        for name in files.list("wipes") where name.hasSuffix(".json") && !name.contains(".tmp-") {
            try reseal(Account.self, "wipes/" + name, files) { files.wipeJournalName($0.id) }
        }
    }

    /// Writes the plain file `name` sealed, under the name `renamedTo` gives it (its own when nil).
    private static func reseal<T: Codable>(_ type: T.Type, _ name: String, _ files: StateFiles,
                                           renamedTo newName: ((T) -> String)? = nil) throws(EngineError) {
        guard let bytes = try files.readBytes(name), StateSeal.envelope(bytes) == nil,
              let value = try? files.read(T.self, from: name) else { return }
        let target = newName?(value) ?? name
        if target == name || access(files.path(target), F_OK) != 0 {
            try files.write(value, to: target)
        }
        if target != name {
            do { try Syscall.unlinkat(AT_FDCWD, files.path(name), 0) } catch { throw .io(file: files.path(name), error) }
        }
    }

    static func sealedProblem(_ reason: String) -> StateProblem {
        StateProblem(kind: .sealed, file: StateSeal.keyFile,
                     message: reason + ": the accounts are unknown until an identity is recovered with its recovery key " +
                        "(custodyctl recover ID; first custodyctl machine-key reset when the key is gone for good)")
    }

    /// A state file kept by another part of the daemon (the guard's `holders.json`), sealed as
    /// the engine's own when it names identities (`StateSeal.isSealed`).
    public func writeStateFile<T: Encodable>(_ value: T, to name: String) throws(EngineError) {
        try files.write(value, to: name)
    }

    public func readStateFile<T: Decodable>(_ type: T.Type, from name: String) throws(EngineError) -> T? {
        try files.read(type, from: name)
    }

    /// Why nothing can be written or looked up while the state is sealed; nil when it is open.
    var sealedState: String? { state.withLock { $0.sealed } }

    func refuseWhileSealed(_ what: String) throws(EngineError) {
        if let reason = sealedState {
            throw .machineKeyUnavailable("\(what): \(reason); recover an identity with its recovery key first (custodyctl recover)")
        }
    }

    /// Opens the sealed state with a recovery key and loads it, as a start would.
    func unsealState(with recovery: RecoveryKey) throws(EngineError) {
        guard let seal = files.seal, sealedState != nil else { return }
        try seal.open(withRecoveryKey: recovery.digits)
        if let current = try? machineKeys.current() { try seal.wrap(under: current) }
        var loaded = State()
        let changes = try Self.loadState(into: &loaded, files: files, machineKeys: machineKeys, settings: settings, clock: clock, processes: processes)
        let found = loaded.problems
        let all = state.withLock { state -> State in
            loaded.uncleanStops = state.uncleanStops
            loaded.problems = state.problems.filter { $0.kind != .sealed } + found
            state = loaded
            return loaded
        }
        resolutionGeneration.add(1, ordering: .releasing)
        policyGeneration.add(1, ordering: .releasing)
        nameKeyGenerationCounter.add(1, ordering: .releasing)
        for problem in found { Self.emit(problem, on: events) }
        try saveLoaded(changes, all)
        events.emit(.machineKeyChanged, "the sealed state directory was opened with a recovery key: \(all.accounts.count) account(s), " +
                        "\(all.stranded.count) still needing recovery", details: ["accounts": "\(all.accounts.count)", "stranded": "\(all.stranded.count)"])
        // A wipe journaled before the state was sealed (its keys went just now, with the load)
        // finishes at once, as it would at a start: its files are not left for the next one.
        do throws(EngineError) { try completePendingWipes() } catch {
            for account in pendingWipes {
                events.emit(.wipeFailed, identity: account.upn, code: error.code,
                            "the interrupted wipe of \(account.upn) could not finish: \(error); it is completed at the next start")
            }
        }
    }
}
