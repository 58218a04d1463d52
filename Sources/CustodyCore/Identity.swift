import CustodySystem
import Synchronization

/// Identity resolution: who a calling thread is working as. See docs/identity.md.
extension Engine {
    /// Binds a process (and, through inheritance, its descendants) to `identity`.
    public func bindProcess(_ pid: Int32, to identity: String) throws(EngineError) {
        try bind(pid, to: identity, thread: false)
    }

    /// Binds one thread (a TID) to `identity`; it takes precedence over its process's binding.
    public func bindThread(_ tid: Int32, to identity: String) throws(EngineError) {
        try bind(tid, to: identity, thread: true)
    }

    private func bind(_ task: Int32, to identity: String, thread: Bool) throws(EngineError) {
        let identity = try checkedIdentity(identity)
        guard let start = processes.startTime(of: task) else { throw .noSuchProcess(task) }
        let snapshot = state.withLock { state in
            let key = TaskKey(id: task, startTime: start)
            dropExited(&state)
            if thread {
                state.threadBindings = state.threadBindings.filter { $0.key.id != task }
                state.threadBindings[key] = identity
            } else {
                state.processBindings = state.processBindings.filter { $0.key.id != task }
                state.processBindings[key] = identity
            }
            return bindingsSnapshot(state)
        }
        try files.save(snapshot)
        let kind = thread ? "thread" : "process"
        events.emit(.identityBound, identity: identity, "\(kind) \(task) bound to \(identity)", details: [thread ? "tid" : "pid": "\(task)"])
    }

    public func unbindProcess(_ pid: Int32) throws(EngineError) {
        let snapshot = state.withLock { state in
            state.processBindings = state.processBindings.filter { $0.key.id != pid }
            dropExited(&state)
            return bindingsSnapshot(state)
        }
        try files.save(snapshot)
        events.emit(.identityUnbound, "process \(pid) unbound", details: ["pid": "\(pid)"])
    }

    public func unbindThread(_ tid: Int32) throws(EngineError) {
        let snapshot = state.withLock { state in
            state.threadBindings = state.threadBindings.filter { $0.key.id != tid }
            dropExited(&state)
            return bindingsSnapshot(state)
        }
        try files.save(snapshot)
        events.emit(.identityUnbound, "thread \(tid) unbound", details: ["tid": "\(tid)"])
    }

    /// Bindings of tasks that have exited go whenever the bindings are saved.
    private func dropExited(_ state: inout State) {
        state.processBindings = state.processBindings.filter { isLive($0.key) }
        state.threadBindings = state.threadBindings.filter { isLive($0.key) }
    }

    /// The effective identity of thread `tid` of a caller with `uid`, by precedence: the thread's
    /// binding; its process's binding; the nearest bound ancestor's; the uid's default identity;
    /// the primary managed account when MultiIdentity is off; else none. Bindings only match the
    /// process or thread that was bound (same start time), never a later one with the same ID.
    ///
    /// Answers are remembered per thread (see `ResolutionCache`): a thread asking again, with
    /// nothing changed since, costs a check per task its answer rests on instead of a walk
    /// through /proc.
    public func resolve(thread tid: Int32, uid: UInt32) -> ResolvedIdentity {
        // The bindings are copied only when there are some (a copy's counts are shared by every
        // request thread).
        let bindings = state.withLock { state in
            state.threadBindings.isEmpty && state.processBindings.isEmpty ? nil : (state.threadBindings, state.processBindings)
        }
        guard let bindings else { return resolveUnbound(uid: uid) }
        let (threads, processesBound) = bindings
        let generation = resolutionGeneration.load(ordering: .acquiring)
        if let known = resolutions.answer(thread: tid, uid: uid, generation: generation) { return known }
        var resting: [Int32] = [tid]
        let answer = walk(thread: tid, uid: uid, threads: threads, processesBound: processesBound, resting: &resting)
        resolutions.remember(answer, thread: tid, uid: uid, generation: generation, resting: resting, processes: processes)
        return answer
    }

    /// The walk `resolve` remembers. `resting` gets the tasks the answer depends on: the thread,
    /// and for an inherited binding every process from the thread's up to the bound one (if one
    /// of them exits, the chain changes).
    private func walk(thread tid: Int32, uid: UInt32, threads: [TaskKey: String], processesBound: [TaskKey: String],
                      resting: inout [Int32]) -> ResolvedIdentity {
        if !threads.isEmpty, let start = processes.startTime(of: tid), let identity = threads[TaskKey(id: tid, startTime: start)] {
            return ResolvedIdentity(identity: identity, source: .thread(tid))
        }
        if !processesBound.isEmpty, let pid = processes.process(ofThread: tid) {
            var current = pid
            var chain: [Int32] = []
            for _ in 0..<256 {
                chain.append(current)
                if let start = processes.startTime(of: current), let identity = processesBound[TaskKey(id: current, startTime: start)] {
                    resting += chain.filter { $0 != tid }
                    return ResolvedIdentity(identity: identity, source: current == pid ? .process(pid) : .ancestor(current))
                }
                guard let parent = processes.parent(of: current), parent != current else { break }
                current = parent
            }
        }
        // Unbound: a later parent is always an ancestor already walked (orphans go to a
        // subreaper above them or to init), so only a new binding, which changes the
        // generation, can change the answer.
        return resolveUnbound(uid: uid)
    }

