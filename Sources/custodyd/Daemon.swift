import CustodyConfig
import CustodyControl
import CustodyCore
import CustodyFUSE
import CustodyGuard
import CustodyMetrics
import CustodySessions
import CustodySystem
import Dispatch
import Glibc
import Logging
import Synchronization

/// One mount served on a thread of its own.
final class RunningMount: @unchecked Sendable {
    let configuration: MountConfiguration
    let mount: FUSEMount
    private let state = Mutex<(live: Bool, ended: Bool, error: String?)>((false, false, nil))
    private let liveSignal = DispatchSemaphore(value: 0)
    private let attachedSignal = DispatchSemaphore(value: 0)
    private let serveSignal = DispatchSemaphore(value: 0)
    private var thread: pthread_t?

    init(_ configuration: MountConfiguration, mount: FUSEMount) {
        self.configuration = configuration
        self.mount = mount
    }

    var isLive: Bool { state.withLock { $0.live && !$0.ended } }
    var hasEnded: Bool { state.withLock { $0.ended } }
    var failure: String? { state.withLock { $0.error } }

    /// Starts the session's thread and waits until the mount is attached to the engine (mounted,
    /// not serving yet) or failed; `serve()` then lets it serve.
    func attach() -> Bool {
        do throws(Errno) {
            thread = try DaemonThread.start("custody-mount") { [self] in serveLoop() }
        } catch {
            state.withLock { $0.error = "cannot start a thread (\(error))"; $0.ended = true }
            return false
        }
        attachedSignal.wait()
        return state.withLock { !$0.ended }
    }

    /// Lets an attached mount serve requests, and waits until it does.
    func serve() -> Bool {
        serveSignal.signal()
        liveSignal.wait()
        return isLive
    }

    private func serveLoop() {
        do throws(MountError) {
            try mount.run(completesPendingWipes: false, beforeServing: {
                attachedSignal.signal()
                serveSignal.wait()
            }, mounted: {
                state.withLock { $0.live = true }
                liveSignal.signal()
            })
        } catch {
            state.withLock { $0.error = error.description }
        }
        let wasLive = state.withLock { state -> Bool in
            state.ended = true
            return state.live
        }
        if !wasLive {
            attachedSignal.signal()
            liveSignal.signal()
        }
    }

    /// Ends the loop (the mount is unmounted) and waits for the thread.
    func stop() {
        mount.stop()
        serveSignal.signal()
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    /// Waits for a thread whose loop already ended.
    func join() {
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }
}

/// What the daemon runs: the engine, the control socket, the mounts; systemd readiness, the
/// watchdog, signals (SIGTERM/SIGINT stop, SIGHUP reloads the configuration file).
final class Daemon: @unchecked Sendable {
    let logger = Logger(label: "custodyd")
    private(set) var configuration: DaemonConfiguration
    let configurationPath: String?
    let engine: Engine
    let server: ControlServer
    private var mounts: [RunningMount] = [] {
        didSet { liveMountPoints.withLock { $0 = mounts.map(\.mount.mountPoint) } }
    }
    /// What the watchdog checks (written by the main thread, read by the watchdog's).
    private let liveMountPoints = Mutex<[String]>([])
    private let watchdogStop = Atomic<Bool>(false)
    private var watchdogThread: pthread_t?
    let baseOptions: MountOptions
    private var eventSubscription: Int?
    /// Login sessions (logind) locking the identities; nil when not followed.
    private var sessions: LoginMonitor?
    /// What the daemon counts (`GET /v1/metrics`), and the loopback listener that also serves it.
    let metrics = DaemonMetrics(version: CustodyVersion.string)
    private var metricsSubscription: Int?
    /// `ScrubAccountIdentities`, for the metrics' thread (a reload changes it).
    private var metricsListener: MetricsListener?
    /// Keeps processes that hold managed data to their save-to locations.
    private var dataGuard: DataGuard?

    /// The command line's options, put over the file's again at every reload (as at start), so a
    /// reload never drops a mount, a default identity or another option given on the command line.
    private let commandLine: (inout DaemonConfiguration) throws -> Void

