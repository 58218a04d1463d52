import CustodyCrypto
import CustodyFormat
import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

/// The lock state of one identity.
public enum LockStatus: Equatable, Sendable, CustomStringConvertible {
    case unlocked
    /// Lock requested; class A keys go at `remaining` seconds from now.
    case locking(remaining: Double)
    case locked

    public var description: String {
        switch self {
        case .unlocked: return "unlocked"
        case .locking(let remaining): return "locking (\(Int(remaining.rounded(.up))) s left)"
        case .locked: return "locked"
        }
    }

    /// The state's name as the API and the metrics give it: unlocked, locking, locked.
    public var name: String {
        switch self {
        case .unlocked: return "unlocked"
        case .locking: return "locking"
        case .locked: return "locked"
        }
    }
}

/// What a class key is wanted for: creating a file (class B works while locked) or opening one.
public enum KeyPurpose: Sendable { case create, open }

/// The engine: accounts and policy, keybags and locks, identity resolution, events. It knows
/// nothing of FUSE or HTTP; the mount and the control socket drive it.
public final class Engine: @unchecked Sendable {
    public let events = EventBus()
    private let settingsBox: Mutex<Settings>
    /// The daemon's settings; `updateSettings` replaces them (a configuration reload).
    public var settings: Settings { settingsBox.withLock { $0 } }
    let files: StateFiles
    /// Where the engine keeps its state.
    public var stateDirectory: String { files.directory }
    let clock: EngineClock
    let processes: ProcessTable
    /// The state directory's machine keys (a file, or sealed to the TPM).
    let machineKeys: MachineKeys
    let state: Mutex<State>
    /// `accounts.json`, `bindings.json` and `attempts.json`, written outside the lock
    /// (`OrderedStateFile`).
    let accountsFile = OrderedStateFile<AccountsFile>("accounts.json")
    let bindingsFile = OrderedStateFile<Bindings>("bindings.json")
    let attemptsFileWriter = OrderedStateFile<AttemptsFile>(Engine.attemptsFile)
    /// Held while a keybag file is written (`saveKeybag`, a machine key migration), so that
    /// neither writes over the other, without holding the engine's lock during the write.
    let keybagWrites = Mutex(())
    private let wipeHandlerBox = Mutex<WipeHandler?>(nil)
    let volumeRegistry = VolumeRegistry()
    /// What the configuration declares (`provision`), and when each mount last said it refused
    /// to create for want of them (`Provisioning.swift`).
    let declared = Mutex<(accounts: [DeclaredAccount], refusalReported: [String: Double])>(([], [:]))
    private let timer = Mutex<DeadlineTimer?>(nil)
    /// Changes whenever something identity resolution reads changes (bindings, accounts,
    /// settings): remembered answers of older generations are not used.
    let resolutionGeneration = Atomic<UInt64>(0)
    let resolutions = ResolutionCache()
    /// What callers bound to no identity resolve to, by uid, for the resolution generation.
    let unboundResolutions = Mutex<(generation: UInt64, answers: [UInt32: ResolvedIdentity])>((.max, [:]))
    /// Changes whenever a policy or the settings change: open handles granted across identities
    /// check their grant again.
    let policyGeneration = Atomic<UInt64>(0)
    /// Changes whenever a name key appears or goes (`NameKeys.swift`).
    let nameKeyGenerationCounter = Atomic<UInt64>(0)
    /// Accounts by the IDs of their class keys, for the resolution generation it was made in
    /// (`HiddenOwners.swift`).
    let keyIDIndex = Mutex<(generation: UInt64, accounts: [UInt64: IndexedAccount])?>(nil)
    /// What each identity's new files are made as (`newFileOwner`), for the resolution and
    /// name-key generations it was read in.
    let newFileOwners = Mutex<(generation: UInt64, keys: UInt64, owners: [String: NewFileOwner])>((.max, .max, [:]))
    /// How owners no account names are shown, by key ID, for the resolution generation (`HiddenOwners.swift`).
    let unknownOwners = Mutex<(generation: UInt64, names: [String: String])>((0, [:]))
    /// No lock completes before this time (monotonic seconds, as a `Double`'s bits): every file
    /// created asks for a class key, which first completes due locks, and this spares it a walk
    /// of every identity's keys when none is due. Written only under `state`'s lock.
    let earliestLockDeadline = Atomic<UInt64>(Double.infinity.bitPattern)
    let transferRulesBox = Mutex<TransferRules?>(nil)
    let transferEvents = EventRateLimiter()
    /// The guard that keeps holders of managed data to their save-to locations (`Holding.swift`).
    let dataHoldersBox = Mutex<(any DataHolders)?>(nil)
    let saveRulesBox = Mutex<SaveRules?>(nil)
    let saveEvents = EventRateLimiter()
    /// Login sessions PAM opened (`LoginSessions`).
    let loginSessions = LoginSessions()
    let tamperEvents = EventRateLimiter()

