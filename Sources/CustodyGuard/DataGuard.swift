import CLinux
import CustodyCore
import CustodySystem
import Dispatch
import Foundation
import Glibc
import Synchronization

/// Keeps every process that holds a managed identity's data to that identity's save-to locations,
/// whatever started it (docs/guard.md). The mounts tell it who reads (`admit`); the kernel asks
/// it about every open on the watched file systems while any process holds such data (fanotify
/// permission events), and it follows forks and exits (the proc connector).
///
/// Three threads: the mounts' (which call `admit` and wait for its answer), the guard's (which
/// answers the kernel and owns the table of holders: it takes no lock, opens no file and calls
/// nothing of the engine, so that it never waits on what it guards), and the reporter's (events,
/// log lines, new rules from the engine).
public final class DataGuard: DataHolders, @unchecked Sendable {
    private let engine: Engine
    private let selection: GuardedFileSystems
    /// Idle CPUs kept able to wake at once while opens come back to back (`WakeLatencyBoost`):
    /// each open a holder's presence makes the kernel ask about wakes two threads.
    private let wakeBoost: WakeLatencyBoost?
    private let log: @Sendable (String) -> Void

    // Set up by `start`; the guard thread owns the descriptors afterwards.
    private var group: Int32 = -1
    private var processEvents: Int32 = -1
    private var mountTable: Int32 = -1
    private let wake: Int32
    private let running = Atomic<Bool>(false)
    private var guardThread: pthread_t?
    private var reporterThread: pthread_t?

    // Owned by the guard thread.
    private var holders = ProcessHolders()
    /// Processes that write into managed identities' files whose policies list open-from
    /// locations (and the processes they start afterwards): they read data only from there.
    private var receivers = ProcessHolders()
    private var watched: [UInt64: WatchedFileSystem] = [:]
    /// Custody's own mounts, by device: a descriptor there open for writing keeps a receiver one.
    private var mountDevices: Set<UInt64> = []
    private var rules: SaveRules
    private var armed = false

    /// From the mounts to the guard thread.
    private struct HoldRequest {
        let process: Int32
        let identities: Set<String>
        /// A writer into the identities' files (open-from), not a reader (save-to).
        var receives = false
        let rules: SaveRules
        let done: DispatchSemaphore
    }
    private let requests = Mutex<[HoldRequest]>([])
    /// From the guard thread to the reporter.
    private let reports = Mutex<[Report]>([])
    private let reporterWake = DispatchSemaphore(value: 0)
    /// What the mounts know: the watched file systems (for `admit`'s check of open files) and the
    /// processes already admitted (start time, identities), so that a process's next read of the
    /// same identity costs two small /proc reads.
    private let watchedForMounts = Mutex<[UInt64: WatchedFileSystem]>([:])
    private let admitted = Mutex<[Admission: (start: UInt64, identities: Set<String>)]>([:])

    /// A process admitted as a holder, or as a receiver.
    private struct Admission: Hashable {
        let process: Int32
        let receives: Bool
    }
    private let statusBox: Mutex<GuardStatus>
    private let refusalCount = Atomic<UInt64>(0)
    private let holderCount = Atomic<Int>(0)

    enum Report {
        case refusal(Refusal)
        case message(String)
        /// The holders as they are now, for `holders.json`.
        case holders([Int32: ProcessHolders.Holder])
    }

    /// Where the holders are kept across restarts of the daemon: a process that read managed data
    /// still has it when the daemon comes back.
    /// (In the state directory, sealed: it names identities.)
    private static let holdersFile = "holders.json"
    /// `holders.membership` when the holders were last handed to the reporter (guard thread only).
    private var savedMembership: UInt64 = 0
    /// The guard thread's buffers for events from the kernel, kept between batches.
    private var processEventBuffer = [clinux_process_event](repeating: clinux_process_event(), count: 256)
    private var openEventBuffer = [clinux_open_event](repeating: clinux_open_event(), count: 64)