    init(configuration: DaemonConfiguration, configurationPath: String?, baseOptions: MountOptions,
         commandLine: @escaping (inout DaemonConfiguration) throws -> Void = { _ in }) throws {
        self.configuration = configuration
        self.configurationPath = configurationPath
        self.commandLine = commandLine
        self.baseOptions = baseOptions
        let stateDirectory = configuration.stateDirectory ?? StateDirectory.defaultPath()
        try StateDirectory.prepare(stateDirectory)
        engine = try Engine(stateDirectory: stateDirectory, settings: configuration.settings, machineKeySealer: TPMSealer.make(configuration.settings))
        let machineKey = engine.machineKeyStatus(counter: false)
        logger.info("machine key \(machineKey.id ?? "none") in \(machineKey.store?.rawValue ?? "no store")\(machineKey.pcrs.isEmpty ? "" : " bound to PCR \(machineKey.pcrs.map(String.init).joined(separator: ","))")")
        if let warning = machineKey.warning { logger.warning("\(warning)") }
        Self.warnAboutExemptPrograms(configuration.settings, logger)
        if let problem = machineKey.problem { logger.error("machine key unavailable: \(problem)") }
        for key in machineKey.keys where !key.current && !key.available {
            logger.error("machine key \(key.id) unavailable: \(key.problem ?? "")")
        }
        for problem in engine.stateProblems { logger.error("state: \(problem.message)") }
        if let stop = engine.uncleanStops.last, wallClockSeconds() - stop.foundAt < 5 {
            logger.warning("the previous run (started \(Int(stop.started))) did not stop cleanly: a file it was writing may end in a torn block, reported as a torn write (not tampering); custodyctl repair cuts such a file back to its last authentic block")
        }
        if !machineKey.stranded.isEmpty {
            logger.error("\(machineKey.stranded.count) identit\(machineKey.stranded.count == 1 ? "y" : "ies") cannot be opened without their machine key; recover with custodyctl recover: \(machineKey.stranded.joined(separator: ", "))")
        }
        let adminGroup = (configuration.adminGroup ?? Custodyd.defaultAdminGroup).flatMap(Custodyd.groupID)
        let socketGroup = (configuration.socketGroup ?? Custodyd.defaultAdminGroup).flatMap(Custodyd.groupID)
        if let activated = Systemd.takeListenDescriptors().first {
            server = ControlServer(listening: activated, engine: engine, adminGroup: adminGroup)
            logger.info("control socket from the service manager (socket activation)")
        } else {
            let path = configuration.socket ?? Custodyd.defaultSocketPath()
            server = try ControlServer(path: path, engine: engine, mode: mode_t(configuration.socketMode ?? 0o666),
                                       group: socketGroup, adminGroup: adminGroup)
            logger.info("control socket \(path)")
        }
        server.setLog { [logger] message in logger.warning("\(message)") }
        updateScrubbing()
        metricsSubscription = metrics.observe(engine)
        let metrics = self.metrics, engine = self.engine
        // Series naming identities: for administrators, and only when identities are not scrubbed.
        server.metrics.set { administrator in
            metrics.render(engine, identities: administrator && !DaemonLog.scrubber.scrubsIdentities)
        }
        let path = configurationPath
        server.diagnostics.set(configuration: {
            guard let path else { return "(no configuration file; started with command-line options)" }
            return readTextFile(path) ?? "(cannot read \(path))"
        }, scrub: { DaemonLog.scrub($0) }, identitiesScrubbed: { DaemonLog.scrubber.scrubsIdentities })
        // Every engine event is logged (progress at debug level); a new account is added to the
        // scrubbed values before its first line.
        let journal = JournalEvents.make()
        eventSubscription = engine.events.subscribe { [logger] event in
            // Whatever identity an event names is scrubbed from it and from every line after it.
            DaemonLog.scrubber.note(Self.identities(in: event))
            journal?.send(event, scrubber: DaemonLog.scrubber)
            let level: Logger.Level
            switch event.kind {
            case .wipeProgress, .reprotectProgress: level = .debug
            case .wipeFailed, .unlockFailed, .enrollmentFailed: level = .warning
            case .stateProblem: level = .error
            default: level = .info
            }
            logger.log(level: level, "\(event.kind.rawValue)\(event.code.map { " [\($0)]" } ?? ""): \(event.message)")
        }
    }