    struct Bindings: Codable {
        var version = 1
        var processes: [Binding] = []
        var threads: [Binding] = []
        struct Binding: Codable { var task: TaskKey; var identity: String }
    }

    struct AccountsFile: Codable {
        var version = 1
        var accounts: [Account] = []
    }

    struct State: @unchecked Sendable {
        var accounts: [Account] = []
        /// Wipes journaled by a daemon that stopped before they finished: completed first thing.
        var pendingWipes: [Account] = []
        /// Enrolled accounts' keys, by canonical object ID.
        var keys: [IdentityKey: Keyring] = [:]
        var processBindings: [TaskKey: String] = [:]
        var threadBindings: [TaskKey: String] = [:]
        var openKeys = OpenFileKeys()
        /// Enrolled identities whose keybag needs a machine key that cannot be had, and why.
        var stranded: [IdentityKey: String] = [:]
        /// Enrolled identities whose keybag is missing or cannot be read, and why.
        var unusable: [IdentityKey: String] = [:]
        /// What is wrong with the state directory (`StateProblem`).
        var problems: [StateProblem] = []
        /// Runs of the daemon that did not stop cleanly (`UncleanStop`).
        var uncleanStops: [UncleanStop] = []
        /// Why the state is sealed (no machine key opens the state key); nil when it is open.
        var sealed: String?

        /// Where the account `identity` names is: spelled as stored first (every request that
        /// creates a file asks), then case-folded.
        func accountIndex(_ identity: String) -> Int? {
            accounts.firstIndex { $0.matchesAsStored(identity) } ?? accounts.firstIndex { $0.matches(identity) }
        }

        /// The UPN of the account filed as `key` (its key when none is), for messages.
        func upn(of key: IdentityKey) -> String {
            accounts.first { $0.key == key }?.upn ?? key.folded
        }

        /// Calls `body` with the keyring of `key` where it is, not a copy: a copy retains every key
        /// it holds, and every request thread that creates or opens a file shares those counts.
        /// Nil when `key` has none. (The values' subscript yields the stored keyring; the
        /// dictionary's own takes it out and puts a copy back.)
        mutating func withKeyring<T>(_ key: IdentityKey, _ body: (inout Keyring) -> T) -> T? {
            guard let index = keys.index(forKey: key) else { return nil }
            return body(&keys.values[index])
        }
    }

    // MARK: Starting

