import CustodyCore
import Prometheus
import Synchronization

/// Counters read off the engine's events: locks and unlocks by cause, failed unlocks, wipe and
/// re-protection jobs, blocked transfers. The engine knows nothing of metrics; it already says
/// everything it does as an event, so counting them misses nothing and costs it nothing.
final class EngineMetrics: Sendable {
    private let registry: PrometheusCollectorRegistry
    private let events: Counter
    private let locks: Counter
    private let transfersBlocked: Counter
    private let jobsRunning: [JobKind: Gauge]
    private let jobFiles: [JobKind: Counter]
    private let wipeBytes: Counter
    private let wipeKeysDestroyed: DurationHistogram
    /// Progress of the jobs under way (files done, bytes freed), by kind and identity.
    private let progress = Mutex<[String: (files: Int64, bytes: Int64)]>([:])

    enum JobKind: String, CaseIterable, Hashable { case wipe, reprotect }

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        events = registry.counter("custody_events_total", help: "Engine events emitted (see the event stream for each).")
        locks = registry.counter("custody_locks_total", help: "Locks completed: class A and B keys dropped after the grace period.")
        transfersBlocked = registry.counter("custody_transfers_blocked_total",
                                                help: "Opens and creates refused by the identity boundary (including those left out of the event stream).")
        var running: [JobKind: Gauge] = [:]
        var files: [JobKind: Counter] = [:]
        for kind in JobKind.allCases {
            running[kind] = registry.gauge("custody_jobs_running", [("kind", kind.rawValue)],
                                               help: "Wipe and re-protection jobs under way.")
            files[kind] = registry.counter("custody_job_files_total", [("kind", kind.rawValue)],
                                               help: "Files deleted by wipes and re-protected by re-protection jobs.")

        }
        jobsRunning = running
        jobFiles = files
        wipeBytes = registry.counter("custody_wipe_bytes_freed_total", help: "Bytes freed by wipes.")
        wipeKeysDestroyed = registry.histogram("custody_wipe_keys_destroyed_seconds", buckets: [.milliseconds(1), .milliseconds(10), .milliseconds(100), .seconds(1), .seconds(10)],
            help: "Time from a wipe's start until the identity's keys were destroyed (its files unreadable).")
        for cause in ["passphrase", "noPassphrase", "login", "recovery", "graceCancelled"] { _ = unlockCounter(cause) }
        for protector in ["passphrase", "login", "recovery"] { _ = failureCounter(protector: protector, reason: "wrong") }
        _ = failureCounter(protector: "any", reason: "tpmLockout")
        for cause in Self.lockCauses { _ = lockRequestCounter(cause) }
        for kind in JobKind.allCases { for failed in [false, true] { _ = jobsCounter(kind, failed: failed) } }
        for action in Self.exceededActions { _ = exceededCounter(action) }
    }

    func record(_ event: EngineEvent) {
        events.increment()
        let identity = event.identity ?? ""
        switch event.kind {
        case .lockRequested:
            lockRequestCounter(label(event.details["cause"], Self.lockCauses)).increment()
        case .locked:
            locks.increment()
        case .unlocked:
            unlockCounter(label(event.details["cause"], ["passphrase", "noPassphrase", "login", "recovery", "graceCancelled"])).increment()
        case .unlockFailed:
            if event.details["tpmLockout"] == "true" {
                failureCounter(protector: "any", reason: "tpmLockout").increment()
            } else {
                failureCounter(protector: label(event.details["protector"], ["passphrase", "login", "recovery"]), reason: "wrong").increment()
            }
        case .unlockAttemptsExceeded:
            exceededCounter(label(event.details["action"], Self.exceededActions)).increment()
        case .transferBlocked:
            transfersBlocked.increment(by: 1 + (Int64(event.details["suppressed"] ?? "") ?? 0))
        case .wipeStarted:
            track(.wipe, identity, files: 0, bytes: 0)
        case .wipeProgress:
            if let seconds = event.details["keysDestroyedSeconds"].flatMap(Double.init), seconds >= 0, seconds < 1e9 {
                wipeKeysDestroyed.record(.nanoseconds(Int64(seconds * 1e9)))
            }
            if let deleted = event.details["deleted"].flatMap(Int64.init) {
                track(.wipe, identity, files: deleted, bytes: event.details["bytesFreed"].flatMap(Int64.init) ?? 0)
            }
        case .wipeFinished:
            finish(.wipe, identity, failed: false)
        case .wipeFailed:
            finish(.wipe, identity, failed: true)
        case .reprotectProgress:
            track(.reprotect, identity, files: event.details["done"].flatMap(Int64.init) ?? 0, bytes: 0)
        case .reprotectFinished:
            track(.reprotect, identity, files: event.details["done"].flatMap(Int64.init) ?? 0, bytes: 0)
            finish(.reprotect, identity, failed: (event.details["left"] ?? "0") != "0")
        default:
            break
        }
    }

    /// Notes a job's progress; the first note of a job counts it as running.
    private func track(_ kind: JobKind, _ identity: String, files: Int64, bytes: Int64) {
        let isNew = progress.withLock { progress in
            let key = kind.rawValue + "/" + identity
            defer { progress[key] = (files, bytes) }
            return progress[key] == nil
        }
        if isNew { jobsRunning[kind]?.increment() }
    }

    private func finish(_ kind: JobKind, _ identity: String, failed: Bool) {
        let done = progress.withLock { $0.removeValue(forKey: kind.rawValue + "/" + identity) }
        guard let done else { return } // finished without a start: counted when it started
        jobsRunning[kind]?.decrement()
        jobFiles[kind]?.increment(by: done.files)
        if kind == .wipe { wipeBytes.increment(by: done.bytes) }
        jobsCounter(kind, failed: failed).increment()
    }

    static let lockCauses = ["manual", "sessionLock", "suspend", "logout"]
    static let exceededActions = ["backoff", "wipe"]

    private func lockRequestCounter(_ cause: String) -> Counter {
        registry.counter("custody_lock_requests_total", [("cause", cause)], help: "Locks requested, by cause (manual, sessionLock, suspend, logout).")
    }

    private func exceededCounter(_ action: String) -> Counter {
        registry.counter("custody_unlock_attempts_exceeded_total", [("action", action)],
                         help: "Times MaxUnlockAttempts was reached, by the action taken (backoff, wipe).")
    }

    private func jobsCounter(_ kind: JobKind, failed: Bool) -> Counter {
        registry.counter("custody_jobs_total", [("kind", kind.rawValue), ("result", failed ? "failed" : "done")],
                         help: "Wipe and re-protection jobs finished, by result (done, failed).")
    }

    private func unlockCounter(_ cause: String) -> Counter {
        registry.counter("custody_unlocks_total", [("cause", cause)],
                             help: "Unlocks, by cause (passphrase, noPassphrase, login, recovery, graceCancelled).")
    }

    private func failureCounter(protector: String, reason: String) -> Counter {
        registry.counter("custody_unlock_failures_total", [("protector", protector), ("reason", reason)],
                             help: "Failed unlocks, by protector (passphrase, login, recovery) and reason (wrong, tpmLockout).")
    }

    /// A label value from a fixed set ("other" for anything else): series never multiply with input.
    private func label(_ value: String?, _ known: [String]) -> String {
        guard let value, known.contains(value) else { return "other" }
        return value
    }
}
