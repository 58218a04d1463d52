import CustodyCore
import CustodySystem
import Glibc
import Prometheus
import Synchronization

/// Everything the daemon counts, in the Prometheus text format (docs/metrics.md): the mounts'
/// requests (`MountMetrics`), the engine's events (`EngineMetrics`), and, read when the metrics
/// are asked for, the accounts by lock state, the mounts and the daemon's memory.
///
/// No series names an identity, unless the reader is an administrator and identities are not
/// scrubbed from logs (`ScrubAccountIdentities = false`): then one series per account says its
/// lock state.
public final class DaemonMetrics: Sendable {
    private let registry = PrometheusCollectorRegistry()
    public let mounts: MountMetrics
    private let engineMetrics: EngineMetrics
    private let accountGauges: [String: Gauge]
    private let mountCount: Gauge
    private let residentMemory: Gauge
    private let startTime: Gauge
    private let guardLevels: [String: Gauge]
    private let guardHolders: Gauge
    private let guardRefusals: Counter
    private let guardRefusalsSeen = Mutex<UInt64>(0)

    /// Lock states an account can be in, as the status names them ("registered": not enrolled).
    static let lockStates = ["unlocked", "locking", "locked", "unavailable", "registered"]

    public init(version: String) {
        mounts = MountMetrics(registry: registry)
        engineMetrics = EngineMetrics(registry: registry)
        var gauges: [String: Gauge] = [:]
        for state in Self.lockStates {
            gauges[state] = registry.gauge("custody_accounts", [("state", state)],
                                               help: "Accounts by lock state (registered: not enrolled; unavailable: machine key lost).")
        }
        accountGauges = gauges
        var levels: [String: Gauge] = [:]
        for level in ["fanotify", "off", "unavailable"] {
            levels[level] = registry.gauge("custody_guard_level", [("level", level)],
                                           help: "How processes that hold managed data are kept to their save-to locations (1 for the level in force).")
        }
        guardLevels = levels
        guardHolders = registry.gauge("custody_guard_holders", help: "Processes that hold managed data (the guard keeps them to their save-to locations).")
        guardRefusals = registry.counter("custody_guard_refusals_total", help: "Creations and opens for writing the guard refused (saveBlocked).")
        mountCount = registry.gauge("custody_mounts", help: "Protected directories mounted.")
        residentMemory = registry.gauge("process_resident_memory_bytes", help: "Resident memory of the daemon in bytes.")
        startTime = registry.gauge("process_start_time_seconds", help: "Start time of the daemon since the Unix epoch in seconds.")
        registry.gauge("custody_build_info", [("version", version)], help: "The daemon's version (always 1).").set(Double(1))
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        startTime.set(Double(now.tv_sec))
    }

    /// Counts `engine`'s events from now on.
    public func observe(_ engine: Engine) -> Int {
        engine.events.subscribe { [engineMetrics] event in engineMetrics.record(event) }
    }

    /// The metrics as Prometheus text (version 0.0.4). `identities`: also the per-account series
    /// (only for an administrator, and only when identities are not scrubbed).
    public func render(_ engine: Engine, identities: Bool) -> [UInt8] {
        let (counts, states) = Self.lockStates(engine)
        for (state, gauge) in accountGauges { gauge.set(Double(counts[state] ?? 0)) }
        mountCount.set(Double(engine.volumes.count))
        let guardStatus = engine.dataHolders?.status
        for (level, gauge) in guardLevels { gauge.set(Double(level == (guardStatus?.level ?? "off") ? 1 : 0)) }
        guardHolders.set(Double(guardStatus?.holders ?? 0))
        if let refusals = guardStatus?.refusals {
            let delta = guardRefusalsSeen.withLock { seen in
                defer { seen = max(seen, refusals) }
                return refusals > seen ? refusals - seen : 0
            }
            if delta > 0 { guardRefusals.increment(by: Int64(delta)) }
        }
        residentMemory.set(Double(Self.residentBytes()))
        var text = registry.emitToBuffer()
        if identities, !states.isEmpty {
            // A registry of its own, made for this answer: accounts that went leave no series.
            let named = PrometheusCollectorRegistry()
            for (identity, state) in states {
                named.gauge("custody_account_lock_state", [("identity", identity), ("state", state)],
                                help: "An account's lock state (1 for the state it is in).").set(Double(1))
            }
            named.emit(into: &text)
        }
        return text
    }

    /// Accounts per lock state, and each account's (by UPN).
    static func lockStates(_ engine: Engine) -> ([String: Int], [(String, String)]) {
        let stranded = Set(engine.machineKeyStatus(counter: false).stranded)
        var counts: [String: Int] = [:]
        var states: [(String, String)] = []
        for account in engine.accounts() {
            let state: String
            if !account.isEnrolled {
                state = "registered"
            } else {
                state = (try? engine.lockStatus(account.id))?.name ?? (stranded.contains(account.upn) ? "unavailable" : "locked")
            }
            counts[state, default: 0] += 1
            states.append((account.upn, state))
        }
        return (counts, states)
    }

    /// The daemon's resident set size, from /proc/self/statm.
    static func residentBytes() -> Int {
        guard let fields = readTextFile("/proc/self/statm")?.split(separator: " ") else { return 0 }
        guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }
}

extension PrometheusCollectorRegistry {
    /// Metrics by full name and help text (every family has one: `promtool check metrics` asks).
    func counter(_ name: String, _ labels: [(String, String)] = [], help: String) -> Counter {
        makeCounter(descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: help), labels: labels)
    }

    func gauge(_ name: String, _ labels: [(String, String)] = [], help: String) -> Gauge {
        makeGauge(descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: help), labels: labels)
    }

    func histogram(_ name: String, _ labels: [(String, String)] = [], buckets: [Duration], help: String) -> DurationHistogram {
        makeDurationHistogram(descriptor: MetricNameDescriptor(metricName: name, unitName: "", helpText: help), labels: labels, buckets: buckets)
    }
}