    /// Loads (or creates) the state in `stateDirectory`. Accounts, wipe journals and machine keys
    /// that cannot be read are errors that name them; other state that cannot be used is reported
    /// and the rest served (`StateProblem`).
    /// `machineKeySealer` seals machine keys to the machine's TPM (the daemon passes one when a
    /// TPM answers or `machine-key = "tpm2"`); without one, machine keys are files.
    public init(stateDirectory: String, settings: Settings = Settings(), clock: EngineClock = SystemClock(),
                processes: ProcessTable = LinuxProcessTable(), machineKeySealer: MachineKeySealer? = nil) throws(EngineError) {
        self.settingsBox = Mutex(settings)
        self.clock = clock
        self.processes = processes
        let seal = StateSeal(directory: stateDirectory)
        self.files = StateFiles(directory: stateDirectory, seal: seal)
        do { try Syscall.mkdirat(AT_FDCWD, stateDirectory, 0o700) } catch where error == .exists {} catch {
            throw .io(file: stateDirectory, error)
        }
        try files.makeDirectory("keybags")
        try files.makeDirectory("wipes")
        files.removeStaleTemporaries()
        self.machineKeys = try MachineKeys(files: files, sealer: machineKeySealer)
        if machineKeys.currentID == nil {
            try machineKeys.create(try Self.storeForNewKeys(settings.machineKey, sealer: machineKeySealer), pcrs: settings.tpm2PCRs)
        }
        try seal.load(machineKeys)
        if seal.keyID != nil { try Self.sealPlainState(files) }
        var loaded = State()
        loaded.uncleanStops = Self.noteRunStart(files, problems: &loaded.problems)
        var changes = LoadChanges()
        if let reason = seal.sealedReason {
            loaded.sealed = reason
            loaded.problems.append(Self.sealedProblem(reason))
        } else {
            changes = try Self.loadState(into: &loaded, files: files, machineKeys: machineKeys, settings: settings, clock: clock, processes: processes)
        }
        state = Mutex(loaded)
        for problem in loaded.problems { Self.emit(problem, on: events) }
        try saveLoaded(changes, loaded)
        // A migration that was stopped midway is finished; a store other than the configured one
        // is left for it.
        try finishMachineKeyMigration()
        if let wanted = MachineKeyStore(rawValue: settings.machineKey.rawValue), machineKeys.currentStore != wanted,
           (try? machineKeys.current()) != nil {
            try migrateMachineKey(to: wanted)
        }
    }

    /// Whether the bound task still runs: the same ID and start time (not a reused ID).
    func isLive(_ task: TaskKey) -> Bool { Self.isLive(task, in: processes) }

    static func isLive(_ task: TaskKey, in processes: ProcessTable) -> Bool { processes.startTime(of: task.id) == task.startTime }

    /// Drops the bindings of processes and threads that have exited (or whose ID now names another
    /// one) from memory and from `bindings.json`. The daemon calls it every few seconds; binding
    /// and unbinding do it too. True when something was dropped.
    @discardableResult
    public func pruneExitedBindings() -> Bool {
        let (boundProcesses, boundThreads) = state.withLock { (Array($0.processBindings.keys), Array($0.threadBindings.keys)) }
        resolutions.forgetExited()
        let gone = Set((boundProcesses + boundThreads).filter { !isLive($0) })
        guard !gone.isEmpty else { return false }
        let snapshot = state.withLock { state in
            state.processBindings = state.processBindings.filter { !gone.contains($0.key) }
            state.threadBindings = state.threadBindings.filter { !gone.contains($0.key) }
            return bindingsSnapshot(state)
        }
        return (try? files.save(snapshot)) != nil
    }

    /// Starts the thread that completes locks at the end of their grace period (the daemon does;
    /// tests with a manual clock call `processDeadlines` instead).
    /// Replaces the settings (a reload). A shorter grace period applies to locks requested later.
    public func updateSettings(_ settings: Settings) {
        let old = settingsBox.withLock { box in
            defer { box = settings }
            return box.allowedAccounts
        }
        resolutionGeneration.add(1, ordering: .releasing)
        policyGeneration.add(1, ordering: .releasing)
        allowedAccountsChanged(from: old, to: settings.allowedAccounts)
    }

    public func startDeadlineTimer() {
        timer.withLock { timer in
            if timer == nil { timer = DeadlineTimer(engine: self) }
        }
    }

    public func stopDeadlineTimer() {
        let stopped = timer.withLock { timer -> DeadlineTimer? in
            defer { timer = nil }
            return timer
        }
        stopped?.stop()
    }

    func pokeDeadlineTimer() { timer.withLock { $0?.poke() } }

    public var wipeHandler: WipeHandler? {
        get { wipeHandlerBox.withLock { $0 } }
        set { wipeHandlerBox.withLock { $0 = newValue } }
    }

    // MARK: Accounts

    public func accounts() -> [Account] { state.withLock { $0.accounts } }