    /// Brings the accounts to the configuration's `[[account]]`s, then acts on enrolled accounts
    /// `AllowedAccounts` does not name (`AllowedAccountsAction`).
    func provisionAccounts() {
        // A declared account that cannot be provisioned is an enrollmentFailed event (logged).
        engine.provision(configuration.declaredAccounts())
        engine.applyAllowedAccounts()
    }

    /// What logs, journal entries and bundles must not show: the configured values and, unless
    /// turned off, identities, beginning with every one the configuration and the accounts name.
    func updateScrubbing() {
        let settings = configuration.settings
        DaemonLog.scrubber.configure(values: settings.valuesToScrubFromLogging, scrubsIdentities: configuration.scrubAccountIdentities)
        DaemonLog.scrubber.note(engine.accounts().flatMap { [$0.id, $0.upn] } + Array(settings.defaultIdentities.values) + settings.allowedAccounts)
    }

    /// The identities an event names: its identity, and those its details carry (a blocked
    /// transfer's sender and receiver, a new account's object ID).
    static func identities(in event: EngineEvent) -> [String] {
        var found = event.identity.map { [$0] } ?? []
        switch event.kind {
        case .transferBlocked: found += [event.details["from"], event.details["to"]].compactMap { $0 }
        case .registered, .enrolled: found += event.details["id"].map { [$0] } ?? []
        default: break
        }
        return found
    }

    func options(for mount: MountConfiguration) -> MountOptions {
        var options = baseOptions
        options.allowOther = mount.allowOther
        options.allowNonEmpty = mount.allowNonEmpty
        options.entryTimeout = mount.cacheTimeout
        options.attributeTimeout = mount.cacheTimeout
        options.negativeTimeout = mount.cacheTimeout
        options.writebackCache = mount.writebackCache
        options.lowLatency = mount.lowLatency
        options.requestRings = mount.requestRings
        options.maxThreads = mount.threads
        options.encryptNames = mount.encryptNames
        options.policyRequired = mount.policyRequired
        options.sharedStore = mount.sharedStore
        options.storeAttributes = mount.storeAttributes
        options.handleSignals = false
        return options
    }

    /// Mounts one configured mount, attached but not serving yet; nil (and logged) when it cannot.
    func attachMount(_ configuration: MountConfiguration) -> RunningMount? {
        let mount: FUSEMount
        do throws(MountError) {
            mount = try FUSEMount(backing: configuration.backing, mountPoint: configuration.mountPoint, options: options(for: configuration), engine: engine,
                                  metrics: metrics.mounts)
        } catch {
            logger.error("\(error.description)")
            return nil
        }
        let running = RunningMount(configuration, mount: mount)
        guard running.attach() else {
            logger.error("\(running.failure ?? "cannot mount \(configuration.mountPoint)")")
            running.join()
            return nil
        }
        return running
    }

    /// Lets an attached mount serve; false (and logged) when it failed instead.
    func serve(_ running: RunningMount) -> Bool {
        guard running.serve() else {
            logger.error("\(running.failure ?? "cannot serve \(running.mount.mountPoint)")")
            running.join()
            return false
        }
        logger.info("serving \(running.mount.backing) at \(running.mount.mountPoint); requests through \(running.mount.requestTransport)")
        if running.mount.storeAttributes.namespace == .user {
            logger.notice("\(running.mount.backing) keeps Custody's records in user.custody.store.* attributes (it keeps no trusted.* ones): only the daemons may reach it")
        }
        if running.mount.readOnly {
            logger.warning("\(running.mount.mountPoint) is read-only: \(running.mount.backing) is on a read-only file system; files read (encrypted ones with their keys), and every change fails with EROFS")
        }
        // Does the state know the owners of the files this mount protects? (Reported as events.)
        let (engine, backing, names) = (self.engine, running.mount.backing, running.mount.storeAttributes)
        DispatchQueue.global(qos: .utility).async { engine.checkOwners(in: backing, records: names) }
        return true
    }

