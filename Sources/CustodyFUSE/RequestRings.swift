import CFuse3
import CFuseRing
import CustodyMetrics
import CustodySystem
import Glibc
import Synchronization

/// Requests served on the CPU that sent them: FUSE over io_uring (Linux 6.14 and later).
///
/// Through /dev/fuse, a request wakes whichever daemon thread waits, wherever it last ran, and the
/// answer wakes the caller again: two hand-overs between CPUs per round trip. On a machine whose
/// idle CPUs halt (most virtual machines), waking a halted CPU costs tens of microseconds, more
/// than the request. With rings the kernel puts a request in the queue of the caller's CPU, where
/// a thread pinned to that CPU takes it: the caller blocks, its CPU switches to the daemon's
/// thread, and no other CPU has to be woken.
///
/// The answer is the other half. Waking the caller from a busy CPU, the scheduler prefers an idle
/// one, so the caller would move to the other (halted) CPU at every answer. Ring threads therefore
/// run at idle priority (SCHED_IDLE): a CPU that runs only them counts as idle, so the caller is
/// woken where it was, and takes the CPU from the ring thread at once. `RingPriorityGuard` puts
/// them back at normal priority whenever other work keeps them from running.
///
/// Each queue (one per possible CPU) has one thread and a ring of several entries. The thread
/// serves what is answered from memory or with one short call where it arrived, and hands
/// requests that may wait (an fsync, a large read or write, a truncation …) to worker threads, so
/// one user's wait for a slow disk never holds up another user's requests from the same CPU; the
/// ring registers more entries while workers hold some. libfuse 3.14 predates rings: a request
/// from a ring is handed to its parser as if read from /dev/fuse, and its answer is steered back
/// into the ring entry by a custom I/O (`CFuseRing`). FORGET, INTERRUPT and notifications keep
/// using /dev/fuse, as does everything when the kernel does not offer rings (before 6.14, or with
/// the `fuse.enable_uring` module parameter off).
///
/// Teardown (`stop`): the ring threads stop and are joined, then the workers finish the requests
/// handed to them and are joined, and only then are the rings freed. No thread reads a ring that
/// may be freed: each ring is read by its own thread, by the priority guard (stopped first), and
/// by answers from other threads, which find it under the transport's lock.
final class RequestRings: @unchecked Sendable {
    /// How setting up the rings went, for the log.
    enum State: Sendable, Equatable {
        /// Rings are not used: the reason.
        case unavailable(String)
        /// Rings were made; whether the kernel took them shows in `offeredToKernel` and `ringRequests`.
        case started
    }

    private let session: OpaquePointer
    private let transport: OpaquePointer
    private let queues: Int
    /// The most workers serving requests that may wait.
    let mostWorkers: Int
    /// Every ring thread that was started (kept after they stop, for the counts).
    private let threads = Mutex<[RingThread]>([])
    /// Ring threads not joined yet.
    private let running = Mutex<[RingThread]>([])
    /// Worker threads not joined yet.
    private let workers = Mutex<[pthread_t]>([])
    private var priorityGuard: RingPriorityGuard?
    /// Requests served through the rings so far (handed-off ones included).
    var ringRequests: UInt64 {
        threads.withLock { $0.reduce(0) { $0 &+ $1.served.load(ordering: .relaxed) } }
    }
    /// Requests handed from a ring's thread to a worker so far.
    var handedOff: UInt64 {
        threads.withLock { $0.reduce(0) { $0 &+ $1.handedOff.load(ordering: .relaxed) } }
    }
    /// Times a CPU's ring threads went back to normal priority because other work kept them waiting.
    var priorityRaises: UInt64 { priorityGuard?.raises.load(ordering: .relaxed) ?? 0 }
    /// Set by `stop()`: a thread still waiting for INIT gives up.
    private let stopping = Atomic<Bool>(false)
    private let metrics: MountMetrics?
    private(set) var state: State = .unavailable("not started")

    /// One CPU's thread and its ring.
    final class RingThread: @unchecked Sendable {
        let queue: Int
        var ring: OpaquePointer?
        var thread = pthread_t()
        /// The thread's ID (for its priority and its scheduler statistics).
        var threadID: pid_t = 0
        /// Requests this ring took, and how many of them it handed to workers.
        let served = Atomic<UInt64>(0)
        let handedOff = Atomic<UInt64>(0)
        /// Posted once the ring exists (or could not be made), then waited on for `go`.
        let created = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        let go = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
        var creationError: Int32 = 0
        var proceed = false
        init(queue: Int) {
            self.queue = queue
            sem_init(created, 0, 0)
            sem_init(go, 0, 0)
        }
        deinit {
            sem_destroy(created)
            sem_destroy(go)
            created.deallocate()
            go.deallocate()
        }
    }