    public func account(_ identity: String) throws(EngineError) -> Account {
        let found = state.withLock { state in state.accountIndex(identity).map { state.accounts[$0] } }
        guard let account = found else {
            if let reason = sealedState {
                throw .machineKeyUnavailable("\(identity) cannot be looked up: \(reason); recover it with its recovery key (custodyctl recover)")
            }
            throw .unknownAccount(identity)
        }
        return account
    }

    /// Registers an account without enrolling it (known, unmanaged).
    @discardableResult
    public func register(id: String, upn: String, uid: UInt32? = nil) throws(EngineError) -> Account {
        let id = try Account.checkedName(id), upn = try Account.checkedName(upn)
        try refuseWhileSealed("\(upn) cannot be registered")
        let (account, snapshot) = state.withLock { state -> (Account, OrderedStateFile<AccountsFile>.Snapshot?) in
            if let existing = state.accounts.first(where: { $0.matches(id) || $0.matches(upn) }) { return (existing, nil) }
            let account = Account(id: id, upn: upn, registeredAt: wallClockSeconds(), policy: nil, uid: uid)
            state.accounts.append(account)
            return (account, accountsSnapshot(state))
        }
        if let snapshot { try files.save(snapshot) } else { return account }
        events.emit(.registered, identity: account.upn, "registered \(account.upn)", details: ["id": account.id])
        return account
    }

    /// Enrolls an account: it becomes managed, with `policy`, and gets a keybag (protected by
    /// `passphrase`, or unlocking on authorization alone when nil). Without `policy`: the policy
    /// it had when it was deregistered with its keys kept, else the default policy; the same for
    /// `uid`.
    @discardableResult
    public func enroll(id: String, upn: String, policy: Policy? = nil, passphrase: SecretBytes? = nil, uid: UInt32? = nil) throws(EngineError) -> Account {
        try enroll(id: id, upn: upn, policy: policy, passphrase: passphrase, uid: uid, imported: nil)
    }

    /// An enrolment, with the class keys an identity has on another host when `imported` (its
    /// export's `from` is said in the event).
    func enroll(id: String, upn: String, policy: Policy?, passphrase: SecretBytes?, uid: UInt32?,
                imported: (keys: TransferredKeys, from: String)?) throws(EngineError) -> Account {
        do {
            let account = try enrollChecked(id: id, upn: upn, policy: policy, passphrase: passphrase, uid: uid, imported: imported?.keys)
            var details = ["id": account.id, "protectionLevel": account.policy?.protectionLevel.description ?? ""]
            if let from = imported?.from { details["importedFrom"] = from }
            let how = imported.map { " with keys from host \($0.from)" } ?? ""
            events.emit(.enrolled, identity: account.upn, code: 100, "enrolled \(account.upn)\(how); new policies received", details: details)
            // Files the identity already has (written while it was unmanaged, or kept from an
            // earlier enrolment) are brought to its policy, as after a policy change.
            for volume in volumes { volume.policyChanged(account) }
            events.emit(.reprotectRequired, identity: account.upn, "existing files of \(account.upn) are brought to its policy")
            return account
        } catch {
            events.emit(.enrollmentFailed, identity: upn, code: error.code, error.description)
            throw error
        }
    }

    /// What an enrolment of `id` and `upn` with `policy` needs before anything is written:
    /// checked names (returned), state not sealed, a policy whose locations exist, an allowed
    /// account that is not enrolled and has no wipe under way, and room for it in the
    /// single-account mode. `imported`: refused when keys of it are kept here.
    func checkEnrollable(id: String, upn: String, policy: Policy?, imported: Bool = false) throws(EngineError) -> (id: String, upn: String) {
        let id = try Account.checkedName(id), upn = try Account.checkedName(upn)
        try refuseWhileSealed("\(upn) cannot be enrolled")
        if let policy { try checkLocations(policy) }
        guard Self.isAllowed(id: id, upn: upn, settings.allowedAccounts) else { throw .accountNotAllowed(upn) }
        try state.withLock { (state) throws(EngineError) in
            if let pending = state.pendingWipes.first(where: { $0.matches(id) || $0.matches(upn) }) {
                throw .corruptState(file: files.path(files.wipeJournalName(pending.id)), reason: "the wipe of \(pending.upn) has not finished yet")
            }
            if let existing = state.accounts.first(where: { $0.matches(id) || $0.matches(upn) }), existing.isEnrolled {
                throw .alreadyEnrolled(existing.upn)
            }
            if !settings.multiIdentity, let other = state.accounts.first(where: { $0.isEnrolled }) {
                throw .singleManagedAccountMode(enrolled: other.upn)
            }
        }
        if imported, try files.read(StoredKeybag.self, from: files.keybagName(id)) != nil { throw .keysKeptHere(upn) }
        return (id, upn)
    }

