import ArgumentParser
import CLinux
import CustodyConfig
import Logging
import CustodyControl
import CustodyCore
import CustodyFormat
import CustodyFUSE
import CustodySystem
import Glibc

@main
struct Custodyd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "custodyd",
        abstract: "Mount protected working directories over FUSE and serve the control socket.",
        discussion: """
            With BACKING and MOUNTPOINT, serves BACKING at MOUNTPOINT (plus any mounts of --config). \
            Without them, reads --config (default /etc/custody/custody.toml) and serves its mounts. \
            Command-line options override the file. SIGTERM or SIGINT unmounts and stops; SIGHUP \
            reloads the configuration file (mounts added and removed, settings, log level). Started \
            by systemd it reports readiness and status, pings the watchdog and takes its control \
            socket from socket activation. Without a configuration file it stops when its last \
            mount is unmounted (fusermount3 -u MOUNTPOINT).
            """,
        version: CustodyVersion.string)

    @Argument(help: "The directory that holds the files (the backing store).")
    var backing: String?

    @Argument(help: "An empty directory where the protected view appears.")
    var mountPoint: String?

    @Option(help: ArgumentHelp("The configuration file (default /etc/custody/custody.toml when there are no mount arguments).", valueName: "path"))
    var config: String?

    @Option(help: ArgumentHelp("Check a configuration file, print its errors with line and key, and exit (0 valid, 1 not).", valueName: "path"))
    var checkConfig: String?

    @Option(help: ArgumentHelp("Directory for keys and state.", valueName: "dir"))
    var state: String?

    @Option(help: ArgumentHelp("Control socket path (default /run/custody/control.sock for root).", valueName: "path"))
    var socket: String?

    @Option(help: ArgumentHelp("Permissions of the control socket (octal, default 0666: every local user may connect; the routes authorize each caller).", valueName: "mode"))
    var socketMode: String?

    @Option(help: ArgumentHelp("Group of the control socket (default custody-admin when it exists).", valueName: "group"))
    var socketGroup: String?

    @Option(help: ArgumentHelp("Members of this group are administrators (default custody-admin when it exists).", valueName: "group"))
    var adminGroup: String?

    @Flag(help: "Let other users use the mount (turns on kernel permission checks, from modes and POSIX ACLs; new objects take the caller's umask, or their directory's default ACL).")
    var allowOther = false

    @Flag(help: "Mount even when the mount point is not empty.")
    var allowNonempty = false

    @Option(help: ArgumentHelp("Seconds the kernel caches names and attributes.", valueName: "seconds"))
    var cacheTimeout: Double = 1.0

    @Flag(help: "Send every write to the daemon at once instead of batching in the page cache.")
    var noWritebackCache = false

    @Flag(help: "Never ask for low CPU wake-up latency (PM QoS) during bursts of requests.")
    var noLowLatency = false

    @Flag(help: "Serve requests through /dev/fuse only, not through per-CPU request rings (FUSE over io_uring).")
    var noRequestRings = false

    @Flag(help: "Store the names of managed identities' entries as they are, not encrypted (encrypt_names = false): anyone with the backing store reads them.")
    var plainNames = false

    @Flag(help: "Other daemons, on this host or others, serve the same backing directory (shared_store = true; an NFS export, say): no writeback cache, names looked up at every path walk, file pages and listings read again at each open (close-to-open).")
    var sharedStore = false

    @Option(help: ArgumentHelp("Where the store keeps Custody's records: trusted (trusted.custody.* attributes, only root's) or user (user.custody.store.*, for stores that keep only user attributes, as NFS does). Left out, the store decides (store_attributes).", valueName: "namespace"))
    var storeAttributes: String?

    @Option(help: ArgumentHelp("Most FUSE request threads: those reading /dev/fuse, or with request rings the workers serving requests that may wait (fsync, large reads and writes).", valueName: "n"))
    var threads: Int = 8

    @Flag(help: "Print every FUSE request.")
    var debug = false

    @Option(help: ArgumentHelp("trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: String?

    @Flag(help: "Allow more than one managed (enrolled) account (MultiIdentity).")
    var multiIdentity = false

    @Option(help: ArgumentHelp("Seconds between a lock and class A keys being dropped.", valueName: "seconds"))
    var lockGracePeriod: Double?

    @Option(help: ArgumentHelp("Caps every policy's protection level (MaxFileProtectionLevel).", valueName: "level"))
    var maxProtectionLevel: String?

    @Option(help: ArgumentHelp("Default identity for callers of a uid with no binding (repeatable).", valueName: "uid=identity"))
    var defaultIdentity: [String] = []

    @Flag(help: "Do not follow login sessions (logind): only custodyctl locks identities.")
    var noSessions = false

    @Flag(help: "Create nothing in the mount (EACCES, an event) until the accounts the configuration declares are enrolled (policy_required).")
    var policyRequired = false

    @Flag(help: "Show identities in the log, journal entries and support bundles, to debug (ScrubAccountIdentities = false; by default every identity is scrubbed).")
    var logIdentities = false

    @Option(help: ArgumentHelp("The file systems the guard watches for processes that hold managed data: all, none, or the file systems holding these paths (repeatable).", valueName: "all|none|path"))
    var guardFileSystems: [String] = []

    @Option(help: ArgumentHelp("A uid whose processes the transfer rules let through (repeatable; TransferExemptUids).", valueName: "uid"))
    var transferExemptUid: [UInt32] = []

    @Option(help: ArgumentHelp("A program whose processes the transfer rules let through (repeatable; TransferExemptExecutables).", valueName: "path"))
    var transferExemptExecutable: [String] = []

    @Option(help: ArgumentHelp("Where the machine key is kept: auto (the TPM when there is one), tpm2 or file.", valueName: "store"))
    var machineKey: String?

    @Option(help: ArgumentHelp("How to reach the TPM (a TCTI: device:/dev/tpmrm0, swtpm:host=…,port=…, mssim:…).", valueName: "tcti"))
    var tpm2Tcti: String?

    @Option(help: ArgumentHelp("Also serve the metrics in the Prometheus format on this loopback address (e.g. 127.0.0.1:9464).", valueName: "address:port"))
    var metricsListen: String?

    @Option(help: ArgumentHelp("A SHA-256 PCR to bind a TPM-sealed machine key to (repeatable; e.g. 7, the Secure Boot state).", valueName: "pcr"))
    var tpm2Pcr: [Int] = []

    func validate() throws {
        if let metricsListen {
            do throws(LoopbackAddress.Problem) { _ = try LoopbackAddress(metricsListen) } catch {
                throw ValidationError("--metrics-listen: \(error)")
            }
        }
        guard cacheTimeout >= 0, cacheTimeout.isFinite else {
            throw ValidationError("--cache-timeout must be a number of seconds, 0 or more")
        }
        guard (1...256).contains(threads) else {
            throw ValidationError("--threads must be between 1 and 256")
        }
        if let maxProtectionLevel, ProtectionClass(name: maxProtectionLevel) == nil {
            throw ValidationError("--max-protection-level: unknown level \(maxProtectionLevel) (complete, completeUnlessOpen, untilFirstAuth, none)")
        }
        if let lockGracePeriod, !(lockGracePeriod >= 0 && lockGracePeriod.isFinite) {
            throw ValidationError("--lock-grace-period must be a number of seconds, 0 or more")
        }
        if let logLevel, !DaemonConfiguration.logLevels.contains(logLevel) {
            throw ValidationError("--log-level: one of \(DaemonConfiguration.logLevels.joined(separator: ", "))")
        }
        guard (backing == nil) == (mountPoint == nil) else {
            throw ValidationError("give both BACKING and MOUNTPOINT, or neither (to use --config)")
        }
        _ = try parsedDefaultIdentities()
        for path in transferExemptExecutable where !path.isAbsolutePath {
            throw ValidationError("--transfer-exempt-executable takes an absolute path, not \(path)")
        }
        if let socketMode {
            guard let mode = mode_t(socketMode, radix: 8), mode <= 0o777 else {
                throw ValidationError("--socket-mode must be octal permissions such as 0660, not \(socketMode)")
            }
        }
        if let machineKey, MachineKeyMode(rawValue: machineKey) == nil {
            throw ValidationError("--machine-key must be auto, tpm2 or file, not \(machineKey)")
        }
        for pcr in tpm2Pcr where !(0...23).contains(pcr) { throw ValidationError("--tpm2-pcr: PCR \(pcr) does not exist (0 to 23)") }
        for (option, name) in [("--socket-group", socketGroup), ("--admin-group", adminGroup)] {
            if let name, Self.groupID(name) == nil { throw ValidationError("\(option): no group named \(name)") }
        }
    }

    static let defaultAdminGroup: String? = "custody-admin"

    static func groupID(_ name: String) -> gid_t? {
        if let number = gid_t(name) { return number }
        guard let entry = getgrnam(name) else { return nil }
        return entry.pointee.gr_gid
    }

    static func defaultSocketPath() -> String {
        if geteuid() == 0 {
            mkdir("/run/custody", 0o755)
            return "/run/custody/control.sock"
        }
        let runtime = getenv("XDG_RUNTIME_DIR").map { String(cString: $0) } ?? "/tmp"
        return runtime + "/custody.sock"
    }

    func parsedDefaultIdentities() throws -> [UInt32: String] {
        var result: [UInt32: String] = [:]
        for entry in defaultIdentity {
            let parts = entry.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let uid = UInt32(parts[0]), !parts[1].isEmpty else {
                throw ValidationError("--default-identity takes uid=identity, not \(entry)")
            }
            result[uid] = String(parts[1])
        }
        return result
    }

    /// Checks a configuration file: syntax, keys, types and values, then the machine (backing
    /// directories, mount points, groups). Prints every error and "OK" when there is none.
    func check(_ path: String) -> Int32 {
        do throws(ConfigurationErrors) {
            let configuration = try DaemonConfiguration.load(path: path)
            let problems = configuration.environmentErrors(file: path)
            if !problems.isEmpty {
                for problem in problems { printError(problem.description) }
                return 1
            }
            print("\(path): OK (\(configuration.mounts.count) mount\(configuration.mounts.count == 1 ? "" : "s"))")
            return 0
        } catch {
            for problem in error.errors { printError(problem.description) }
            return 1
        }
    }

    /// The configuration file (if any) with the command line's options over it.
    func effectiveConfiguration() throws -> (DaemonConfiguration, String?) {
        var path = config
        if path == nil, backing == nil {
            guard access(DaemonConfiguration.defaultPath, F_OK) == 0 else {
                throw ValidationError("give BACKING and MOUNTPOINT, or a configuration file (--config; \(DaemonConfiguration.defaultPath) does not exist)")
            }
            path = DaemonConfiguration.defaultPath
        }
        var configuration = DaemonConfiguration()
        if let path {
            do throws(ConfigurationErrors) {
                configuration = try DaemonConfiguration.load(path: path)
            } catch {
                for problem in error.errors { printError(problem.description) }
                throw ExitCode(1)
            }
            let problems = configuration.environmentErrors(file: path)
            if !problems.isEmpty {
                for problem in problems { printError(problem.description) }
                throw ExitCode(1)
            }
        }
        try applyCommandLine(to: &configuration)
        return (configuration, path)
    }

    /// The command line's options over a configuration read from the file: at start, and again
    /// at every reload.
    func applyCommandLine(to configuration: inout DaemonConfiguration) throws {
        if let state { configuration.stateDirectory = state }
        if let socket { configuration.socket = socket }
        if let socketMode { configuration.socketMode = UInt32(socketMode, radix: 8) }
        if let socketGroup { configuration.socketGroup = socketGroup }
        if let adminGroup { configuration.adminGroup = adminGroup }
        if let logLevel { configuration.logLevel = logLevel }
        if multiIdentity { configuration.settings.multiIdentity = true }
        if let lockGracePeriod { configuration.settings.lockGracePeriod = lockGracePeriod }
        if let maxProtectionLevel, let level = ProtectionClass(name: maxProtectionLevel) { configuration.settings.maxFileProtectionLevel = level }
        for (uid, identity) in try parsedDefaultIdentities() { configuration.settings.defaultIdentities[uid] = identity }
        configuration.settings.transferExemptUids += transferExemptUid
        if noSessions { configuration.followSessions = false }
        if logIdentities { configuration.scrubAccountIdentities = false }
        if guardFileSystems == ["all"] {
            configuration.guardFileSystems = .all
        } else if guardFileSystems == ["none"] {
            configuration.guardFileSystems = .none
        } else if !guardFileSystems.isEmpty {
            guard guardFileSystems.allSatisfy({ $0.hasPrefix("/") }) else {
                throw ValidationError("--guard-file-systems takes all, none, or absolute paths")
            }
            configuration.guardFileSystems = .holding(guardFileSystems)
        }
        configuration.settings.transferExemptExecutables += transferExemptExecutable
        if let machineKey, let mode = MachineKeyMode(rawValue: machineKey) { configuration.settings.machineKey = mode }
        if let tpm2Tcti { configuration.settings.tpm2TCTI = tpm2Tcti }
        if !tpm2Pcr.isEmpty { configuration.settings.tpm2PCRs = tpm2Pcr }
        if let metricsListen { configuration.metricsListen = try LoopbackAddress(metricsListen) }
        if let backing, let mountPoint {
            var mount = MountConfiguration(backing: backing, mountPoint: mountPoint)
            mount.allowOther = allowOther
            mount.allowNonEmpty = allowNonempty
            mount.cacheTimeout = cacheTimeout
            mount.writebackCache = !noWritebackCache
            mount.lowLatency = !noLowLatency
            mount.requestRings = !noRequestRings
            mount.encryptNames = !plainNames
            mount.threads = threads
            mount.policyRequired = policyRequired
            mount.sharedStore = sharedStore
            mount.storeAttributes = try storeAttributes.map { (value) throws -> StoreAttributes.Namespace in
                guard let namespace = StoreAttributes.Namespace(rawValue: value) else { throw ValidationError("--store-attributes takes trusted or user") }
                return namespace
            }
            configuration.mounts.insert(mount, at: 0)
        }
    }

    /// `custodyd --control-front` is the daemon's own control front (started by the daemon, never
    /// by hand; see ControlFront): it is recognised before any option parsing.
    static func main() {
        if CommandLine.arguments.dropFirst().first == "--control-front" { Glibc.exit(ControlFront.run(arguments: Array(CommandLine.arguments.dropFirst(2)))) }
        main(nil)
    }

    func run() throws {
        if let checkConfig { throw ExitCode(check(checkConfig)) }
        // Signals are taken by the main thread (sigtimedwait): blocked before any thread starts.
        var signals = sigset_t()
        sigemptyset(&signals)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGPIPE] { sigaddset(&signals, signal) }
        pthread_sigmask(SIG_BLOCK, &signals, nil)

        let (configuration, path) = try effectiveConfiguration()
        DaemonLog.bootstrap(level: Logger.Level(rawValue: configuration.logLevel) ?? .info)
        // Keys and plaintext never reach a core dump (systemd-coredump, apport, core_pattern).
        if clinux_disable_core_dumps() != 0 { Logger(label: "custodyd").warning("cannot turn core dumps off: \(Errno.current)") }
        Syscall.raiseDescriptorLimit()
        var options = MountOptions()
        options.debug = debug
        let daemon: Daemon
        do {
            let commandLine = self
            daemon = try Daemon(configuration: configuration, configurationPath: path, baseOptions: options,
                                commandLine: { try commandLine.applyCommandLine(to: &$0) })
        } catch {
            Logger(label: "custodyd").error("\(error)")
            throw ExitCode(1)
        }
        guard daemon.start() else { throw ExitCode(1) }
        daemon.runUntilStopped()
    }
}

func printError(_ message: String) {
    var line = "custodyd: " + message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}
