import CustodySystem
import Synchronization

/// Something the engine did, for the control socket's event stream and for the mount.
public struct EngineEvent: Codable, Equatable, Sendable {
    public enum Kind: String, Codable, Sendable {
        case registered, enrolled, enrollmentFailed, policyChanged, policyUnchanged, deregistered
        case passphraseChanged, lockRequested, locked, unlocked, unlockFailed, unlockAttemptsExceeded
        case identityBound, identityUnbound, transferBlocked, saveBlocked, openFromBlocked, machineKeyChanged, tamperDetected
        case wipeStarted, wipeProgress, wipeFinished, wipeFailed, reprotectRequired, reprotectProgress, reprotectFinished
        case stateProblem, tornWrite, fileRepaired, allowedAccountsChanged, accountNotAllowed, policyRequired, identityExported
        case keysRotated
    }

    public var sequence: UInt64
    /// Wall-clock seconds since 1970.
    public var time: Double
    public var kind: Kind
    public var identity: String?
    /// The SDK status code where one applies (100 NewPoliciesReceived, 101 PoliciesHaveNotChanged,
    /// 102 WipeReceived, 104 UnenrollmentSuccess, 2xx failures).
    public var code: Int?
    public var message: String
    public var details: [String: String]
}

/// Delivers engine events to subscribers, in order, and keeps the most recent ones.
public final class EventBus: @unchecked Sendable {
    public typealias Handler = @Sendable (EngineEvent) -> Void

    private struct State {
        var nextSequence: UInt64 = 1
        var recent: [EngineEvent] = []
        var subscribers: [Int: Handler] = [:]
        var nextToken = 1
    }

    private let state = Mutex(State())
    private let delivery = Mutex(())
    public let capacity: Int

    public init(capacity: Int = 1000) { self.capacity = capacity }

    @discardableResult
    public func emit(_ kind: EngineEvent.Kind, identity: String? = nil, code: Int? = nil, _ message: String, details: [String: String] = [:]) -> EngineEvent {
        // One emitter at a time, so every subscriber sees events in sequence order.
        delivery.withLock { _ in
            let (event, handlers) = state.withLock { state in
                let event = EngineEvent(sequence: state.nextSequence, time: wallClockSeconds(), kind: kind, identity: identity,
                                        code: code, message: message, details: details)
                state.nextSequence += 1
                state.recent.append(event)
                if state.recent.count > capacity { state.recent.removeFirst(state.recent.count - capacity) }
                return (event, Array(state.subscribers.values))
            }
            for handler in handlers { handler(event) }
            return event
        }
    }

    /// Calls `handler` for every later event; returns a token for `unsubscribe`.
    public func subscribe(_ handler: @escaping Handler) -> Int {
        state.withLock { state in
            let token = state.nextToken
            state.nextToken += 1
            state.subscribers[token] = handler
            return token
        }
    }

    public func unsubscribe(_ token: Int) {
        _ = state.withLock { $0.subscribers.removeValue(forKey: token) }
    }

    /// Kept events after `sequence` (0: all kept).
    public func events(after sequence: UInt64 = 0) -> [EngineEvent] {
        state.withLock { $0.recent.filter { $0.sequence > sequence } }
    }
}