    /// `imported`: the class keys of an identity enrolled on another host (`importIdentity`),
    /// made this host's with a keybag of its own.
    private func enrollChecked(id: String, upn: String, policy requested: Policy?, passphrase: SecretBytes?, uid requestedUID: UInt32?,
                               imported: TransferredKeys?) throws(EngineError) -> Account {
        let (id, upn) = try checkEnrollable(id: id, upn: upn, policy: requested, imported: imported != nil)
        // A keybag kept from an earlier enrollment (deregistered without wipe) is reused, so that
        // enrolling the same account again restores access to its files.
        let name = files.keybagName(id)
        var keys: Keyring
        var policy = requested ?? Policy(), uid = requestedUID
        if let kept = try files.read(StoredKeybag.self, from: name) {
            let secret = try Self.machineSecret(kept, keys: machineKeys, file: files.path(name))
            keys = try Keyring.load(kept, machineSecret: secret, file: files.path(name))
            do {
                keys.install(try Keybags.unlock(kept, machineSecret: secret, passphrase: passphrase, file: files.path(name)))
            } catch .passphraseRequired(_) {
                throw .passphraseRequired("\(upn) (enrolled before: its kept keys open with the passphrase they had, "
                                          + "given as \"passphrase\" in the request, or custodyctl enroll --passphrase-file)")
            }
            // What it was when it was deregistered comes back, unless the enrolment says otherwise.
            if let was = kept.kept {
                if requested == nil {
                    try checkLocations(was.policy)
                    policy = was.policy
                }
                uid = uid ?? was.uid
                keys.stored.kept = nil
                try keybagWrites.withLock { (_) throws(EngineError) in try files.write(keys.stored, to: name) }
            }
        } else {
            var (stored, unlocked, d, _, secret) = try Keybags.create(identity: IdentityKey(id).folded, passphrase: passphrase,
                                                                       cost: settings.passphraseCost, machine: try machineKeys.current(),
                                                                       given: imported?.generations.first)
            stored.passphraseGate = makeGate(passphrase, salt: stored.salt, identity: stored.identity)
            if let imported, imported.generations.count > 1 {
                // An identity whose keys were rotated: its other generations, under these.
                stored = try Keybags.withGenerations(stored, unlocked: unlocked, classD: d, imported)
            }
            try files.write(stored, to: name)
            keys = try Keyring.load(stored, machineSecret: secret, file: files.path(name))
            keys.install(unlocked)
        }
        let (account, snapshot) = state.withLock { state in
            var account = state.accounts.first(where: { $0.matches(id) || $0.matches(upn) })
                ?? Account(id: id, upn: upn, registeredAt: wallClockSeconds(), policy: nil, uid: uid)
            account.policy = policy
            account.reprotectPending = true
            account.hasPassphrase = keys.stored.passphrase != nil
            account.keyIDs = Self.keyIDs(of: keys.stored)
            if let uid { account.uid = uid }
            state.accounts.removeAll { $0.matches(id) || $0.matches(upn) }
            state.accounts.append(account)
            state.keys[account.key] = keys
            return (account, accountsSnapshot(state))
        }
        try files.save(snapshot)
        nameKeyInstalled(account.key)
        return account
    }

