import CustodyAPI
import CustodyCore
import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

/// What the daemon plugs into the support bundle: its configuration (already scrubbed) and the
/// scrubber for everything else in the bundle.
public final class DiagnosticsHooks: Sendable {
    private typealias Hooks = (configuration: @Sendable () -> String, scrub: @Sendable (String) -> String, identitiesScrubbed: @Sendable () -> Bool)
    private let hooks = Mutex<Hooks>(({ "" }, { $0 }, { false }))

    public func set(configuration: @escaping @Sendable () -> String, scrub: @escaping @Sendable (String) -> String,
                    identitiesScrubbed: @escaping @Sendable () -> Bool) {
        hooks.withLock { $0 = (configuration, scrub, identitiesScrubbed) }
    }

    /// The control front's PID (set by the server).
    let frontProcess = Mutex<(@Sendable () -> Int32)?>(nil)

    var configuration: String { hooks.withLock { $0.configuration }() }
    func scrub(_ text: String) -> String { hooks.withLock { $0.scrub }(text) }
    var identitiesScrubbed: Bool { hooks.withLock { $0.identitiesScrubbed }() }
}

extension ControlServer {
    /// Hooks for `GET /v1/diagnostics`.
    public var diagnostics: DiagnosticsHooks { api.diagnostics }
}

struct DiagnosticsView: Encodable {
    var version: String
    /// Whether identities are scrubbed from the bundle (`ScrubAccountIdentities`); configured
    /// values always are.
    var identitiesScrubbed: Bool
    var generatedAt: Double
    var daemon: [String: String]
    var system: [String: String]
    var configuration: String
    var status: CustodyStatus
    var jobs: [CustodyJob]
    var events: [CustodyEvent]
}

extension ControlAPI {
    /// A support bundle: versions, the machine, the configuration, status, jobs and the recent
    /// events, with configured values and (unless turned off) identities scrubbed: the whole
    /// document goes through the daemon's log scrubber, and says whether identities were.
    func diagnosticsBundle() -> HTTPResponse {
        var name = utsname()
        uname(&name)
        func field<T>(_ value: T) -> String { withUnsafeBytes(of: value) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) } }
        let system = [
            "kernel": "\(field(name.sysname)) \(field(name.release)) \(field(name.machine))",
            "fuseDevice": access("/dev/fuse", R_OK | W_OK) == 0 ? "usable" : "not usable",
            "osRelease": (readTextFile("/etc/os-release") ?? "").split(separator: "\n").first { $0.hasPrefix("PRETTY_NAME=") }.map { String($0.dropFirst(12)).replacingAll(of: "\"", with: "") } ?? "unknown",
        ]
        let daemon = [
            "pid": "\(getpid())",
            "controlFrontPid": "\(diagnostics.frontProcess.withLock { $0 }?() ?? 0)",
            "uid": "\(geteuid())",
            "openFileKeys": "\(engine.openFileKeyCount())",
            "stateDirectory": engine.stateDirectory,
        ]
        let view = DiagnosticsView(version: Self.version, identitiesScrubbed: diagnostics.identitiesScrubbed, generatedAt: wallClockSeconds(), daemon: daemon, system: system,
                                   configuration: diagnostics.configuration, status: status(), jobs: jobs.all.map(\.snapshot),
                                   events: engine.events.events().suffix(200).map { CustodyEvent($0) })
        let encoder = Self.encoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes, .prettyPrinted]
        let text = (try? encoder.encode(view)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        return HTTPResponse(status: 200, body: Array(diagnostics.scrub(text).utf8))
    }
}
