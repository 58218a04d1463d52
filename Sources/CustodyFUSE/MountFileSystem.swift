import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// A mount's file system: every request is served from the backing tree, a file of a managed
/// identity through its encrypted form, any other file as it is. This file holds its state and
/// how it finds objects by name; the operations are in files named by their group
/// (`MountFileSystem+Attributes`, `+Names`, `+OpenCreate`, `+ReadWrite`, `+Directories`,
/// `ExtendedAttributes`), the protection of content in `Protection`, and whose uid pays for space
/// in `AllocationPolicy`.
///
/// Requests arrive on several threads at once. Shared state lives in `InodeTable` (its own lock)
/// and in the handle objects; everything else here is immutable.
final class MountFileSystem: @unchecked Sendable {
    let inodes: InodeTable
    let options: MountOptions
    /// The engine that decides owners and holds keys; nil serves a plain passthrough.
    let engine: Engine?
    let daemonUID = geteuid()
    let daemonGID = getegid()
    /// Where the mount is, for events (set once before serving).
    var mountPointPath = ""

    /// Inode pressure (see `InodePruner`): above `inodeHighWater` the pruner is woken and
    /// directory listings stop creating inodes.
    let inodeHighWater: Int
    let inodeLowWater: Int
    let pruneSignal = DispatchSemaphore(value: 0)
    /// Told of every request when the mount asks for low-latency wake-ups.
    let wakeBoost: WakeLatencyBoost?
    /// Requests served so far (the pruner's thread gives memory back once they stop coming).
    let requestCount = Atomic<UInt64>(0)
    /// The mount's read-ahead, set once after INIT (see `FUSEMount.run`).
    let readAheadPending = Atomic<Bool>(false)
    let pendingReadAhead = Mutex<(path: String, kibibytes: Int)?>(nil)
    /// Fetches the next files of a directory that is being read file by file.
    let directoryReadAhead: DirectoryReadAhead
    /// Space of removed files, and what the kernel caches after a failed write (`FullDisk.swift`).
    let storageEdges: StorageEdges
    /// What the daemon counts (nil: nothing is counted).
    let metrics: MountMetrics?
    /// Whether FLUSH (one per `close`) is served. When not, the first one is answered ENOSYS and
    /// the kernel sends no more: a close then costs the caller no round trip.
    let servesFlush: Bool
    /// The per-CPU request rings, when the mount uses them (set before requests are served).
    var requestRings: RequestRings?
    /// The mount's root, and its backing directory open for reading (-1 if it could not be
    /// opened): the kernel does not cache the root's ACL, and asks for it at every path walk
    /// through the root by a user other than its owner, so it is read through this descriptor
    /// rather than the /proc path an O_PATH descriptor needs (see `backingGetxattr`).
    let root: Inode
    let rootDirectory: Int32
    /// Whether writes are near the backing store's reserved blocks (see `writingAsOwner`).
    let rootReserve: RootReserve
    /// The name keys last taken from the engine (`heldNameKeys`).
    let nameKeyCache = Mutex<NameKeySet>(.empty)
    /// The names of the store's records (`StoreAttributes`: `trusted.custody.*`, or
    /// `user.custody.store.*` on a store that keeps only `user.*` attributes).
    let storeAttributes: StoreAttributes
    /// Directory tweaks made so far (`DirectoryTweakState.none`).
    let tweaksMade = Atomic<UInt64>(0)
    /// The owners of key IDs in owner records (`protection(from:)`), for the engine's owner
    /// generation.
    let keyIDOwners = Mutex<(generation: UInt64, owners: [[UInt8]: Owner])>((.max, [:]))
    /// Changes of a name's form made other than by a request about that name (an owner change,
    /// an upgrade, an exchange): each ends what directories the mount made know of their names
    /// (`MadeDirectoryNames`).
    let formChanges = Atomic<UInt64>(0)