    /// Replaces an enrolled account's policy. A change marks its files for re-protection.
    @discardableResult
    public func setPolicy(_ identity: String, _ policy: Policy) throws(EngineError) -> Account {
        try checkLocations(policy)
        let (account, changed, snapshot) = try state.withLock { (state) throws(EngineError) in
            guard let index = state.accounts.firstIndex(where: { $0.matches(identity) }) else { throw .unknownAccount(identity) }
            guard let old = state.accounts[index].policy else { throw .notEnrolled(state.accounts[index].upn) }
            let changed = old != policy
            state.accounts[index].policy = policy
            if changed { state.accounts[index].reprotectPending = true }
            return (state.accounts[index], changed, accountsSnapshot(state))
        }
        try files.save(snapshot)
        if changed {
            for volume in volumes { volume.policyChanged(account) }
            events.emit(.policyChanged, identity: account.upn, code: 100, "new policies received for \(account.upn)",
                        details: ["protectionLevel": policy.protectionLevel.description, "fileEncryptionRequired": "\(policy.fileEncryptionRequired)"])
            events.emit(.reprotectRequired, identity: account.upn, "existing files of \(account.upn) need re-protection")
        } else {
            events.emit(.policyUnchanged, identity: account.upn, code: 101, "policies have not changed for \(account.upn)")
        }
        return account
    }

    /// Marks an account's re-protection as done (called by whoever re-protected its files).
    public func reprotectFinished(_ identity: String) throws(EngineError) {
        let snapshot = try state.withLock { (state) throws(EngineError) in
            guard let index = state.accounts.firstIndex(where: { $0.matches(identity) }) else { throw .unknownAccount(identity) }
            state.accounts[index].reprotectPending = false
            return accountsSnapshot(state)
        }
        try files.save(snapshot)
        // Names of earlier generations of keys are no longer looked for (`nameKeys`).
        nameKeyGenerationCounter.add(1, ordering: .releasing)
    }

    /// The accounts as they are now, to write with `files.save` once the lock is released
    /// (`OrderedStateFile`). Call it under the lock, after the change.
    func accountsSnapshot(_ state: State) -> OrderedStateFile<AccountsFile>.Snapshot {
        resolutionGeneration.add(1, ordering: .releasing)
        policyGeneration.add(1, ordering: .releasing)
        return accountsFile.snapshot(AccountsFile(accounts: state.accounts))
    }

    /// The bindings as they are now, to write with `files.save` once the lock is released.
    func bindingsSnapshot(_ state: State) -> OrderedStateFile<Bindings>.Snapshot {
        resolutionGeneration.add(1, ordering: .releasing)
        var bindings = Bindings()
        bindings.processes = state.processBindings.map { .init(task: $0.key, identity: $0.value) }.sorted { $0.task.id < $1.task.id }
        bindings.threads = state.threadBindings.map { .init(task: $0.key, identity: $0.value) }.sorted { $0.task.id < $1.task.id }
        return bindingsFile.snapshot(bindings)
    }

    // MARK: Protection

    /// The class an identity's new files get: min(policy level, MaxFileProtectionLevel); nil when
    /// the identity is unmanaged or its policy does not require encryption.
    public func effectiveProtection(for identity: String) -> ProtectionClass? {
        newFileOwner(identity).protectionClass
    }

    /// The class key for `identity`'s files of `protectionClass`, or `locked` when the lock state
    /// withholds it. Class B can create while locked (public key only). `id`: to open what a key
    /// of an earlier generation protected (`rotateKeys`), the ID its header names.
    public func classKey(for identity: String, _ protectionClass: ProtectionClass, purpose: KeyPurpose, id: [UInt8]? = nil) throws(EngineError) -> ClassKey {
        processDeadlines()
        let account = try self.account(identity)
        return try classKey(of: account.key, protectionClass, purpose: purpose, id: id)
    }

    /// The class key of the account filed as `key`: the one new files get, or (`id`, to open a
    /// file) the generation's whose key has that ID.
    func classKey(of key: IdentityKey, _ protectionClass: ProtectionClass, purpose: KeyPurpose, id: [UInt8]? = nil) throws(EngineError) -> ClassKey {
        try state.withLock { (state) throws(EngineError) -> ClassKey in
            let found = state.withKeyring(key) { (keys: inout Keyring) -> ClassKey? in Self.classKey(protectionClass, purpose: purpose, id: id, in: &keys) }
            guard let found else { throw missingKeys(key, upn: state.upn(of: key), state) }
            guard let found else { throw .locked(state.upn(of: key), protectionClass) }
            return found
        }
    }

