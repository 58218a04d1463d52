import Dispatch
import FoundationEssentials
import Glibc
import Synchronization

// The daemon's events as a program receives them: an AsyncSequence of `CustodyEvent`, each with a
// typed `change` (the SDK's enrollment statuses, policy and data-protection changes, wipes,
// locks), and the SDK's enrollment delegate fed from it.

/// The outcome of an enrollment, policy or unenrollment request, as the SDK's
/// `IntuneMAMEnrollmentStatus` object gives it to `IntuneMAMEnrollmentDelegate`.
public struct EnrollmentStatus: Equatable, Sendable {
    /// The account (its UPN, as the daemon's events name it).
    public var accountId: String?
    public var didSucceed: Bool
    /// The SDK's status code: 100 NewPoliciesReceived, 101 PoliciesHaveNotChanged, 104
    /// UnenrollmentSuccess; failures 2xx (208 AlreadyEnrolled, 209 AccountNotAllowed, 215 a wipe
    /// that failed, ...), as `docs/api.md` lists them.
    public var statusCode: Int
    /// What happened, in words (the SDK's `errorString`; set for successes too).
    public var errorString: String

    public init(accountId: String?, didSucceed: Bool, statusCode: Int, errorString: String) {
        self.accountId = accountId
        self.didSucceed = didSucceed
        self.statusCode = statusCode
        self.errorString = errorString
    }
}

/// A wipe's steps (`wipeStarted`, `wipeProgress`, `wipeFinished`, `wipeFailed`).
public enum WipePhase: String, Equatable, Sendable {
    case started, progress, finished, failed
}

/// What a lock event says (`lockRequested`: class A keys go after the grace period).
public enum LockChange: String, Equatable, Sendable {
    case lockRequested, locked, unlocked, unlockFailed, unlockAttemptsExceeded
}

/// Re-protection of existing files after an enrolment or a policy change (`reprotectRequired`,
/// `reprotectProgress`, `reprotectFinished`).
public enum ReprotectionPhase: String, Equatable, Sendable {
    case required, progress, finished
}

/// An event by what it means to an app. The SDK's notifications map to it:
/// `IntuneMAMPolicyDidChangeNotification` is `.policy`, `IntuneMAMDataProtectionDidChangeNotification`
/// `.dataProtection` (on Linux: the files of an identity being brought to its policy), and the
/// enrollment delegate's three calls are `.enrollment`, `.policy` and `.unenrollment`.
public enum CustodyChange: Equatable, Sendable {
    /// An enrolment succeeded (100) or failed (its error's code).
    case enrollment(EnrollmentStatus)
    /// A policy was set: 100 NewPoliciesReceived, 101 PoliciesHaveNotChanged.
    case policy(EnrollmentStatus)
    /// The account was deregistered (104 UnenrollmentSuccess; `wiped` after a selective wipe).
    case unenrollment(EnrollmentStatus, wiped: Bool)
    case wipe(account: String?, WipePhase, code: Int?, message: String)
    case lock(account: String?, LockChange, message: String)
    case dataProtection(account: String?, ReprotectionPhase, message: String)
    /// Anything else the daemon reports (registrations, bindings, blocked transfers, tampering ...):
    /// `CustodyEvent.kind` says which.
    case other(kind: String)
}

extension CustodyEvent {
    /// What the event means, typed.
    public var change: CustodyChange {
        func status(_ succeeded: Bool) -> EnrollmentStatus {
            EnrollmentStatus(accountId: identity, didSucceed: succeeded, statusCode: code ?? (succeeded ? 100 : 201), errorString: message)
        }
        switch kind {
        case "enrolled": return .enrollment(status(true))
        case "enrollmentFailed": return .enrollment(status(false))
        case "policyChanged", "policyUnchanged": return .policy(status(true))
        case "deregistered": return .unenrollment(status(true), wiped: details["wipe"] == "true")
        case "wipeStarted": return .wipe(account: identity, .started, code: code, message: message)
        case "wipeProgress": return .wipe(account: identity, .progress, code: code, message: message)
        case "wipeFinished": return .wipe(account: identity, .finished, code: code, message: message)
        case "wipeFailed": return .wipe(account: identity, .failed, code: code, message: message)
        case "reprotectRequired": return .dataProtection(account: identity, .required, message: message)
        case "reprotectProgress": return .dataProtection(account: identity, .progress, message: message)
        case "reprotectFinished": return .dataProtection(account: identity, .finished, message: message)
        default:
            if let lock = LockChange(rawValue: kind) { return .lock(account: identity, lock, message: message) }
            return .other(kind: kind)
        }
    }
}