    /// Starts everything; false when a configured mount could not be mounted (nothing stays mounted).
    func start() -> Bool {
        engine.startDeadlineTimer()
        server.start()
        if let address = configuration.metricsListen {
            let (metrics, engine) = (self.metrics, self.engine)
            do throws(MetricsListener.Failure) {
                let listener = try MetricsListener(address) { metrics.render(engine, identities: false) }
                listener.start()
                metricsListener = listener
                logger.info("metrics on http://\(address)/metrics")
            } catch {
                logger.error("\(error)")
            }
        }
        // The guard first: no read through a mount may come before it can make a holder.
        startGuard()
        for configured in configuration.mounts {
            guard let running = attachMount(configured) else {
                stopAll()
                return false
            }
            mounts.append(running)
        }
        // Every mount is attached and none serves yet: an interrupted wipe finishes first.
        do throws(EngineError) { try engine.completePendingWipes() } catch {
            logger.error("cannot complete an interrupted wipe: \(error)")
            stopAll()
            return false
        }
        for running in mounts {
            guard serve(running) else {
                stopAll()
                return false
            }
        }
        // Accounts the configuration declares, then enrolled ones it no longer allows.
        provisionAccounts()
        if configuration.followSessions {
            let monitor = LoginMonitor(engine: engine) { [logger] message in logger.notice("\(message)") }
            if monitor.start() { sessions = monitor }
        }
        Systemd.notify("READY=1\nSTATUS=\(statusLine())\nMAINPID=\(getpid())")
        logger.info("ready (pid \(getpid()), \(mounts.count) mount\(mounts.count == 1 ? "" : "s"))")
        startWatchdog()
        return true
    }

    private func startGuard() {
        let lowLatency = configuration.mounts.first?.lowLatency ?? true
        let dataGuard = DataGuard(engine: engine, selection: configuration.guardFileSystems, lowLatency: lowLatency) { [logger] message in logger.notice("guard: \(message)") }
        let status = dataGuard.start()
        engine.attach(holders: dataGuard)
        self.dataGuard = dataGuard
        switch status.level {
        case "fanotify": logger.info("guard: holders of managed data are kept to their save-to locations on \(status.fileSystems.count) file system\(status.fileSystems.count == 1 ? "" : "s")")
        case "off": logger.info("guard: off (\(status.reason ?? ""))")
        default: logger.warning("guard: unavailable, only the mounts and custodyctl run enforce save-to locations (\(status.reason ?? ""))")
        }
    }

    func statusLine() -> String {
        let live = mounts.filter(\.isLive).map(\.mount.mountPoint)
        let accounts = engine.accounts().filter(\.isEnrolled)
        let locked = accounts.filter { (try? engine.lockStatus($0.id)) == .locked }.count
        return "serving \(live.isEmpty ? "no mounts" : live.joined(separator: ", ")); \(accounts.count) managed account\(accounts.count == 1 ? "" : "s"), \(locked) locked"
    }