    struct Refusal {
        let thread: Int32
        let process: Int32
        let identities: [String]
        let location: String
        let path: String
        let operation: String
        let removedEmptyFile: Bool
        /// Data from `location` into the identities (open-from), not out of them.
        var openFrom = false
        /// Read at once (from /proc: no file is opened), while the process is still there.
        var executable: String? = nil
        var uid: UInt32? = nil
    }

    private func report(refusal: Refusal) {
        var refusal = refusal
        refusal.executable = try? Syscall.readlink("/proc/\(refusal.process)/exe")
        refusal.uid = LinuxProcessTable().uid(of: refusal.process)
        report(.refusal(refusal))
    }

    public init(engine: Engine, selection: GuardedFileSystems, lowLatency: Bool = true, log: @escaping @Sendable (String) -> Void) {
        self.engine = engine
        self.selection = selection
        self.wakeBoost = lowLatency ? WakeLatencyBoost.shared : nil
        self.log = log
        self.wake = clinux_wake_descriptor()
        self.rules = engine.saveRules()
        self.statusBox = Mutex(GuardStatus(level: "off", reason: "not started", fileSystems: [], holders: 0, refusals: 0))
    }

    deinit {
        if wake >= 0 { close(wake) }
    }

    /// Opens what the kernel offers and starts the threads; the status says what it covers.
    @discardableResult
    public func start() -> GuardStatus {
        if selection == .none { return setStatus(level: "off", reason: "file_systems = \"none\" in the configuration") }
        group = clinux_guard_group()
        guard group >= 0 else {
            return setStatus(level: "unavailable", reason: "fanotify permission events: \(String(cString: strerror(errno)))")
        }
        processEvents = clinux_process_events_open()
        guard processEvents >= 0 else {
            let reason = "process events (proc connector): \(String(cString: strerror(errno)))"
            close(group)
            group = -1
            return setStatus(level: "unavailable", reason: reason)
        }
        mountTable = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
        refreshFileSystems()
        restoreHolders()
        running.store(true, ordering: .releasing)
        do {
            guardThread = try DaemonThread.start("guard") { [self] in guardLoop() }
            reporterThread = try DaemonThread.start("guard-report") { [self] in reporterLoop() }
        } catch {
            running.store(false, ordering: .releasing)
            return setStatus(level: "unavailable", reason: "cannot start its threads: \(error)")
        }
        return setStatus(level: "fanotify", reason: nil)
    }