/// The socket of a stream, for another thread to cut it.
final class StreamSocket: Sendable {
    private struct State {
        var fd: Int32 = -1
        var cancelled = false
    }
    private let state = Mutex(State())

    var cancelled: Bool { state.withLock { $0.cancelled } }

    func connected(_ fd: Int32) {
        let cancelled = state.withLock { state in
            state.fd = fd
            return state.cancelled
        }
        if cancelled { shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// Ends the stream: a blocked `recv` returns at once.
    func cancel() {
        state.withLock { state in
            state.cancelled = true
            if state.fd >= 0 { shutdown(state.fd, Int32(SHUT_RDWR)) }
        }
    }

    /// Before the socket is closed: no later `cancel` touches a descriptor number reused since.
    func closing() {
        state.withLock { $0.fd = -1 }
    }
}

extension ControlClient {
    /// The daemon's events (`GET /v1/events`), in order, as they happen: those after event
    /// `after` that the daemon still keeps (its last 1,000), then every new one; nil: only what
    /// happens from now on. A caller sees the events it may (an administrator every one, a user
    /// its own identities' and those naming none). With `follow` false the sequence ends after the
    /// kept ones.
    ///
    /// Errors are `CustodyClientError`: `.cannotConnect` when there is no daemon, `.server` when it
    /// refuses (503 at more than a few streams per user), `.streamEnded` when it stops or restarts
    /// while followed (a restarted daemon numbers its events from 1 again: open a new sequence with
    /// nil). Ending the iteration (leaving the loop, cancelling its task) closes the connection.
    public func events(after: UInt64? = nil, follow: Bool = true) -> AsyncThrowingStream<CustodyEvent, any Error> {
        let path = Endpoint.events.path(query: [("after", after.map(String.init) ?? "latest"), ("follow", String(follow))])
        let client = self
        return AsyncThrowingStream { continuation in
            let socket = StreamSocket()
            continuation.onTermination = { _ in socket.cancel() }
            DispatchQueue(label: "custody-events").async {
                var unreadable: String?
                do throws(CustodyClientError) {
                    let ended = try client.stream(path, connected: { socket.connected($0) }, closing: { socket.closing() }) { text in
                        guard !socket.cancelled else { return false }
                        guard let event = try? JSONDecoder().decode(CustodyEvent.self, from: Data(text.utf8)) else {
                            unreadable = text
                            return false
                        }
                        continuation.yield(event)
                        return true
                    }
                    if socket.cancelled {
                        continuation.finish()
                    } else if let unreadable {
                        continuation.finish(throwing: CustodyClientError.badResponse("not an event: \(unreadable)"))
                    } else if ended, !follow {
                        continuation.finish()
                    } else {
                        continuation.finish(throwing: CustodyClientError.streamEnded(path: client.socketPath))
                    }
                } catch {
                    continuation.finish(throwing: socket.cancelled ? nil : error)
                }
            }
        }
    }
}

/// The SDK's `IntuneMAMEnrollmentDelegate`: told the outcome of every enrolment, policy and
/// unenrolment, whoever asked for it (this program, custodyctl, an administrator, the daemon's
/// configuration at start).
public protocol EnrollmentDelegate: AnyObject, Sendable {
    /// `enrollmentRequestWithStatus:`
    func enrollmentRequest(with status: EnrollmentStatus)
    /// `policyRequestWithStatus:`
    func policyRequest(with status: EnrollmentStatus)
    /// `unenrollRequestWithStatus:`; `wiped` after a selective wipe.
    func unenrollRequest(with status: EnrollmentStatus, wiped: Bool)
}

extension EnrollmentDelegate {
    public func enrollmentRequest(with status: EnrollmentStatus) {}
    public func policyRequest(with status: EnrollmentStatus) {}
    public func unenrollRequest(with status: EnrollmentStatus, wiped: Bool) {}
}

extension EnrollmentManager {
    /// Calls `delegate` for every enrolment, policy and unenrolment from now on (or after event
    /// `after`, as `ControlClient.events`), until the calling task is cancelled (returns then) or
    /// the stream fails (throws, as `ControlClient.events`). Where the SDK has
    /// `IntuneMAMEnrollmentManager.instance().delegate = self`, run this in a task:
    /// `Task { try await enrollment.deliverEvents(to: self) }`.
    public func deliverEvents(to delegate: some EnrollmentDelegate, after: UInt64? = nil) async throws {
        for try await event in client.events(after: after) {
            switch event.change {
            case .enrollment(let status): delegate.enrollmentRequest(with: status)
            case .policy(let status): delegate.policyRequest(with: status)
            case .unenrollment(let status, let wiped): delegate.unenrollRequest(with: status, wiped: wiped)
            default: break
            }
        }
    }
}