    /// The key of `protectionClass` in `keys` (of the generation whose key has `id`, when one
    /// does; else of the current one); nil while the class is withheld (class B can create while
    /// locked: public key only). Reads the keyring in place, field by field.
    private static func classKey(_ protectionClass: ProtectionClass, purpose: KeyPurpose, id: [UInt8]?, in keys: inout Keyring) -> ClassKey? {
        let generation = id.flatMap { keys.key(protectionClass, id: $0) } ?? keys.generations[keys.current]
        switch protectionClass {
        case .none:
            return .symmetric(id: generation.d.id, key: generation.d.key)
        case .untilFirstAuthentication:
            guard let c = generation.c else { return nil }
            return .symmetric(id: c.id, key: c.key)
        case .completeUnlessOpen:
            let privateKey = purpose == .open ? generation.bPrivate : nil
            if purpose == .open, privateKey == nil { return nil }
            return .agreement(id: generation.bPublic.id, publicKey: generation.bPublic.publicKey, privateKey: privateKey)
        case .complete:
            guard let a = generation.a else { return nil }
            return .symmetric(id: a.id, key: a.key)
        }
    }

    /// The file key of a protected file for an open handle: unwrapped once, shared by the file's
    /// open handles, dropped at the last `closeFileKey`.
    public func openFileKey(_ header: FileHeader) throws(EngineError) -> FileKeyLease {
        let key = try identityKey(of: header)
        if let lease = state.withLock({ $0.openKeys.reuse(header.fileID) }) { return lease }
        processDeadlines()
        let classKey = try self.classKey(of: key, header.protectionClass, purpose: .open, id: header.classKeyID)
        let fileKey: SecretBytes
        do { fileKey = try header.unwrapFileKey(with: classKey) } catch { throw .format(error) }
        let lease = FileKeyLease(identity: key, protectionClass: header.protectionClass, fileID: header.fileID, fileKey: fileKey)
        return state.withLock { state in
            if let existing = state.openKeys.reuse(header.fileID) { return existing }
            state.openKeys.add(lease)
            return lease
        }
    }

    /// Registers a key the caller made itself (a file it just created) as open.
    public func adoptFileKey(_ fileKey: SecretBytes, header: FileHeader) throws(EngineError) -> FileKeyLease {
        let lease = FileKeyLease(identity: try identityKey(of: header), protectionClass: header.protectionClass, fileID: header.fileID, fileKey: fileKey)
        state.withLock { $0.openKeys.add(lease) }
        return lease
    }

    /// Whether a new handle may share the key of a file open already: not for a class B file while
    /// its identity is locked. Its open handles keep working, but no new one opens (as on iOS), also
    /// not one that arrives before the kernel's release of the last handle closed.
    public func admitsNewHandle(_ lease: FileKeyLease) -> Bool {
        guard lease.protectionClass == .completeUnlessOpen else { return true }
        return state.withLock { $0.withKeyring(lease.identity) { $0.classBPrivate != nil } ?? false }
    }

    /// One handle closed; at the last one the key is dropped (zeroed once nothing holds it).
    public func closeFileKey(_ lease: FileKeyLease) {
        state.withLock { _ = $0.openKeys.close(lease) }
    }

    /// How many file keys are held open, for one identity or all (for tests and status).
    public func openFileKeyCount(identity: String? = nil) -> Int {
        let key = identity.map { (try? self.account($0)).map { IdentityKey($0.id) } ?? IdentityKey($0) }
        return state.withLock { state in state.openKeys.count { key == nil || $0.identity == key } }
    }
}

/// Lower-case hex of `bytes`.
public func hexString<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
    let digits = Array("0123456789abcdef".utf8)
    var out: [UInt8] = []
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 0x0F)])
    }
    return String(decoding: out, as: UTF8.self)
}
