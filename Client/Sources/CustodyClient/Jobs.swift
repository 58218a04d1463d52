import FoundationEssentials

// The daemon's long operations as typed jobs: a selective wipe, protecting a directory tree
// (`GET /v1/jobs`, `GET /v1/jobs/{id}`; started by `POST /v1/accounts/{identity}/wipe?wait=false`
// and `POST /v1/files/protect` with `"wait": false`). A caller may leave, and look again later:
// the daemon keeps every running job and the last 100 finished ones.

/// A job as it stands.
public struct Job: Equatable, Sendable {
    public enum Kind: Equatable, Sendable {
        case wipe
        case protect
        /// A kind this client does not know yet.
        case other(String)
    }

    public enum State: String, Equatable, Sendable {
        case running, succeeded, failed
    }

    /// The document the daemon answered; everything below is read from it.
    let document: CustodyJob

    public init(_ document: CustodyJob) { self.document = document }

    public var id: Int { document.id }

    public var kind: Kind {
        switch document.kind {
        case "wipe": return .wipe
        case "protect": return .protect
        default: return .other(document.kind)
        }
    }

    /// What it works on: the account (a wipe) or the path (protect).
    public var target: String { document.target }

    public var state: State { State(rawValue: document.state) ?? (document.finishedAt == nil ? .running : .failed) }

    /// Counters that grow as it works (`done` for protect; `scanned`, `deleted`, `bytesFreed`,
    /// `keysDestroyedMicroseconds` for a wipe).
    public var progress: [String: UInt64] { document.progress }

    /// Wall-clock seconds since 1970.
    public var startedAt: Double { document.startedAt }
    public var finishedAt: Double? { document.finishedAt }

    /// Why a failed job failed, as the call that waits for it would have thrown it (`status` 0:
    /// a job's failure carries no HTTP status).
    public var failure: CustodyClientError? { document.error.map { .server(status: 0, code: $0.code, name: $0.name, message: $0.message) } }

    public var isFinished: Bool { state != .running }

    /// A finished wipe's result (nil otherwise).
    public var wipeResult: WipeResult? { kind == .wipe ? document.result(as: WipeResult.self) : nil }

    /// A finished protect's result: the info of the path (nil otherwise).
    public var protectionInfo: FileProtectionInfo? { kind == .protect ? document.result(as: FileProtectionInfo.self) : nil }
}

/// Starting, listing and following jobs.
public struct JobManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    /// Every job the caller may see (its own; an administrator every one).
    public func jobs() async throws(CustodyClientError) -> [Job] {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in try client.call(Endpoint.jobs, as: [CustodyJob].self).map(Job.init) }
    }

    /// One job (404 `UnknownJob` for one the caller may not see or that the daemon forgot).
    public func job(_ id: Int) async throws(CustodyClientError) -> Job {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in Job(try client.call(Endpoint.job, String(id), as: CustodyJob.self)) }
    }

    /// Starts a selective wipe of `account` and answers at once (administrators only).
    public func startWipe(_ account: String) async throws(CustodyClientError) -> Job {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            Job(try client.call(Endpoint.wipe, account, query: [("wait", "false")], as: CustodyJob.self))
        }
    }

    /// Starts making `identity` the owner of `path` and everything below it (nil: no owner),
    /// re-encrypting as the policies say, and answers at once.
    public func startProtect(_ path: String, identity: String?) async throws(CustodyClientError) -> Job {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            Job(try client.call(Endpoint.protectFile, json: ProtectRequest(path: path, identity: identity, wait: false), as: CustodyJob.self))
        }
    }

    /// The job as it progresses: its state now, then each time it changes (looked at every
    /// `interval` seconds), ending with the finished job. The sequence throws what `job(_:)`
    /// throws; it does not throw the job's own failure (see `Job.failure`).
    public func progress(of id: Int, interval: Double = 0.1) -> AsyncThrowingStream<Job, any Error> {
        let manager = self
        return AsyncThrowingStream { continuation in
            let task = Task {
                var last: Job?
                do {
                    while !Task.isCancelled {
                        let now = try await manager.job(id)
                        if now != last { continuation.yield(now) }
                        last = now
                        if now.isFinished { break }
                        try await Task.sleep(nanoseconds: UInt64(max(0.01, interval) * 1e9))
                    }
                    continuation.finish()
                } catch is CancellationError {
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Waits for the job to finish: the finished job, or its failure thrown.
    @discardableResult
    public func wait(for id: Int, interval: Double = 0.1) async throws -> Job {
        var finished: Job?
        for try await job in progress(of: id, interval: interval) { finished = job }
        guard let finished, finished.isFinished else { throw CustodyClientError.badResponse("job \(id) did not finish") }
        if let failure = finished.failure { throw failure }
        return finished
    }
}
