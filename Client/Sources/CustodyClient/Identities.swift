import FoundationEssentials
import Glibc

// Which identity a process or a thread works as, by the SDK's names (IntuneMAMPolicyManager's
// `setProcessAccountId`, `getProcessAccountId`, `setCurrentThreadAccountId`,
// `getCurrentThreadAccountId`), over `POST /v1/bindings`, `DELETE /v1/bindings/{pid}` and
// `GET /v1/processes/{pid}/identity`. On Linux the identity is the daemon's to know, because the
// mount decides by it who owns a new file and what may be read: a binding is kept by the daemon,
// follows the process's children, and ends when the process (or thread) exits.

/// The calling OS thread's ID (`/proc/thread-self` names it).
func currentThreadID() throws(CustodyClientError) -> Int32 {
    var buffer = [CChar](repeating: 0, count: 64)
    let count = readlink("/proc/thread-self", &buffer, buffer.count - 1)
    guard count > 0 else { throw .badResponse("cannot read /proc/thread-self: \(String(cString: strerror(errno)))") }
    let link = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    guard let last = link.split(separator: "/").last, let tid = Int32(last) else { throw .badResponse("/proc/thread-self is \(link)") }
    return tid
}

extension PolicyManager {
    /// `setProcessAccountId:`: this process, and the children it starts from now on, work as
    /// `account` (an enrolled or registered account's ID or UPN); nil removes the binding, and the
    /// process works as its user's default identity again.
    public func setProcessAccountId(_ account: String?) async throws(CustodyClientError) {
        let client = self.client
        let pid = getpid()
        try await offload { () throws(CustodyClientError) in
            if let account {
                _ = try client.call(Endpoint.bind, json: BindRequest(pid: pid, identity: account), as: ProcessIdentity.self)
            } else {
                _ = try client.call(Endpoint.unbind, String(pid), as: ControlClient.Empty.self)
            }
        }
    }

    /// `getProcessAccountId`: the identity this process works as (its binding, an ancestor's,
    /// its user's default, the primary account), nil for none.
    public func getProcessAccountId() async throws(CustodyClientError) -> String? {
        try await identity(ofProcess: getpid()).identity
    }

    /// The identity process (or thread) `pid` works as, and where it comes from (`source`:
    /// thread, process, ancestor, uid default, primary, none).
    public func identity(ofProcess pid: Int32) async throws(CustodyClientError) -> ProcessIdentity {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.processIdentity, String(pid), as: ProcessIdentity.self)
        }
    }

    /// `setCurrentThreadAccountId:`: the calling OS thread works as `account`, whatever its
    /// process's identity; nil removes the thread's binding. Blocking and bound to the thread that
    /// calls it (Swift tasks move between threads: call it from a thread of your own).
    public func setCurrentThreadAccountId(_ account: String?) throws(CustodyClientError) {
        let tid = try currentThreadID()
        if let account {
            _ = try client.call(Endpoint.bind, json: BindRequest(tid: tid, identity: account), as: ProcessIdentity.self)
        } else {
            _ = try client.call(Endpoint.unbind, String(tid), query: [("thread", "true")], as: ControlClient.Empty.self)
        }
    }

    /// `getCurrentThreadAccountId`: the identity the calling OS thread works as (its own binding,
    /// else its process's), nil for none. Blocking, as `setCurrentThreadAccountId`.
    public func getCurrentThreadAccountId() throws(CustodyClientError) -> String? {
        try client.call(Endpoint.processIdentity, String(try currentThreadID()), as: ProcessIdentity.self).identity
    }
}

/// Locking and unlocking an identity (`POST /v1/accounts/{identity}/lock` and `unlock`): what
/// the SDK leaves to the device's passcode, which on Linux is the login session (the daemon
/// follows logind) or these calls.
public struct LockManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    /// Locks `account`: its class A keys go after the grace period, class B keys at once.
    @discardableResult
    public func lock(_ account: String) async throws(CustodyClientError) -> LockState {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in try client.call(Endpoint.lock, account, as: LockState.self) }
    }

    /// Unlocks `account`, with its passphrase when it has one (303 WrongPassphrase, 304
    /// RateLimited otherwise).
    @discardableResult
    public func unlock(_ account: String, passphrase: String? = nil) async throws(CustodyClientError) -> LockState {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.unlock, account, json: UnlockRequest(passphrase: passphrase), as: LockState.self)
        }
    }
}