    /// Installs the custom I/O on a mounted session whose loop has not started. nil when the
    /// session refuses it (nothing changed then). `workers`: the most threads serving requests
    /// that may wait.
    init?(session: OpaquePointer, key: UnsafeMutableRawPointer, workers: Int, metrics: MountMetrics? = nil) {
        var error: Int32 = 0
        let mostWorkers = max(1, workers)
        guard let transport = custody_fuse_transport_install(session, key, Int32(mostWorkers), &error) else { return nil }
        self.session = session
        self.transport = transport
        self.queues = Int(custody_fuse_possible_cpus())
        self.mostWorkers = mostWorkers
        self.metrics = metrics
    }

    /// Makes one ring per CPU on its own thread, pinned to that CPU. When every queue has its
    /// ring, the INIT answer offers them to the kernel (which then holds requests until each
    /// queue has an entry), so this must run before the session loop reads INIT.
    func start() {
        guard queues > 0, queues <= 1024 else {
            state = .unavailable("too many CPUs (\(queues))")
            return
        }
        guard Self.kernelAllowsRings() || Self.allowRingsInKernel() else {
            state = .unavailable("the kernel does not offer FUSE over io_uring (its fuse.enable_uring parameter is off or missing)")
            return
        }
        var made: [RingThread] = []
        for queue in 0..<queues {
            let ringThread = RingThread(queue: queue)
            guard let thread = try? DaemonThread.start("custody-ring\(queue)", { [self] in serve(ringThread) }) else { break }
            ringThread.thread = thread
            made.append(ringThread)
        }
        for ringThread in made { while sem_wait(ringThread.created) != 0 {} }
        let failed = made.count < queues || made.contains { $0.ring == nil }
        if !failed { custody_fuse_transport_offer_rings(transport) }
        for ringThread in made {
            ringThread.proceed = !failed
            sem_post(ringThread.go)
        }
        threads.withLock { $0 = made }
        running.withLock { $0 = made }
        if failed {
            let code = made.first(where: { $0.creationError != 0 })?.creationError ?? EAGAIN
            state = .unavailable("cannot make io_uring rings: \(String(cString: strerror(code)))")
            stop()
            return
        }
        state = .started
        // Idle priority only where starvation can be seen and undone.
        if RingPriorityGuard.canGuard(made) {
            priorityGuard = RingPriorityGuard(threads: made, onRaise: { [metrics] in metrics?.ringPriorityRaises.increment() },
                                              isStopping: { [unowned self] in self.stopping.load(ordering: .acquiring) })
            priorityGuard?.start()
        }
    }

    /// Whether INIT was answered with the rings (the kernel then serves every request through them).
    var offeredToKernel: Bool { custody_fuse_transport_rings_offered(transport) != 0 }

    /// Stops serving: the ring threads stop and are joined, the workers finish what was handed to
    /// them and are joined, and then the rings are freed (after the mount is gone or the session
    /// loop ended; requests still in the kernel then end with the connection).
    func stop() {
        stopping.store(true, ordering: .releasing)
        priorityGuard?.stop()
        let ringThreads = running.withLock { list in
            let taken = list
            list = []
            return taken
        }
        for ringThread in ringThreads { if let ring = ringThread.ring { custody_fuse_ring_stop(ring) } }
        for ringThread in ringThreads { pthread_join(ringThread.thread, nil) }
        // No ring thread hands anything off any more: the workers end once the queue is empty.
        custody_fuse_handoff_stop(transport)
        let workerThreads = workers.withLock { list in
            let taken = list
            list = []
            return taken
        }
        for worker in workerThreads { pthread_join(worker, nil) }
        for ringThread in ringThreads {
            custody_fuse_ring_destroy(ringThread.ring)
            ringThread.ring = nil
        }
    }

    /// Gives back the memory a burst of waiting requests left in the entries the rings added for
    /// them (called when a burst of requests is over, `InodePruner`).
    func releaseMemory() {
        running.withLock { list in
            for ringThread in list { if let ring = ringThread.ring { custody_fuse_ring_release_memory(ring) } }
        }
    }

    /// Forgets the custom I/O state and frees the rings' buffers (after `fuse_session_destroy`).
    func remove() {
        custody_fuse_transport_remove(transport)
    }

    /// The kernel offers rings only with its `enable_uring` parameter on (a kernel without the
    /// parameter has no FUSE over io_uring).
    static func kernelAllowsRings(parameter: String = "/sys/module/fuse/parameters/enable_uring") -> Bool {
        guard let text = readTextFile(parameter) else { return false }
        return text.hasPrefix("Y") || text.hasPrefix("1")
    }

