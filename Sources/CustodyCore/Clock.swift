import Glibc
import Synchronization

/// The engine's time source (monotonic seconds). Injected so that tests run lock timers instantly.
public protocol EngineClock: Sendable {
    func now() -> Double
}

public struct SystemClock: EngineClock {
    public init() {}
    public func now() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }
}

/// A clock that moves only when told to.
public final class ManualClock: EngineClock {
    private let time: Mutex<Double>
    public init(_ start: Double = 1000) { time = Mutex(start) }
    public func now() -> Double { time.withLock { $0 } }
    public func advance(by seconds: Double) { time.withLock { $0 += seconds } }
}

/// Wall-clock seconds since 1970, for timestamps people read.
func wallClock() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_REALTIME, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}
