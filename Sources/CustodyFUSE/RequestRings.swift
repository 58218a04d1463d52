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
/// Each queue (one per possible CPU) gets `threadsPerQueue` threads, each with one ring entry, so
/// a request that blocks (an `fsync`) does not hold up the next one from the same CPU. libfuse
/// 3.14 predates rings: a request from a ring is handed to its parser as if read from /dev/fuse,
/// and its answer is steered back into the ring by a custom I/O (`CFuseRing`). FORGET, INTERRUPT
/// and notifications keep using /dev/fuse, as does everything when the kernel does not offer
/// rings (before 6.14, or with the `fuse.enable_uring` module parameter off).
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
    private let threadsPerQueue: Int
    private let workers = Mutex<[Worker]>([])
    private var priorityGuard: RingPriorityGuard?
    /// Requests served through the rings so far.
    var ringRequests: UInt64 {
        counted.withLock { $0.reduce(0) { $0 &+ $1.served.load(ordering: .relaxed) } }
    }
    /// Every worker that was started (kept after they stop, for the count).
    private let counted = Mutex<[Worker]>([])
    /// Times a CPU's ring threads went back to normal priority because other work kept them waiting.
    var priorityRaises: UInt64 { priorityGuard?.raises.load(ordering: .relaxed) ?? 0 }
    /// Set by `stop()`: a thread still waiting for INIT gives up.
    private let stopping = Atomic<Bool>(false)
    private let metrics: MountMetrics?
    private(set) var state: State = .unavailable("not started")

    /// One thread and its ring entry.
    final class Worker: @unchecked Sendable {
        let queue: Int
        var ring: OpaquePointer?
        var thread = pthread_t()
        /// The thread's ID (for its priority and its scheduler statistics).
        var threadID: pid_t = 0
        /// Requests this thread served.
        let served = Atomic<UInt64>(0)
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
    /// session refuses it (nothing changed then).
    init?(session: OpaquePointer, key: UnsafeMutableRawPointer, threadsPerQueue: Int, metrics: MountMetrics? = nil) {
        var error: Int32 = 0
        guard let transport = custody_fuse_transport_install(session, key, &error) else { return nil }
        self.session = session
        self.transport = transport
        self.queues = Int(custody_fuse_possible_cpus())
        self.threadsPerQueue = max(1, threadsPerQueue)
        self.metrics = metrics
    }

    /// Makes one ring per thread on its own thread, pinned to its queue's CPU. When every queue
    /// has its rings, the INIT answer offers them to the kernel (which then holds requests until
    /// each queue has an entry), so this must run before the session loop reads INIT.
    func start() {
        guard queues > 0, queues * threadsPerQueue <= 1024 else {
            state = .unavailable("too many CPUs (\(queues))")
            return
        }
        guard Self.kernelAllowsRings() || Self.allowRingsInKernel() else {
            state = .unavailable("the kernel does not offer FUSE over io_uring (its fuse.enable_uring parameter is off or missing)")
            return
        }
        var made: [Worker] = []
        for queue in 0..<queues {
            for _ in 0..<threadsPerQueue {
                let worker = Worker(queue: queue)
                let context = Unmanaged.passRetained(WorkerContext(rings: self, worker: worker))
                guard pthread_create(&worker.thread, nil, { raw in
                    guard let raw else { return nil }
                    let context = Unmanaged<WorkerContext>.fromOpaque(raw).takeRetainedValue()
                    context.rings.serve(context.worker)
                    return nil
                }, context.toOpaque()) == 0 else {
                    context.release()
                    break
                }
                made.append(worker)
            }
        }
        for worker in made { while sem_wait(worker.created) != 0 {} }
        let failed = made.count < queues * threadsPerQueue || made.contains { $0.ring == nil }
        if !failed { custody_fuse_transport_offer_rings(transport) }
        for worker in made {
            worker.proceed = !failed
            sem_post(worker.go)
        }
        workers.withLock { $0 = made }
        counted.withLock { $0 = made }
        if failed {
            let code = made.first(where: { $0.creationError != 0 })?.creationError ?? EAGAIN
            state = .unavailable("cannot make io_uring rings: \(String(cString: strerror(code)))")
            join()
            return
        }
        state = .started
        // Idle priority only where starvation can be seen and undone.
        if RingPriorityGuard.canGuard(made) {
            priorityGuard = RingPriorityGuard(workers: made, onRaise: { [metrics] in metrics?.ringPriorityRaises.increment() }, isStopping: { [unowned self] in self.stopping.load(ordering: .acquiring) })
            priorityGuard?.start()
        }
    }

    /// Whether INIT was answered with the rings (the kernel then serves every request through them).
    var offeredToKernel: Bool { custody_fuse_transport_rings_offered(transport) != 0 }

    /// Stops every ring's thread and waits for them (after the session loop ended and the mount
    /// is gone, so that no request is still waiting for a ring).
    func stop() {
        stopping.store(true, ordering: .releasing)
        priorityGuard?.stop()
        workers.withLock { list in
            for worker in list { if let ring = worker.ring { custody_fuse_ring_stop(ring) } }
        }
        join()
    }

    /// Forgets the custom I/O state and frees the rings' buffers (after `fuse_session_destroy`).
    func remove() {
        custody_fuse_transport_remove(transport)
    }

    private func join() {
        let list = workers.withLock { list in
            let taken = list
            list = []
            return taken
        }
        for worker in list {
            pthread_join(worker.thread, nil)
            custody_fuse_ring_destroy(worker.ring)
        }
    }

    private final class WorkerContext: @unchecked Sendable {
        let rings: RequestRings
        let worker: Worker
        init(rings: RequestRings, worker: Worker) {
            self.rings = rings
            self.worker = worker
        }
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

    private func serve(_ worker: Worker) {
        // A CPU this process may not use (a cpuset, an offline CPU) leaves the thread unpinned:
        // callers cannot run there either, so its queue stays empty.
        _ = custody_pin_thread(Int32(worker.queue))
        worker.threadID = custody_thread_id()
        var error: Int32 = 0
        worker.ring = custody_fuse_ring_create(transport, UInt32(worker.queue), &error)
        worker.creationError = worker.ring == nil ? error : 0
        sem_post(worker.created)
        while sem_wait(worker.go) != 0 {}
        // The ring is destroyed by `join`, after this thread ended: the guard may still read it.
        guard let ring = worker.ring else { return }
        guard worker.proceed, registerWhenInitialized(ring) else { return }

        var request: UnsafeMutableRawPointer?
        var length = 0
        while true {
            let event = custody_fuse_ring_next(ring, &request, &length)
            if event == Int32(CUSTODY_RING_REQUEST.rawValue), let request {
                worker.served.wrappingAdd(1, ordering: .relaxed)
                metrics?.ringRequests.increment()
                var buffer = fuse_buf()
                buffer.mem = request
                buffer.size = length
                fuse_session_process_buf(session, &buffer)
            } else if event == -EAGAIN {
                // A registration that came before INIT was answered: try again.
                guard registerWhenInitialized(ring) else { return }
            } else {
                return   // stopped, or the connection is gone (-ENOTCONN)
            }
        }
    }

    /// Registers the ring's entry once INIT has been answered (the kernel sizes requests then).
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