    /// Turns the kernel's `fuse.enable_uring` on where it is off and this process may (root, a
    /// writable /sys). It only lets FUSE servers ask for rings; nothing else changes. Returns
    /// whether rings are allowed afterwards.
    @discardableResult
    static func allowRingsInKernel(parameter: String = "/sys/module/fuse/parameters/enable_uring") -> Bool {
        if kernelAllowsRings(parameter: parameter) { return true }
        let fd = Glibc.open(parameter, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        _ = Glibc.write(fd, "Y", 1)
        Glibc.close(fd)
        return kernelAllowsRings(parameter: parameter)
    }

    // MARK: A ring's thread

    private func serve(_ ringThread: RingThread) {
        // A CPU this process may not use (a cpuset, an offline CPU) leaves the thread unpinned:
        // callers cannot run there either, so its queue stays empty.
        _ = custody_pin_thread(Int32(ringThread.queue))
        ringThread.threadID = custody_thread_id()
        var error: Int32 = 0
        ringThread.ring = custody_fuse_ring_create(transport, UInt32(ringThread.queue), &error)
        ringThread.creationError = ringThread.ring == nil ? error : 0
        sem_post(ringThread.created)
        while sem_wait(ringThread.go) != 0 {}
        // The ring is freed by `stop`, after this thread ended.
        guard let ring = ringThread.ring else { return }
        guard ringThread.proceed, registerWhenInitialized(ring) else { return }

        var request: UnsafeMutableRawPointer?
        var length = 0
        var entry: OpaquePointer?
        while true {
            let event = custody_fuse_ring_next(ring, &request, &length, &entry)
            switch event {
            case Int32(CUSTODY_RING_REQUEST.rawValue):
                ringThread.served.wrappingAdd(1, ordering: .relaxed)
                metrics?.ringRequests.increment()
                if let request, let entry { process(request, length, entry) }
            case Int32(CUSTODY_RING_HANDED_OFF.rawValue), Int32(CUSTODY_RING_WANTS_WORKER.rawValue):
                ringThread.served.wrappingAdd(1, ordering: .relaxed)
                ringThread.handedOff.wrappingAdd(1, ordering: .relaxed)
                metrics?.ringRequests.increment()
                metrics?.ringHandoffs.increment()
                if event == Int32(CUSTODY_RING_WANTS_WORKER.rawValue), !startWorker() {
                    // No thread to be had: serve what waits here rather than leave it waiting.
                    custody_fuse_handoff_worker_failed(transport)
                    while custody_fuse_handoff_take_now(transport, &request, &length, &entry) != 0 {
                        if let request, let entry { process(request, length, entry) }
                    }
                }
            case -EAGAIN:
                // A registration that came before INIT was answered: try again.
                guard registerWhenInitialized(ring) else { return }
            default:
                return   // stopped, or the connection is gone (-ENOTCONN)
            }
        }
    }

    /// Serves one request taken from a ring entry, on the calling thread.
    private func process(_ request: UnsafeMutableRawPointer, _ length: Int, _ entry: OpaquePointer) {
        custody_fuse_entry_begin(entry)
        var buffer = fuse_buf()
        buffer.mem = request
        buffer.size = length
        fuse_session_process_buf(session, &buffer)
        if custody_fuse_entry_end(entry) != 0 { metrics?.slowStoreRequests.increment() }
    }

    /// The name of worker threads (in /proc/PID/task/TID/comm).
    static let workerName = "custody-worker"

    /// Starts a worker for requests that may wait (asked for by a ring's thread, so before `stop`
    /// takes the list of workers to join).
    private func startWorker() -> Bool {
        guard let thread = try? DaemonThread.start(Self.workerName, { [self] in work() }) else { return false }
        workers.withLock { $0.append(thread) }
        return true
    }

    /// A worker: serves handed-off requests until `stop`, on any CPU, at normal priority (it is
    /// started by a ring's thread, whose CPU and idle priority it would otherwise inherit). One
    /// left without work for a while ends, unless it is the last.
    private func work() {
        _ = custody_unpin_thread(transport)
        var request: UnsafeMutableRawPointer?
        var length = 0
        var entry: OpaquePointer?
        while true {
            let taken = custody_fuse_handoff_take(transport, &request, &length, &entry)
            if taken > 0, let request, let entry {
                process(request, length, entry)
            } else if taken < 0 {
                // Nobody will join it: out of the list, and detached (unless `stop` has taken the
                // list already and joins it).
                workers.withLock { list in
                    guard let index = list.firstIndex(where: { pthread_equal($0, pthread_self()) != 0 }) else { return }
                    list.remove(at: index)
                    pthread_detach(pthread_self())
                }
                return
            } else if taken == 0 {
                return
            }
        }
    }

    /// Registers the ring's entries once INIT has been answered (the kernel sizes requests then).
    /// It keeps trying until then: once INIT offered the rings, the kernel holds every request
    /// until each queue has an entry, or until a registration fails (then it goes back to
    /// /dev/fuse), so a thread must not give up quietly.
    private func registerWhenInitialized(_ ring: OpaquePointer) -> Bool {
        while !stopping.load(ordering: .acquiring) {
            let maxWrite = Int(custody_fuse_transport_max_write(transport))
            if maxWrite > 0 {
                let result = custody_fuse_ring_register(ring, maxWrite)
                if result == 0 { return true }
                if result != -EAGAIN { return false }
            }
            usleep(500)
        }
        return false
    }
}
