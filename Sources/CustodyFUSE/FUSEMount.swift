import CFuse3
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Mounts a backing directory and serves it until the mount goes away, a signal arrives, or
/// `stop()` is called.
public final class FUSEMount: @unchecked Sendable {
    public let backing: String
    public let mountPoint: String
    /// The backing store is mounted read-only (a backup, a snapshot, install media): the mount is
    /// read-only too, and its encrypted files are read with read-only descriptors.
    public let readOnly: Bool
    public let options: MountOptions
    /// Where the store keeps Custody's records (`StoreAttributes`), decided when it is mounted.
    public let storeAttributes: StoreAttributes
    /// Decides owners and holds keys; nil mounts a plain passthrough.
    public let engine: Engine?
    /// What the daemon counts (nil: nothing).
    let metrics: MountMetrics?

    /// The live session and the thread running its loop, for `stop()`.
    private struct Running: @unchecked Sendable {
        var session: OpaquePointer?
        var thread: pthread_t?
        var stopRequested = false
        var transport = ""
    }
    private let running = Mutex(Running())

    /// How requests reach the daemon, once the mount is live: per-CPU request rings, or /dev/fuse
    /// and why.
    public var requestTransport: String { running.withLock { $0.transport } }

    /// Ends the session loop from another thread (the mount is then unmounted by `run`). Safe to
    /// call before the loop starts (it ends at once) or after it ended.
    public func stop() {
        running.withLock { state in
            state.stopRequested = true
            guard let session = state.session, let thread = state.thread else { return }
            fuse_session_exit(session)
            // Interrupts the loop's wait (SIGUSR1 has a handler that does nothing).
            pthread_kill(thread, SIGUSR1)
        }
    }

    /// A SIGUSR1 handler that does nothing, so the signal only interrupts waits.
    private static let wakeHandlerInstalled: Bool = {
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        return sigaction(SIGUSR1, &action, nil) == 0
    }()

    /// Checks both paths and `/dev/fuse`, so that problems are reported before anything is mounted.
    public init(backing: String, mountPoint: String, options: MountOptions, engine: Engine? = nil, metrics: MountMetrics? = nil) throws(MountError) {
        guard let backingPath = resolvedPath(backing) else { throw .backingMissing(backing) }
        guard let backingAttributes = try? Syscall.lstat(backingPath), backingAttributes.st_mode & S_IFMT == S_IFDIR else {
            throw .backingNotDirectory(backing)
        }
        let mountAttributes: stat
        do {
            mountAttributes = try Syscall.lstat(mountPoint)
        } catch where error == .notConnected {
            throw .staleMount(mountPoint)
        } catch {
            throw .mountPointMissing(mountPoint)
        }
        guard mountAttributes.st_mode & S_IFMT == S_IFDIR, let mountPath = resolvedPath(mountPoint) else {
            throw .mountPointNotDirectory(mountPoint)
        }
        if mountPath.isPath(inside: backingPath) {
            throw .mountPointInsideBacking(mountPoint: mountPath, backing: backingPath)
        }
        if let existing = MountTable.entry(at: mountPath) {
            throw .alreadyMounted(mountPath, type: existing.fileSystemType)
        }
        if !options.allowNonEmpty, !Self.isEmptyDirectory(mountPath) {
            throw .mountPointNotEmpty(mountPath)
        }
        let probe = Glibc.open("/dev/fuse", O_RDWR | O_CLOEXEC)
        guard probe >= 0 else { throw .fuseUnavailable(.current) }
        Glibc.close(probe)

        self.backing = backingPath
        self.mountPoint = mountPath
        var filesystem = statvfs()
        self.readOnly = statvfs(backingPath, &filesystem) == 0 && filesystem.f_flag & UInt(ST_RDONLY) != 0
        self.options = options.served
        storeAttributes = try BackingStore.attributes(of: backingPath, wanted: options.storeAttributes)
        self.engine = engine
        self.metrics = metrics
    }

