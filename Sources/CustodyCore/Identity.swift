import CustodySystem

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
        try state.withLock { (state) throws(EngineError) in
            let key = TaskKey(id: task, startTime: start)
            dropExited(&state)
            if thread {
                state.threadBindings = state.threadBindings.filter { $0.key.id != task }
                state.threadBindings[key] = identity
            } else {
                state.processBindings = state.processBindings.filter { $0.key.id != task }
                state.processBindings[key] = identity
            }
            try saveBindingsLocked(state)
        }
        let kind = thread ? "thread" : "process"
        events.emit(.identityBound, identity: identity, "\(kind) \(task) bound to \(identity)", details: [thread ? "tid" : "pid": "\(task)"])
    }

    public func unbindProcess(_ pid: Int32) throws(EngineError) {
        try state.withLock { (state) throws(EngineError) in
            state.processBindings = state.processBindings.filter { $0.key.id != pid }
            dropExited(&state)
            try saveBindingsLocked(state)
        }
        events.emit(.identityUnbound, "process \(pid) unbound", details: ["pid": "\(pid)"])
    }

    public func unbindThread(_ tid: Int32) throws(EngineError) {
        try state.withLock { (state) throws(EngineError) in
            state.threadBindings = state.threadBindings.filter { $0.key.id != tid }
            dropExited(&state)
            try saveBindingsLocked(state)
        }
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
    public func resolve(thread tid: Int32, uid: UInt32) -> ResolvedIdentity {
        let (threads, processesBound) = state.withLock { ($0.threadBindings, $0.processBindings) }
        if !threads.isEmpty, let start = processes.startTime(of: tid), let identity = threads[TaskKey(id: tid, startTime: start)] {
            return ResolvedIdentity(identity: identity, source: .thread(tid))
        }
        if !processesBound.isEmpty, let pid = processes.process(ofThread: tid) {
            var current = pid
            for _ in 0..<256 {
                if let start = processes.startTime(of: current), let identity = processesBound[TaskKey(id: current, startTime: start)] {
                    return ResolvedIdentity(identity: identity, source: current == pid ? .process(pid) : .ancestor(current))
                }
                guard let parent = processes.parent(of: current), parent != current else { break }
                current = parent
            }
        }
        if let identity = settings.defaultIdentities[uid] {
            return ResolvedIdentity(identity: registeredName(identity), source: .uidDefault(uid))
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
        let trimmed = identity.trimmingWhitespace()
        guard !trimmed.isEmpty else { throw .invalidIdentity("empty identity") }
        guard trimmed.utf8.count <= 180 else { throw .invalidIdentity("identity longer than 180 bytes") }
        return registeredName(trimmed)
    }

    /// A registered account is named as registered (its UPN); any other string is an unmanaged
    /// identity and keeps its spelling.
    public func registeredName(_ identity: String) -> String {
        (try? account(identity))?.upn ?? identity.trimmingWhitespace()
    }
}
