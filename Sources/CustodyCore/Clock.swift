import CustodySystem
import Glibc
import Synchronization

/// The engine's time source (monotonic seconds). Injected so that tests run lock timers instantly.
public protocol EngineClock: Sendable {
    func now() -> Double
}

public struct SystemClock: EngineClock {
    public init() {}
    public func now() -> Double { monotonicSeconds() }
}

/// A clock that moves only when told to.
public final class ManualClock: EngineClock {
    private let time: Mutex<Double>
    public init(_ start: Double = 1000) { time = Mutex(start) }
    public func now() -> Double { time.withLock { $0 } }
    public func advance(by seconds: Double) { time.withLock { $0 += seconds } }
}