    /// Rules 4 to 6: the uid's default identity (configured, or the managed account the uid
    /// owns), the primary account, or none.
    private func resolveUnbound(uid: UInt32) -> ResolvedIdentity {
        let generation = resolutionGeneration.load(ordering: .acquiring)
        if let known = unboundResolutions.withLock({ $0.generation == generation ? $0.answers[uid] : nil }) { return known }
        let answer = walkUnbound(uid: uid)
        unboundResolutions.withLock { cache in
            if cache.generation != generation || cache.answers.count >= 1024 { cache = (generation, [:]) }
            cache.answers[uid] = answer
        }
        return answer
    }

    /// The answer `resolveUnbound` keeps per uid for the resolution generation.
    private func walkUnbound(uid: UInt32) -> ResolvedIdentity {
        let settings = self.settings
        if let identity = settings.defaultIdentities[uid] {
            return ResolvedIdentity(identity: registeredName(identity), source: .uidDefault(uid))
        }
        if let owned = state.withLock({ $0.accounts.first { $0.uid == uid && $0.isEnrolled } }) {
            return ResolvedIdentity(identity: owned.upn, source: .uidAccount(uid))
        }
        if !settings.multiIdentity, let primary = accounts().first(where: { $0.isEnrolled }) {
            return ResolvedIdentity(identity: primary.upn, source: .primaryAccount)
        }
        return ResolvedIdentity(identity: nil, source: .none)
    }

    /// The owner a new file gets: the caller's effective identity, or, for a caller with no
    /// identity, the owner of the directory it is created in (nil: untracked).
    public func ownerForNewFile(_ caller: ResolvedIdentity, directoryOwner: String?) -> String? {
        caller.identity ?? directoryOwner
    }

    private func checkedIdentity(_ identity: String) throws(EngineError) -> String {
        registeredName(try Account.checkedName(identity))
    }

    /// A registered account is named as registered (its UPN); any other string is an unmanaged
    /// identity and keeps its spelling.
    public func registeredName(_ identity: String) -> String {
        (try? account(identity))?.upn ?? identity.trimmingWhitespace()
    }
}

/// Recent answers of `Engine.resolve`, per thread and uid. An answer is used again only while
/// the engine's resolution generation is the same (no binding, account or setting changed) and
/// every task it rests on still runs (`TaskProbe`: the same task, not a reused ID). At most
/// `capacity` threads are remembered; past that the oldest half is forgotten.
final class ResolutionCache: Sendable {
    struct Key: Hashable { var thread: Int32; var uid: UInt32 }
    final class Entry: Sendable {
        let answer: ResolvedIdentity
        let generation: UInt64
        let probes: [TaskProbe]
        let order: UInt64
        init(answer: ResolvedIdentity, generation: UInt64, probes: [TaskProbe], order: UInt64) {
            self.answer = answer
            self.generation = generation
            self.probes = probes
            self.order = order
        }
    }
    struct Table { var entries: [Key: Entry] = [:]; var next: UInt64 = 0 }

    let capacity: Int
    private let table = Mutex(Table())

    init(capacity: Int = 512) { self.capacity = capacity }

    func answer(thread: Int32, uid: UInt32, generation: UInt64) -> ResolvedIdentity? {
        guard let entry = table.withLock({ $0.entries[Key(thread: thread, uid: uid)] }), entry.generation == generation else { return nil }
        // The probes are checked outside the lock; an entry dropped meanwhile keeps its
        // descriptors open until this check ends.
        for probe in entry.probes where !probe.isSameTask {
            table.withLock { table in
                if table.entries[Key(thread: thread, uid: uid)] === entry { table.entries[Key(thread: thread, uid: uid)] = nil }
            }
            return nil
        }
        return entry.answer
    }

    func remember(_ answer: ResolvedIdentity, thread: Int32, uid: UInt32, generation: UInt64, resting: [Int32], processes: ProcessTable) {
        var probes: [TaskProbe] = []
        for id in Set(resting) {
            guard let probe = processes.probe(id) else { return }
            probes.append(probe)
        }
        table.withLock { table in
            if table.entries.count >= capacity {
                let kept = table.entries.sorted { $0.value.order > $1.value.order }.prefix(capacity / 2)
                table.entries = Dictionary(uniqueKeysWithValues: kept.map { ($0.key, $0.value) })
            }
            table.next += 1
            table.entries[Key(thread: thread, uid: uid)] = Entry(answer: answer, generation: generation, probes: probes, order: table.next)
        }
    }

    /// Forgets the threads whose tasks have exited (the daemon's periodic pruning calls it).
    func forgetExited() {
        let entries = table.withLock { $0.entries }
        let gone = entries.filter { $0.value.probes.contains { !$0.isSameTask } }.map(\.key)
        guard !gone.isEmpty else { return }
        table.withLock { table in for key in gone { table.entries[key] = nil } }
    }

    var count: Int { table.withLock { $0.entries.count } }
}
