import CFuseRing
import CustodySystem
import Glibc
import Synchronization

/// Keeps the request rings' idle-priority threads (see `RequestRings`) from being starved.
///
/// A SCHED_IDLE thread runs only when nothing else wants its CPU. That is what keeps a caller on
/// the CPU that serves it: the caller blocks on its request and the CPU turns to the ring thread
/// at once. But a request nobody waits for on that CPU (a write-back, a read-ahead), or one from a
/// CPU kept busy by other programs, would wait for a scarce turn, and ring threads are pinned, so
/// no other CPU takes it. So this thread looks, every tick (20 ms while requests flow, 200 ms when
/// they do not), whether a request is waiting for a ring thread that does not run: the kernel sets
/// a flag in the ring's shared memory until the thread takes it (`IORING_SQ_TASKRUN`). A request
/// normally waits microseconds; when one still waits after 2 ms, that CPU's ring threads go back
/// to normal priority (a busy CPU does not halt, so nothing is lost by it). They return to idle
/// priority after a hold, which doubles (up to 30 s) when the CPU is found busy again soon after.
final class RingPriorityGuard: @unchecked Sendable {
    struct Tuning: Sendable {
        var busyTickNanoseconds: UInt64 = 20_000_000
        var quietTickNanoseconds: UInt64 = 200_000_000
        /// How long a request must wait before the guard acts.
        var patienceNanoseconds: UInt64 = 2_000_000
        var initialHoldNanoseconds: UInt64 = 1_000_000_000
        var longestHoldNanoseconds: UInt64 = 30_000_000_000
    }

    /// Whether ring threads can run at idle priority: their rings report waiting work.
    static func canGuard(_ threads: [RequestRings.RingThread]) -> Bool {
        !threads.isEmpty && threads.allSatisfy { thread in
            thread.threadID > 0 && thread.ring.map { custody_fuse_ring_reports_pending($0) != 0 } == true
        }
    }

    /// Times a CPU's ring threads went back to normal priority.
    let raises = Atomic<UInt64>(0)

    /// One CPU's ring threads and their priority.
    private struct Queue {
        var threads: [RequestRings.RingThread]
        var idle = false
        var normalUntil: UInt64 = 0
        var hold: UInt64
        var lastRaise: UInt64 = 0
    }

    private var queues: [Queue] = []
    private let tuning: Tuning
    private let isStopping: @Sendable () -> Bool
    private let wake = UnsafeMutablePointer<sem_t>.allocate(capacity: 1)
    private var thread: pthread_t?

    private let onRaise: @Sendable () -> Void

    init(threads: [RequestRings.RingThread], tuning: Tuning = Tuning(), onRaise: @escaping @Sendable () -> Void = {},
         isStopping: @escaping @Sendable () -> Bool) {
        self.tuning = tuning
        self.onRaise = onRaise
        self.isStopping = isStopping
        sem_init(wake, 0, 0)
        let byQueue = Dictionary(grouping: threads, by: \.queue)
        for key in byQueue.keys.sorted() {
            queues.append(Queue(threads: byQueue[key] ?? [], hold: tuning.initialHoldNanoseconds))
        }
    }

    deinit {
        sem_destroy(wake)
        wake.deallocate()
    }

    /// Puts every ring thread at idle priority and starts watching.
    func start() {
        for index in queues.indices { setIdle(&queues[index], true) }
        do throws(Errno) {
            thread = try DaemonThread.start("custody-prio") { [self] in run() }
        } catch {
            for index in queues.indices { setIdle(&queues[index], false) }
        }
    }

    func stop() {
        sem_post(wake)
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    private func run() {
        var lastServed: UInt64 = 0
        var busy = true
        while !isStopping() {
            if waitForStop(nanoseconds: busy ? tuning.busyTickNanoseconds : tuning.quietTickNanoseconds) { return }
            var served: UInt64 = 0
            for index in queues.indices {
                served &+= queues[index].threads.reduce(0) { $0 &+ $1.served.load(ordering: .relaxed) }
                check(&queues[index])
            }
            busy = served != lastServed
            lastServed = served
        }
    }

    private func check(_ queue: inout Queue) {
        let now = Self.now()
        if queue.idle {
            guard waiting(queue) else { return }
            // Seen waiting: look again until the patience is spent (a request normally waits
            // microseconds, so seeing one twice is rare; seeing one throughout is starvation).
            let deadline = now &+ tuning.patienceNanoseconds
            while Self.now() < deadline {
                usleep(250)
                guard waiting(queue) else { return }
            }
            // Busy again soon after the last hold: hold longer.
            queue.hold = now &- queue.lastRaise < queue.hold &* 2
                ? min(queue.hold &* 2, tuning.longestHoldNanoseconds) : tuning.initialHoldNanoseconds
            queue.lastRaise = now
            queue.normalUntil = now &+ queue.hold
            setIdle(&queue, false)
            raises.wrappingAdd(1, ordering: .relaxed)
            onRaise()
        } else if now >= queue.normalUntil {
            setIdle(&queue, true)
        }
    }

    private func waiting(_ queue: Queue) -> Bool {
        queue.threads.contains { thread in thread.ring.map { custody_fuse_ring_work_pending($0) != 0 } ?? false }
    }

    private func setIdle(_ queue: inout Queue, _ idle: Bool) {
        for thread in queue.threads {
            _ = custody_thread_set_idle_priority(thread.threadID, idle ? 1 : 0)
        }
        queue.idle = idle
    }

    private static func now() -> UInt64 { UInt64(max(0, monotonicNanoseconds())) }

    private func waitForStop(nanoseconds: UInt64) -> Bool {
        var deadline = timespec()
        clock_gettime(CLOCK_REALTIME, &deadline)
        let total = UInt64(deadline.tv_nsec) + nanoseconds
        deadline.tv_sec += Int(total / 1_000_000_000)
        deadline.tv_nsec = Int(total % 1_000_000_000)
        while true {
            if sem_timedwait(wake, &deadline) == 0 { return true }
            if errno != EINTR { return isStopping() }
        }
    }
}