    /// Stops the threads; the kernel lets every pending open through once the group is closed.
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing) else { return }
        signalWake()
        reporterWake.signal()
        if let guardThread { pthread_join(guardThread, nil) }
        if let reporterThread { pthread_join(reporterThread, nil) }
        guardThread = nil
        reporterThread = nil
        for fd in [group, processEvents, mountTable] where fd >= 0 { close(fd) }
        group = -1
        processEvents = -1
        mountTable = -1
        _ = setStatus(level: "off", reason: "stopped")
    }

    public var status: GuardStatus {
        var status = statusBox.withLock { $0 }
        if status.level == "fanotify" { status.fileSystems = watchedForMounts.withLock { $0.values.map(\.mountPoint).sorted() } }
        status.holders = holderCount.load(ordering: .relaxed)
        status.refusals = refusalCount.load(ordering: .relaxed)
        return status
    }

    private func setStatus(level: String, reason: String?) -> GuardStatus {
        let fileSystems = watchedForMounts.withLock { $0.values.map(\.mountPoint).sorted() }
        statusBox.withLock { $0 = GuardStatus(level: level, reason: reason, fileSystems: level == "fanotify" ? fileSystems : [], holders: 0, refusals: 0) }
        return status
    }

    // MARK: The mounts' side

    public func admit(thread: Int32, holding account: Account) -> String? {
        admitProcess(of: thread, account: account, receives: false) { process, rules, watched in
            // A file it can already write to, where the identity may not save, would receive the data.
            guard let (file, location) = Self.firstRefused(WritableFiles.of(process: process), watched: watched, rules: rules,
                                                           allowed: { rules.allows([account.upn], toSaveTo: $0) }) else { return nil }
            report(refusal: Refusal(thread: thread, process: process, identities: [account.upn], location: location, path: file.path,
                                    operation: "read (it holds a file open for writing there)", removedEmptyFile: false))
            return "it holds \(file.path) open for writing, in \(location), where \(account.upn)'s data may not be saved"
        }
    }

    public func admit(thread: Int32, writingInto account: Account) -> String? {
        admitProcess(of: thread, account: account, receives: true) { process, rules, watched in
            guard let (file, location) = Self.firstRefused(WritableFiles.readable(by: process), watched: watched, rules: rules,
                                                           allowed: { rules.allows([account.upn], toOpenFrom: $0) }) else { return nil }
            report(refusal: Refusal(thread: thread, process: process, identities: [account.upn], location: location, path: file.path,
                                    operation: "write into the identity's file (it reads a file from there)", removedEmptyFile: false, openFrom: true))
            return "it reads \(file.path), in \(location), from where \(account.upn)'s policy opens no data"
        }
    }

    /// The first of `files` on a watched file system whose location `allowed` refuses, with that
    /// location (the one configured for its path, else its file system's).
    private static func firstRefused(_ files: [WritableFile], watched: [UInt64: WatchedFileSystem], rules: SaveRules,
                                     allowed: (String) -> Bool) -> (file: WritableFile, location: String)? {
        for file in files {
            guard let fileSystem = watched[file.device] else { continue }
            let location = rules.configuredLocation(of: file.path) ?? fileSystem.location
            if !allowed(location) { return (file, location) }
        }
        return nil
    }

    /// What both admissions share: the process of `thread`, unless it is known to be admitted for
    /// `account` already, is checked by `conflict` (a reason to refuse, or nil), then handed to the
    /// guard's thread as a holder (`receives`: a receiver) and, when the guard has it, remembered.
    private func admitProcess(of thread: Int32, account: Account, receives: Bool,
                              _ conflict: (Int32, SaveRules, [UInt64: WatchedFileSystem]) -> String?) -> String? {
        guard running.load(ordering: .acquiring) else { return nil }
        let table = LinuxProcessTable()
        guard let process = table.process(ofThread: thread), process != getpid(), let start = table.startTime(of: process) else { return nil }
        let key = Admission(process: process, receives: receives)
        let known = admitted.withLock { $0[key] }
        if let known, known.start == start, known.identities.contains(account.upn) { return nil }
        let rules = engine.saveRules()
        if let reason = conflict(process, rules, watchedForMounts.withLock { $0 }) { return reason }
        // A holder's helpers at the other end of its socketpairs (rsync's writer) hold it too.
        let processes = receives ? [process] : [process] + SocketPairs.peers(of: process)
        var waits: [DispatchSemaphore] = []
        requests.withLock { queue in
            for each in processes {
                let done = DispatchSemaphore(value: 0)
                waits.append(done)
                queue.append(HoldRequest(process: each, identities: [account.upn], receives: receives, rules: rules, done: done))
            }
        }
        signalWake()
        for done in waits where done.wait(timeout: .now() + 5) != .success { return "the guard did not answer" }
        admitted.withLock { table in
            if table.count > 8192 { table.removeAll() }
            var identities = table[key].flatMap { $0.start == start ? $0.identities : nil } ?? []
            identities.insert(account.upn)
            table[key] = (start, identities)
        }
        return nil
    }

    private func signalWake() {
        var one: UInt64 = 1
        _ = write(wake, &one, 8)
    }

    private func report(_ report: Report) {
        reports.withLock { $0.append(report) }
        reporterWake.signal()
    }

    // MARK: The guard thread

    private func guardLoop() {
        var fds = [pollfd(fd: group, events: Int16(POLLIN), revents: 0), pollfd(fd: processEvents, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: wake, events: Int16(POLLIN), revents: 0), pollfd(fd: mountTable, events: Int16(POLLPRI), revents: 0)]
        while running.load(ordering: .acquiring) {
            for index in fds.indices { fds[index].revents = 0 }
            let ready = poll(&fds, nfds_t(fds.count), 1000)
            if ready < 0, errno != EINTR { break }
            followProcesses()
            if fds[2].revents != 0 {
                var value: UInt64 = 0
                _ = read(wake, &value, 8)
                applyRequests()
            }
            if fds[3].revents != 0 { refreshFileSystems() }
            if fds[0].revents != 0 { answerOpens() }
            updateMarks()
            if holders.membership != savedMembership {
                savedMembership = holders.membership
                report(.holders(holders.processes))
            }
        }
        if armed { _ = clinux_guard_unmark_all(group) }
        armed = false
    }

    /// Reads every pending process event; after lost events, looks at /proc again.
    private func followProcesses() {
        while true {
            let count = processEventBuffer.withUnsafeMutableBufferPointer { clinux_process_events_read(processEvents, $0.baseAddress, Int32($0.count)) }
            if count < 0 {
                // Lost events matter only while somebody holds data (a busy machine loses some).
                if errno == ENOBUFS, !holders.isEmpty || !receivers.isEmpty {
                    resynchronize()
                    report(.message("process events were lost; the holders were read from /proc again"))
                }
                return
            }
            for event in processEventBuffer.prefix(Int(count)) {
                holders.apply(event)
                receivers.apply(event)
            }
            if count < processEventBuffer.count { break }
        }
        holderCount.store(holders.processes.count, ordering: .relaxed)
    }

    private func resynchronize() {
        var children: [(process: Int32, parent: Int32, start: UInt64)] = []
        if !holders.isEmpty {
            for pid in Syscall.numberedEntries("/proc") ?? [] {
                guard let stat = ProcessStat(pid) else { continue }
                children.append((pid, stat.parent, stat.start))
            }
        }
        holders.resynchronize(threads: Self.threads(of:), children: children)
        receivers.resynchronize(threads: Self.threads(of:), children: children)
    }

    private func applyRequests() {
        let pending = requests.withLock { queue in
            defer { queue.removeAll() }
            return queue
        }
        for request in pending {
            if request.rules.generation >= rules.generation { rules = request.rules }
            guard !request.identities.isEmpty else {
                request.done.signal()
                continue
            }
            let since = ProcessStat.now()
            let threads = Self.threads(of: request.process) ?? []
            if request.receives {
                receivers.hold(request.process, identities: request.identities, threads: threads, since: since)
            } else {
                holders.hold(request.process, identities: request.identities, threads: threads, since: since)
            }
            holderCount.store(holders.processes.count, ordering: .relaxed)
            updateMarks()
            request.done.signal()
        }
    }

    /// Marks the watched file systems while a process holds data, and only then: with no holder
    /// the kernel asks nothing.
    private func updateMarks() {
        let anyone = !holders.isEmpty || !receivers.isEmpty
        if anyone, !armed {
            for fileSystem in watched.values where clinux_guard_mark(group, fileSystem.mountPoint, 1) != 0 {
                report(.message("cannot watch \(fileSystem.mountPoint): \(String(cString: strerror(errno)))"))
            }
            armed = true
        } else if !anyone, armed {
            _ = clinux_guard_unmark_all(group)
            armed = false
        }
    }

    private func refreshFileSystems() {
        // Custody's own mounts are left out by their type (fuse.custody).
        let current = FileSystemSelection.select(selection)
        if armed {
            for (device, fileSystem) in current where watched[device] == nil && clinux_guard_mark(group, fileSystem.mountPoint, 1) != 0 {
                report(.message("cannot watch \(fileSystem.mountPoint): \(String(cString: strerror(errno)))"))
            }
        }
        watched = current
        mountDevices = Set(MountTable.entries().filter { $0.fileSystemType == "fuse.custody" }.compactMap { FileSystemSelection.device($0.device) })
        watchedForMounts.withLock { $0 = current }
    }

    private func answerOpens() {
        while true {
            let count = openEventBuffer.withUnsafeMutableBufferPointer { clinux_guard_read(group, $0.baseAddress, Int32($0.count)) }
            guard count > 0 else { return }
            // A fork just before the open is known before the open is judged.
            followProcesses()
            applyRequests()
            for event in openEventBuffer.prefix(Int(count)) {
                wakeBoost?.noteRequest()
                _ = clinux_guard_answer(group, event.fd, decide(event) ? 1 : 0)
            }
        }
    }

    /// Whether the open of `event.fd` by `event.tid` may go on. A thread of a process that holds
    /// nothing and writes into no managed file: yes, at once. A holder: reading, yes; creating or
    /// writing, only where every identity it holds may save. A writer into managed files: reading
    /// data only from where its identities may open from, while it still has such a file open.
    private func decide(_ event: clinux_open_event) -> Bool {
        let holding = holders.holder(ofThread: event.tid)
        let receiving = receivers.holder(ofThread: event.tid)
        guard holding != nil || receiving != nil else { return true }
        let intent = OpenIntent.of(thread: event.tid)
        var info = stat()
        guard fstat(event.fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG,
              let fileSystem = watched[UInt64(info.st_dev)] else { return true }
        let path = (try? Syscall.readlink("/proc/self/fd/\(event.fd)")) ?? ""
        let location = rules.configuredLocation(of: path) ?? fileSystem.location
        if let (process, holder) = holding, intent != .read, !rules.allows(holder.identities, toSaveTo: location) {
            let removed = intent.creates && Self.removeIfJustCreated(path, info, exclusive: intent.exclusive)
            refusalCount.add(1, ordering: .relaxed)
            report(refusal: Refusal(thread: event.tid, process: process, identities: holder.identities.sorted(), location: location,
                                    path: path, operation: intent.creates ? "create" : "open for writing", removedEmptyFile: removed))
            return false
        }
        if let (process, receiver) = receiving, intent.reads, info.st_uid != 0, info.st_size > 0,
           !rules.allows(receiver.identities, toOpenFrom: location) {
            // Only while it can still write into a managed file: afterwards it is an ordinary process.
            // Descriptors only: reading /proc/PID/maps takes the process's memory lock, which a thread of
            // it faulting on a file of a mount may hold while it waits for this daemon.
            guard WritableFiles.descriptors(of: process, { $0 != O_RDONLY }).contains(where: { mountDevices.contains($0.device) }) else {
                receivers.drop(process)
                return true
            }
            refusalCount.add(1, ordering: .relaxed)
            report(refusal: Refusal(thread: event.tid, process: process, identities: receiver.identities.sorted(), location: location,
                                    path: path, operation: "read (it writes into the identity's files)", removedEmptyFile: false, openFrom: true))
            return false
        }
        return true
    }

    /// The kernel asks about an open with O_CREAT after it made the file: a file this open made
    /// (empty, one link, changed in the last two seconds, or O_EXCL) is removed before the answer.
    static func removeIfJustCreated(_ path: String, _ info: stat, exclusive: Bool) -> Bool {
        guard info.st_size == 0, info.st_nlink == 1, path.hasPrefix("/") else { return false }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        guard exclusive || now.tv_sec - info.st_ctim.tv_sec <= 2 else { return false }
        let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) ?? path.utf8.startIndex
        let parent = slash == path.utf8.startIndex ? "/" : String(path[..<slash])
        let name = String(path[path.utf8.index(after: slash)...])
        let directory = open(parent, clinux_O_PATH | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { return false }
        defer { close(directory) }
        var current = stat()
        guard fstatat(directory, name, &current, AT_SYMLINK_NOFOLLOW) == 0, current.st_dev == info.st_dev, current.st_ino == info.st_ino else { return false }
        return unlinkat(directory, name, 0) == 0
    }

    static func threads(of process: Int32) -> [Int32]? { Syscall.numberedEntries("/proc/\(process)/task") }

    // MARK: Holders across restarts

    struct SavedHolder: Codable {
        var process: Int32
        /// The process's start time (clock ticks since boot): a reused ID is another process.
        var start: UInt64
        var since: UInt64
        var identities: [String]
    }

    /// Writes the holders (reporter thread: it may open files; the guard's thread may not).
    private func saveHolders(_ table: [Int32: ProcessHolders.Holder]) {
        var saved: [SavedHolder] = []
        for (process, holder) in table.sorted(by: { $0.key < $1.key }) {
            // A wiped (or deregistered) identity's name does not linger in the state directory.
            let identities = holder.identities.filter { (try? engine.account($0)) != nil }.sorted()
            guard !identities.isEmpty, let stat = ProcessStat(process) else { continue }
            saved.append(SavedHolder(process: process, start: stat.start, since: holder.since, identities: identities))
        }
        do {
            try engine.writeStateFile(saved, to: Self.holdersFile)
        } catch {
            log("cannot keep the holders in \(engine.stateDirectory)/\(Self.holdersFile): \(error)")
        }
    }

    /// Takes up the holders a previous run kept that still run (same ID and start time), and the
    /// processes they started since (before the threads start: no other thread reads the table).
    private func restoreHolders() {
        guard let saved = try? engine.readStateFile([SavedHolder].self, from: Self.holdersFile) else { return }
        var restored = 0
        for entry in saved {
            guard let stat = ProcessStat(entry.process), stat.start == entry.start else { continue }
            holders.hold(entry.process, identities: Set(entry.identities), threads: Self.threads(of: entry.process) ?? [], since: entry.since)
            restored += 1
        }
        guard restored > 0 else { return }
        resynchronize()
        holderCount.store(holders.processes.count, ordering: .relaxed)
        log("\(restored) process\(restored == 1 ? "" : "es") still hold\(restored == 1 ? "s" : "") managed data from before the restart")
    }

    // MARK: The reporter

    private func reporterLoop() {
        var generation = engine.currentPolicyGeneration
        while running.load(ordering: .acquiring) {
            _ = reporterWake.wait(timeout: .now() + 0.5)
            let pending = reports.withLock { queue in
                defer { queue.removeAll() }
                return queue
            }
            for item in pending {
                switch item {
                case .message(let text):
                    log(text)
                case .holders(let table):
                    saveHolders(table)
                case .refusal(let refusal):
                    let executable = refusal.executable, uid = refusal.uid
                    let names = refusal.identities.joined(separator: ", ")
                    let reason = refusal.openFrom ? "\(refusal.location) is not among the open-from locations of \(names)"
                        : "\(refusal.location) is not among the save-to locations of \(names)"
                            + (refusal.removedEmptyFile ? "; the empty file the open made was removed" : "")
                    engine.reportBlockedSave(pid: refusal.process, uid: uid, executable: executable, identities: refusal.identities,
                                             location: refusal.location, path: refusal.path, operation: refusal.operation,
                                             reason: reason, openFrom: refusal.openFrom)
                }
            }
            // New policies or settings reach the guard thread as new rules.
            let current = engine.currentPolicyGeneration
            if current != generation {
                generation = current
                let rules = engine.saveRules()
                let done = DispatchSemaphore(value: 0)
                requests.withLock { $0.append(HoldRequest(process: 0, identities: [], rules: rules, done: done)) }
                signalWake()
            }
        }
    }
}
