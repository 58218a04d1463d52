import CustodySystem
import Glibc

/// A condition that did not come true in time; its description names what was awaited.
public struct TimedOut: Error, CustomStringConvertible {
    public let description: String
}

/// Polls `condition` (every `interval` seconds) until it holds; throws `TimedOut` naming `what`
/// after `timeout` seconds. The one way tests wait for something that happens on another thread
/// or in another process: a daemon coming up, a lock completing, a file appearing.
public func eventually(_ what: String, timeout: Double = 10, interval: Double = 0.01, _ condition: () throws -> Bool) throws {
    _ = try eventualValue(what, timeout: timeout, interval: interval) { try condition() ? true : nil }
}

/// Polls `body` until it yields a value, and returns it; throws `TimedOut` naming `what`. (A name
/// of its own: were it an overload of `eventually`, a closure answering `false` would be taken
/// for a value.)
@discardableResult
public func eventualValue<T>(_ what: String, timeout: Double = 10, interval: Double = 0.01, _ body: () throws -> T?) throws -> T {
    let deadline = monotonicSeconds() + timeout
    while true {
        if let value = try body() { return value }
        guard monotonicSeconds() < deadline else { throw TimedOut(description: "\(what): not within \(timeout) s") }
        usleep(useconds_t(interval * 1_000_000))
    }
}