    init(root: Inode, options: MountOptions, storeAttributes: StoreAttributes = .trusted, engine: Engine?, metrics: MountMetrics? = nil,
         descriptorLimit: Int = InodePruner.descriptorLimit()) {
        self.storeAttributes = storeAttributes
        let inodes = InodeTable(root: root)
        self.inodes = inodes
        self.root = root
        rootReserve = RootReserve(fd: root.fd, device: root.device)
        rootDirectory = (try? Syscall.openat(root.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) ?? -1
        directoryReadAhead = DirectoryReadAhead { ids in Self.fetchFirstBytes(of: ids, in: inodes) }
        self.options = options.served
        self.engine = engine
        self.metrics = metrics
        wakeBoost = options.lowLatency ? WakeLatencyBoost.shared : nil
        inodeHighWater = max(64, descriptorLimit * 6 / 10)
        inodeLowWater = max(32, descriptorLimit * 4 / 10)
        storageEdges = StorageEdges()
        servesFlush = options.flushOnClose ?? BackingStore.reportsErrorsAtClose(root.fd)
    }

    deinit { if rootDirectory >= 0 { Syscall.close(rootDirectory) } }

    /// Has the disk start reading the first bytes of these regular files (see `DirectoryReadAhead`).
    static func fetchFirstBytes(of ids: [UInt64], in inodes: InodeTable) {
        for id in ids {
            guard let inode = try? inodes.inode(id), inode.isRegularFile else { continue }
            // Through the inode's own descriptor: the same file that was listed, whatever its name is now.
            guard let fd = try? Syscall.open(inode.procPath, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC) else { continue }
            Syscall.willNeed(fd, offset: 0, length: DirectoryReadAhead.length)
            Syscall.close(fd)
        }
    }

    /// True (and the pruner woken) when the kernel holds more inodes than the high-water mark.
    var underInodePressure: Bool {
        guard inodes.count > inodeHighWater else { return false }
        pruneSignal.signal()
        return true
    }

    // MARK: Session

    /// Writes the mount's read-ahead (needs root; without it the kernel's default stays).
    func applyPendingReadAhead() {
        guard readAheadPending.exchange(false, ordering: .acquiringAndReleasing),
              let pending = pendingReadAhead.withLock({ $0 }) else { return }
        let fd = Glibc.open(pending.path, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        defer { Glibc.close(fd) }
        let text = "\(pending.kibibytes)\n"
        _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
    }

    func configure(_ conn: UnsafeMutablePointer<fuse_conn_info>) {
        func want(_ capability: Int32, _ enabled: Bool = true) {
            let bit = UInt32(bitPattern: capability)
            if enabled, conn.pointee.capable & bit != 0 {
                conn.pointee.want |= bit
            } else {
                conn.pointee.want &= ~bit
            }
        }
        want(FUSE_CAP_WRITEBACK_CACHE, options.writebackCache)
        // Requests are read into memory, where the custom I/O (`CFuseRing`) sees the flags that
        // libfuse drops (`custody_fuse_request_kills_suidgid`); replies are sent from memory too
        // (see `readPlain`).
        want(FUSE_CAP_SPLICE_READ, false)
        want(FUSE_CAP_SPLICE_WRITE, false)
        want(FUSE_CAP_SPLICE_MOVE, false)
        want(FUSE_CAP_ASYNC_READ)
        want(FUSE_CAP_PARALLEL_DIROPS)
        want(FUSE_CAP_AUTO_INVAL_DATA)
        want(FUSE_CAP_READDIRPLUS)
        want(FUSE_CAP_READDIRPLUS_AUTO)
        want(FUSE_CAP_ATOMIC_O_TRUNC)
        want(FUSE_CAP_CACHE_SYMLINKS)
        want(FUSE_CAP_EXPORT_SUPPORT, false)
        // Where the kernel checks permissions it must also enforce the POSIX ACLs that the
        // backing store keeps and `getfacl` shows; without FUSE_POSIX_ACL it would show them and
        // check the mode alone. The caller's umask then comes unapplied (FUSE_DONT_MASK), so that
        // a directory's default ACL overrides it, as on a local file system (`withCallerMask`).
        want(FUSE_CAP_POSIX_ACL, options.kernelChecksPermissions)
        want(FUSE_CAP_DONT_MASK, options.kernelChecksPermissions)
        let background = MountOptions.mostBackgroundRequests(threads: options.maxThreads)
        conn.pointee.max_background = UInt32(background)
        conn.pointee.congestion_threshold = UInt32(max(1, background * 3 / 4))
    }

    // MARK: Entries and attributes

    func entryParam(id: UInt64, attributes: stat) -> fuse_entry_param {
        var entry = fuse_entry_param()
        entry.ino = fuse_ino_t(id)
        entry.attr = attributes
        entry.attr_timeout = options.attributeTimeout
        entry.entry_timeout = options.entryTimeout
        return entry
    }

    /// Looks `name` (as a request gives it) up in `parent` (node `parentID`) and registers one
    /// kernel lookup of it.
    func lookupEntry(in parent: Inode, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) throws(Errno) -> fuse_entry_param {
        let (resolved, fd) = try findEntry(name, in: parent, parentID: UInt64(parentID)) { (stored) throws(Errno) in try openPath(parent.fd, stored) }
        return try rememberEntry(pathFD: fd, name: resolved.entryName(in: UInt64(parentID)), in: parent)
    }

    /// Looks up an entry whose stored name is known (just made, or listed). `made`: see
    /// `InodeTable.remember`.
    func lookupEntry(in parent: Inode, _ parentID: fuse_ino_t, _ resolved: ResolvedName, made: MadeDirectoryNames? = nil) throws(Errno) -> fuse_entry_param {
        let fd = try openPath(parent.fd, resolved.stored.cString)
        return try rememberEntry(pathFD: fd, name: resolved.entryName(in: UInt64(parentID)), in: parent, made: made)
    }

    /// An O_PATH descriptor on what `fd` (just opened by `name` in `parent`) refers to: by the
    /// name, a lookup of one name, when that still leads to the same object (with its
    /// attributes); else by `fd`'s /proc path, a walk of /proc.
    func pathDescriptor(of fd: Int32, named name: UnsafePointer<CChar>, in parent: Inode) throws(Errno) -> (Int32, stat?) {
        if let byName = try? openPath(parent.fd, name) {
            if let opened = try? Syscall.fstat(fd), let found = try? Syscall.stat(of: byName),
               opened.st_dev == found.st_dev, opened.st_ino == found.st_ino {
                return (byName, found)
            }
            Syscall.close(byName)
        }
        return (try withDescriptor { () throws(Errno) in try Syscall.open(Syscall.procPath(fd), Linux.O_PATH | O_CLOEXEC) }, nil)
    }

    /// `openat(O_PATH)`; out of descriptors, it wakes the pruner and waits for the kernel to
    /// forget some inodes (up to about a second) before giving up with EMFILE.
    func openPath(_ directory: Int32, _ name: UnsafePointer<CChar>) throws(Errno) -> Int32 {
        try withDescriptor { () throws(Errno) in try Syscall.openat(directory, name, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC) }
    }

    /// Runs a call that makes a descriptor; out of descriptors (EMFILE fails before anything is
    /// created, so a retry is safe), it wakes the pruner and waits for the kernel to forget some
    /// inodes, for up to about a second, before giving up.
    func withDescriptor(_ body: () throws(Errno) -> Int32) throws(Errno) -> Int32 {
        var attempts = 0
        while true {
            do {
                return try body()
            } catch where (error.rawValue == EMFILE || error.rawValue == ENFILE) && attempts < 50 {
                attempts += 1
                pruneSignal.signal()
                usleep(20_000)
            }
        }
    }

    /// Registers one kernel lookup of the object an O_PATH descriptor refers to (taking the
    /// descriptor). `protection`, when known (a file just created), saves probing it.
    /// `parent`: the directory `name` is in (its record is then read by name, not by /proc);
    /// `stated`: the attributes of `fd`, when the caller has them.
    func rememberEntry(pathFD fd: Int32, name: EntryName?, in parent: Inode? = nil, stated: stat? = nil,
                       protection known: Protection? = nil, made: MadeDirectoryNames? = nil) throws(Errno) -> fuse_entry_param {
        let attributes: stat
        do throws(Errno) {
            if let stated { attributes = stated } else { attributes = try Syscall.stat(of: fd) }
        } catch {
            Syscall.close(fd)
            throw error
        }
        if options.sharedStore { inodes.detachIfGone(attributes) }
        let id = inodes.remember(fd: fd, attributes: attributes, name: name, made: made)
        _ = underInodePressure
        guard let inode = try? inodes.inode(id) else { return entryParam(id: id, attributes: attributes) }
        if let known {
            inode.protectionState.withLock { $0.protection = known }
        } else if let parent, let name {
            readProtectionAgainOnSharedStore(inode)
            _ = protection(of: inode, lookedUpAs: BackingEntry(directory: parent, name: name.storedName))
        }
        var entry = entryParam(id: id, attributes: presented(attributes, of: inode))
        entry.attr_timeout = attributeTimeout(of: inode)
        return entry
    }
}
