import Glibc
import Synchronization

/// Keeps idle CPUs able to wake at once while requests arrive back to back.
///
/// A FUSE round trip wakes two sleeping threads: the daemon's when the kernel queues a request and
/// the caller's when the reply comes. When a CPU with nothing to run halts (in a virtual machine,
/// an exit to the host), each of those wake-ups costs tens of microseconds, more than the request.
/// Linux lets a process ask for a bound on that latency (PM QoS, `/dev/cpu_dma_latency`); with a
/// bound of 0 idle CPUs poll instead of halting. Polling burns an idle CPU, so the request is held
/// only while requests are dense (a burst: `Tuning.burstRequests` within one window) and released
/// once a few windows in a row are quiet.
///
/// The hot path (`noteRequest`) is an atomic add and, while not boosted, a clock read.
public final class WakeLatencyBoost: @unchecked Sendable {
    public struct Tuning: Sendable {
        /// Requests within one window that start (and keep) a boost.
        public var burstRequests: UInt64 = 16
        /// Window length in nanoseconds.
        public var windowNanoseconds: UInt64 = 2_000_000
        /// Quiet windows in a row after which the boost ends.
        public var quietWindows: Int = 3
        public init() {}
    }

    /// The boost every mount of this process shares; nil when the process may not ask (not root,
    /// or no `/dev/cpu_dma_latency`, e.g. under a device policy that leaves it out).
    public static let shared: WakeLatencyBoost? = WakeLatencyBoost(path: "/dev/cpu_dma_latency", tuning: Tuning())

    /// "No constraint" for the CPU latency request (PM_QOS_CPU_LATENCY_DEFAULT_VALUE, microseconds).
    static let unconstrained: Int32 = 2_000_000_000

    private let descriptor: Int32
    private let tuning: Tuning
    private let requests = Atomic<UInt64>(0)
    private let boosted = Atomic<Bool>(false)
    private let windowStart = Atomic<UInt64>(0)
    private let windowCount = Atomic<UInt64>(0)
    private let engagements = Atomic<UInt64>(0)
    private let wake: UnsafeMutablePointer<sem_t>

    /// Opens the latency request (it starts unconstrained) and starts the thread that ends boosts.
    init?(path: String, tuning: Tuning) {
        let fd = Glibc.open(path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        descriptor = fd
        self.tuning = tuning
        wake = .allocate(capacity: 1)
        sem_init(wake, 0, 0)
        guard Self.write(fd, Self.unconstrained) else {
            Glibc.close(fd)
            sem_destroy(wake)
            wake.deallocate()
            return nil
        }
        do throws(Errno) {
            try DaemonThread.start("custody-wake", detached: true) { [self] in run() }
        } catch {
            Glibc.close(fd)
            return nil
        }
    }

    /// Whether the latency bound is held now.
    public var isBoosted: Bool { boosted.load(ordering: .relaxed) }

    /// How many boosts have started since the process started.
    public var boostCount: UInt64 { engagements.load(ordering: .relaxed) }

    /// Called once per request.
    @inline(__always)
    public func noteRequest() {
        requests.wrappingAdd(1, ordering: .relaxed)
        if boosted.load(ordering: .relaxed) { return }
        noteIdleRequest()
    }

    private func noteIdleRequest() {
        let now = Self.monotonicNanoseconds()
        let start = windowStart.load(ordering: .relaxed)
        if now &- start >= tuning.windowNanoseconds {
            // A new window (two threads may both start one; either count is close enough).
            windowStart.store(now, ordering: .relaxed)
            windowCount.store(1, ordering: .relaxed)
            return
        }
        let count = windowCount.wrappingAdd(1, ordering: .relaxed).newValue
        if count >= tuning.burstRequests, boosted.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged {
            _ = Self.write(descriptor, 0)
            engagements.wrappingAdd(1, ordering: .relaxed)
            sem_post(wake)
        }
    }

    /// Waits for a boost to start, then samples the request count every window and ends the boost
    /// after `quietWindows` windows in a row with fewer than `burstRequests` requests.
    private func run() {
        while true {
            while sem_wait(wake) != 0 {}
            var last = requests.load(ordering: .relaxed)
            var quiet = 0
            while quiet < tuning.quietWindows {
                var pause = timespec(tv_sec: 0, tv_nsec: Int(tuning.windowNanoseconds))
                var remaining = timespec()
                while nanosleep(&pause, &remaining) != 0 && errno == EINTR { pause = remaining }
                let now = requests.load(ordering: .relaxed)
                quiet = now &- last >= tuning.burstRequests ? 0 : quiet + 1
                last = now
            }
            _ = Self.write(descriptor, Self.unconstrained)
            windowCount.store(0, ordering: .relaxed)
            boosted.store(false, ordering: .releasing)
        }
    }

    private static func write(_ fd: Int32, _ microseconds: Int32) -> Bool {
        var value = microseconds
        return withUnsafeBytes(of: &value) { Glibc.write(fd, $0.baseAddress, $0.count) } == MemoryLayout<Int32>.size
    }

    private static func monotonicNanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
    }
}