    /// Waits for signals until stopped, or until every mount has gone (unmounted from outside).
    func runUntilStopped() {
        var signals = sigset_t()
        sigemptyset(&signals)
        for signal in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&signals, signal) }
        let hadMounts = !mounts.isEmpty
        var lastStatus = ""
        var nextPrune = monotonicSeconds() + 5
        while true {
            var timeout = timespec(tv_sec: 0, tv_nsec: 200_000_000)
            let signal = sigtimedwait(&signals, nil, &timeout)
            if signal == SIGTERM || signal == SIGINT {
                logger.info("stopping (\(signal == SIGTERM ? "SIGTERM" : "SIGINT"))")
                break
            }
            if signal == SIGHUP { reload() }
            for running in mounts where running.hasEnded {
                logger.info("\(running.mount.mountPoint) was unmounted")
                running.join()
            }
            mounts.removeAll { $0.hasEnded }
            if hadMounts, mounts.isEmpty, configurationPath == nil {
                logger.info("every mount is gone; stopping")
                break
            }
            // Bindings of processes that have exited leave bindings.json (identities do not linger).
            if monotonicSeconds() >= nextPrune {
                engine.pruneExitedBindings()
                nextPrune = monotonicSeconds() + 5
            }
            let status = statusLine()
            if status != lastStatus {
                Systemd.notify("STATUS=\(status)")
                lastStatus = status
            }
        }
        stopAll()
    }

    /// Re-reads the configuration file: settings, log level, scrubbing, mounts added and removed.
    /// Exempt programs configured in a way that never exempts anyone (`ExemptPrograms.problems`).
    private static func warnAboutExemptPrograms(_ settings: Settings, _ logger: Logger) {
        for problem in ExemptPrograms.problems(settings.transferExemptExecutables) { logger.warning("\(problem)") }
    }

    func reload() {
        guard let path = configurationPath else {
            logger.notice("SIGHUP: no configuration file to reload (started without --config)")
            return
        }
        Systemd.notify("RELOADING=1\nMONOTONIC_USEC=\(monotonicMicroseconds())")
        defer { Systemd.notify("READY=1\nSTATUS=\(statusLine())") }
        var fresh: DaemonConfiguration
        do throws(ConfigurationErrors) {
            fresh = try DaemonConfiguration.load(path: path)
        } catch {
            logger.error("reload refused, keeping the running configuration:\n\(error.description)")
            return
        }
        do { try commandLine(&fresh) } catch {
            logger.error("reload refused, keeping the running configuration: \(error)")
            return
        }
        let environment = fresh.environmentErrors(file: path)
        if !environment.isEmpty {
            logger.error("reload refused, keeping the running configuration:\n\(environment.map(\.description).joined(separator: "\n"))")
            return
        }
        configuration = fresh
        engine.updateSettings(fresh.settings)
        Self.warnAboutExemptPrograms(fresh.settings, logger)
        DaemonLog.level.withLock { $0 = Logger.Level(rawValue: fresh.logLevel) ?? .info }
        updateScrubbing()
        let wanted = Set(fresh.mounts.map(\.mountPoint))
        for running in mounts where !wanted.contains(running.configuration.mountPoint) {
            logger.info("reload: unmounting \(running.mount.mountPoint)")
            running.stop()
        }
        mounts.removeAll { !wanted.contains($0.configuration.mountPoint) || $0.hasEnded }
        let current = Set(mounts.map(\.configuration.mountPoint))
        for configured in fresh.mounts where !current.contains(configured.mountPoint) {
            logger.info("reload: mounting \(configured.mountPoint)")
            if let running = attachMount(configured), serve(running) { mounts.append(running) }
        }
        provisionAccounts()
        logger.info("configuration reloaded from \(path)")
    }

    func stopAll() {
        Systemd.notify("STOPPING=1")
        watchdogStop.store(true, ordering: .releasing)
        if let watchdogThread { pthread_join(watchdogThread, nil) }
        watchdogThread = nil
        sessions?.stop()
        sessions = nil
        dataGuard?.stop()
        for running in mounts {
            running.stop()
            logger.info("unmounted \(running.mount.mountPoint)")
        }
        mounts.removeAll()
        metricsListener?.stop()
        metricsListener = nil
        server.stop()
        engine.stopDeadlineTimer()
        engine.markCleanStop()
    }

    /// Pings the service manager while the daemon serves: every mount answers a `stat` through
    /// the kernel and the control socket accepts a connection.
    private func startWatchdog() {
        guard let interval = Systemd.watchdogInterval else { return }
        watchdogThread = try? DaemonThread.start("custody-watch") { [self] in watchdogLoop(interval: interval) }
    }

    private func watchdogLoop(interval: Double) {
        var next = monotonicSeconds()
        while !watchdogStop.load(ordering: .acquiring) {
            if monotonicSeconds() >= next {
                if healthy() { Systemd.notify("WATCHDOG=1") }
                next = monotonicSeconds() + interval
            }
            usleep(50_000)
        }
    }

    func healthy() -> Bool {
        // A name that was never looked up reaches the daemon (no cache can answer it): the
        // request loop of each mount is alive when ENOENT comes back.
        for mountPoint in liveMountPoints.withLock({ $0 }) {
            var info = stat()
            let probe = mountPoint + "/.custody-watchdog-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
            guard stat(probe, &info) != 0, errno == ENOENT else { return false }
        }
        return server.isAccepting
    }
}

func monotonicMicroseconds() -> UInt64 {
    UInt64(monotonicSeconds() * 1e6)
}