    /// Mounts, calls `mounted` once the mount is live, and serves requests until unmounted
    /// (`fusermount3 -u`) or until SIGTERM, SIGINT or SIGHUP; then unmounts cleanly.
    public func run(completesPendingWipes: Bool = true, beforeServing: () -> Void = {}, mounted: () -> Void) throws(MountError) {
        // Modes arrive from the kernel with the caller's umask already applied.
        umask(0)
        let rootFD: Int32
        let rootAttributes: stat
        do {
            rootFD = try Syscall.open(backing, Linux.O_PATH | O_DIRECTORY | O_CLOEXEC)
            rootAttributes = try Syscall.stat(of: rootFD)
        } catch {
            throw .backingUnreadable(backing, error)
        }
        let root = Inode(fd: rootFD, device: UInt64(rootAttributes.st_dev), number: UInt64(rootAttributes.st_ino), fileType: S_IFDIR)
        let filesystem = MountFileSystem(root: root, options: options, storeAttributes: storeAttributes, engine: engine, metrics: metrics)
        filesystem.mountPointPath = mountPoint

        var arguments = ["custodyd", "-o", mountOptionString()]
        if options.debug { arguments.append("-d") }
        let cArguments = arguments.map { strdup($0) }
        defer { cArguments.forEach { free($0) } }
        var argv: [UnsafeMutablePointer<CChar>?] = cArguments + [nil]

        let userdata = Unmanaged.passRetained(filesystem)
        defer { userdata.release() }
        var ops = MountFileSystem.operations()

        let session: OpaquePointer? = argv.withUnsafeMutableBufferPointer { argvBuffer in
            var args = fuse_args(argc: Int32(arguments.count), argv: argvBuffer.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata.toOpaque())
        }
        guard let session else { throw .sessionFailed("fuse_session_new refused the options \(arguments)") }
        // The request rings' buffers go only once the connection is gone with the session.
        var rings: RequestRings? = nil
        defer {
            fuse_session_destroy(session)
            rings?.remove()
        }

        if options.handleSignals {
            guard fuse_set_signal_handlers(session) == 0 else { throw .sessionFailed("cannot install signal handlers") }
        }
        defer { if options.handleSignals { fuse_remove_signal_handlers(session) } }

        guard fuse_session_mount(session, mountPoint) == 0 else { throw .mountFailed(mountPoint) }
        // Per-CPU request rings, installed before the loop reads INIT. The custom I/O under them
        // is installed either way: it reads the request flags libfuse drops (see
        // `MountFileSystem.clearSetIDBits`).
        rings = RequestRings(session: session, key: userdata.toOpaque(), workers: options.maxThreads, metrics: metrics)
        // Serving ends before anything requests use stops (the pruner, lock enforcement, the
        // engine's attachment …) and before the session is destroyed: the mount goes, then the
        // rings' threads and their workers end. Once the loop has ended this runs first (the
        // `defer` before the loop); here it covers a failure on the way there.
        var serving = true
        func stopServing() {
            guard serving else { return }
            serving = false
            fuse_session_unmount(session)
            rings?.stop()
        }
        defer { stopServing() }
        if options.readAheadKiB > 0, let device = MountTable.entry(at: mountPoint)?.device, !device.isEmpty {
            // Applied at the first request after INIT (the INIT reply caps it at the kernel's offer).
            // The device comes from the mount table: a `stat` of the mount point would wait for
            // this daemon, which does not serve yet.
            filesystem.pendingReadAhead.withLock { $0 = (path: "/sys/class/bdi/\(device)/read_ahead_kb", kibibytes: options.readAheadKiB) }
            filesystem.readAheadPending.store(true, ordering: .releasing)
        }

        filesystem.storageEdges.attach(session)
        defer {
            filesystem.storageEdges.attach(nil)
            filesystem.storageEdges.drain()
        }
        let pruner = InodePruner(filesystem: filesystem, session: session)
        pruner.start()
        defer { pruner.stop() }
        let enforcement = LockEnforcement(filesystem: filesystem, session: session)
        defer { enforcement.settle() }
        // The background rewrites of an identity's files take turns on one queue.
        let rewrites = DispatchQueue(label: "custody.rewrites")
        let reprotection = engine.map { PolicyReprotection(filesystem: filesystem, engine: $0, queue: rewrites) }
        let upgrade = engine.map { FormatUpgrade(filesystem: filesystem, engine: $0, queue: rewrites) }
        let volume = MountVolume(mountPoint: mountPoint, backingDirectory: backing, allowsOtherUsers: options.allowOther,
                                 filesystem: filesystem, session: session, enforcement: enforcement, reprotection: reprotection,
                                 upgrade: upgrade)
        engine?.attach(volume)
        defer { engine?.detach(volume) }
        // What earlier formats stored for identities whose keys are held already is brought up to
        // date in the background (others' when their keys appear).
        if let engine, let upgrade, !readOnly {
            for account in engine.accounts() where engine.nameKey(for: account.id) != nil { upgrade.start(for: account) }
        }
        // A re-protection a stopped daemon left unfinished (its account says so) runs again.
        if let engine, let reprotection, !readOnly {
            for account in engine.accounts() where account.reprotectPending && account.isEnrolled { reprotection.start(for: account) }
        }
        // A wipe a stopped daemon journaled is finished before requests are served (with several
        // mounts the daemon does it once all are attached).
        if completesPendingWipes {
            do { try engine?.completePendingWipes() } catch { throw .sessionFailed("cannot complete an interrupted wipe: \(error)") }
        }

        _ = Self.wakeHandlerInstalled
        let stopEarly = running.withLock { state in
            state.session = session
            state.thread = pthread_self()
            return state.stopRequested
        }
        defer { running.withLock { $0.session = nil; $0.thread = nil } }
        if stopEarly { return }

        // The mount is attached to the engine but serves nothing yet (a daemon with several
        // mounts finishes interrupted wipes here, once all are attached).
        beforeServing()
        if let rings, options.requestRings {
            rings.start()
            filesystem.requestRings = rings
        }
        running.withLock { state in
            state.transport = rings.map { rings in
                switch rings.state {
                case .started:
                    return "per-CPU request rings (FUSE over io_uring, one thread per CPU; requests that may wait on up to \(rings.mostWorkers) workers)"
                case .unavailable(let reason): return "/dev/fuse (\(options.requestRings ? reason : "request rings turned off"))"
                }
            } ?? "/dev/fuse (libfuse refused the custom I/O: no request rings, and the kernel checks set-ID bits itself)"
        }
        defer { stopServing() }
        mounted()

        let config = fuse_loop_cfg_create()
        defer { fuse_loop_cfg_destroy(config) }
        fuse_loop_cfg_set_max_threads(config, UInt32(max(1, options.maxThreads)))
        fuse_loop_cfg_set_clone_fd(config, 1)
        _ = fuse_session_loop_mt(session, config)
    }

    private func mountOptionString() -> String {
        var parts = ["fsname=\(Self.escapeOption(backing))", "subtype=custody"]
        if options.kernelChecksPermissions { parts.append("default_permissions") }
        if options.allowOther { parts.append("allow_other") }
        // The kernel refuses every change with EROFS, as on the store itself.
        if readOnly { parts.append("ro") }
        return parts.joined(separator: ",")
    }

    /// libfuse splits options at commas and treats backslash as an escape.
    private static func escapeOption(_ value: String) -> String {
        value.replacingAll(of: "\\", with: "\\\\").replacingAll(of: ",", with: "\\,")
    }

    private static func isEmptyDirectory(_ path: String) -> Bool {
        (try? Syscall.directoryNames(atPath: path))?.isEmpty ?? false
    }
}

