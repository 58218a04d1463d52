import CustodyFormat

/// How a mount talks to the kernel: caching, threads, who may use it.
public struct MountOptions: Sendable, Equatable {
    /// Seconds the kernel may cache a name → node mapping.
    public var entryTimeout: Double = 1.0
    /// Seconds the kernel may cache attributes.
    public var attributeTimeout: Double = 1.0
    /// Seconds the kernel may cache "no such name" (0 disables negative caching).
    public var negativeTimeout: Double = 1.0
    /// Let the kernel buffer writes in the page cache and send them in large batches.
    public var writebackCache: Bool = true
    /// Let users other than the mounting one use the mount (implies `defaultPermissions`).
    public var allowOther: Bool = false
    /// Have the kernel check permissions from the file modes.
    public var defaultPermissions: Bool = false
    /// Whether the kernel checks permissions (from modes and POSIX ACLs) rather than leaving the
    /// mount to its one user.
    public var kernelChecksPermissions: Bool { allowOther || defaultPermissions }
    /// Mount over a mount point that is not empty.
    public var allowNonEmpty: Bool = false
    /// Hold a CPU wake-up latency bound (PM QoS) while requests arrive back to back, so that
    /// idle CPUs poll instead of halting between a request and its reply (`WakeLatencyBoost`).
    public var lowLatency: Bool = true
    /// Kernel read-ahead for the mount, in KiB (its `/sys/class/bdi/…/read_ahead_kb`; the kernel's
    /// default is 128). Larger read-ahead means fewer, larger READ requests for sequential reads.
    /// 0 leaves the kernel's default.
    public var readAheadKiB: Int = 1024
    /// Whether `close` reaches the daemon (a FLUSH request per close): nil decides by the backing
    /// store, serving it only where closing a file there can report an error of its own (network
    /// file systems, another FUSE mount; see `BackingStore`). Where it is not served, the kernel
    /// still writes the file's cached pages back at close and reports their errors.
    public var flushOnClose: Bool? = nil
    /// Serve requests on the CPU that sent them, through per-CPU request rings (FUSE over
    /// io_uring, `RequestRings`), where the kernel offers them; /dev/fuse otherwise.
    public var requestRings: Bool = true
    /// The most request threads: those of the /dev/fuse session loop, and with request rings the
    /// workers that serve requests that may wait (fsync, large reads and writes, truncation).
    public var maxThreads: Int = 8
    /// Store the names (and symlink targets) of managed identities' new entries encrypted
    /// (`EncryptedNames.swift`). Off, new names are stored as given; encrypted ones are still
    /// read either way.
    public var encryptNames: Bool = true
    /// Other daemons (on other hosts, or this one) serve the same backing directory: a shared
    /// store, such as an NFS export. The mount then keeps nothing that a change made through
    /// another daemon could leave stale past the next open: no writeback cache (each write
    /// reaches the store before `close` returns), no cached names or missing names (every path
    /// walk asks the daemon), no cached listings or file pages across opens, and no knowledge of
    /// a directory's names or of its lacking a tweak. What another host wrote and closed is seen
    /// by the next open of its path (close-to-open, as NFS promises); attributes may be up to
    /// `attributeTimeout` old until then.
    public var sharedStore: Bool = false
    /// The namespace of the extended attributes the store's records are in (`StoreAttributes`):
    /// nil decides by the store (the marker on its root; else `trusted` where the store keeps
    /// it, `user` where it keeps only that, as NFS does).
    public var storeAttributes: StoreAttributes.Namespace? = nil
    /// Create nothing (EACCES, a `policyRequired` event) until the accounts the configuration
    /// declares are enrolled (`Engine.mayCreate`), instead of serving plain files before any
    /// policy exists.
    public var policyRequired: Bool = false
    /// Threads kept for requests somebody waits for (`mostBackgroundRequests`).
    static let threadsForCallers = 2

    /// The most requests nobody waits for (write-back's WRITEs, read-ahead's READs) the kernel
    /// has the daemon serve at once: fewer than its threads, so that requests a caller waits for
    /// always find a thread. On a slow store each of those requests waits for the store; had the
    /// kernel as many of them out as the daemon has threads (or ring entries), another user's
    /// `stat` would wait for the write-back.
    static func mostBackgroundRequests(threads: Int) -> Int {
        max(1, threads - threadsForCallers)
    }
    /// Print every FUSE request (libfuse's debug output).
    public var debug: Bool = false
    /// Install libfuse's SIGTERM/SIGINT/SIGHUP handlers (a single-mount program); a daemon with
    /// several mounts handles signals itself and calls `FUSEMount.stop()`.
    public var handleSignals: Bool = true

    public init() {}

    /// The options as the mount serves them: on a shared store, without the caches it rules out.
    var served: MountOptions {
        guard sharedStore else { return self }
        var served = self
        served.writebackCache = false
        served.entryTimeout = 0
        served.negativeTimeout = 0
        return served
    }
}
