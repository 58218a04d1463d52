import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// The plaintext passthrough: every request is served from the backing tree as it is. This is the
/// "no identity" path that the protected paths build on.
///
/// Requests arrive on several libfuse threads at once. Shared state lives in `InodeTable` (its own
/// lock) and in the handle objects; everything else here is immutable.
final class PassthroughFilesystem: @unchecked Sendable {
    let inodes: InodeTable
    let options: MountOptions
    /// The engine that decides owners and holds keys; nil serves a plain passthrough.
    let engine: Engine?
    private let daemonUID = geteuid()
    private let daemonGID = getegid()

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

    init(root: Inode, options: MountOptions, engine: Engine?, metrics: MountMetrics? = nil, descriptorLimit: Int = InodePruner.descriptorLimit()) {
        let inodes = InodeTable(root: root)
        self.inodes = inodes
        self.root = root
        rootReserve = RootReserve(fd: root.fd, device: root.device)
        rootDirectory = (try? Syscall.openat(root.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) ?? -1
        directoryReadAhead = DirectoryReadAhead { ids in Self.fetchFirstBytes(of: ids, in: inodes) }
        self.options = options
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

    private func entryParam(id: UInt64, attributes: stat) -> fuse_entry_param {
        var entry = fuse_entry_param()
        entry.ino = fuse_ino_t(id)
        entry.attr = attributes
        entry.attr_timeout = options.attributeTimeout
        entry.entry_timeout = options.entryTimeout
        return entry
    }

    /// Looks `name` up in `parent` (node `parentID`) and registers one kernel lookup of it.
    private func lookupEntry(in parent: Inode, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) throws(Errno) -> fuse_entry_param {
        let fd = try openPath(parent.fd, name)
        return try rememberEntry(pathFD: fd, name: EntryName(parent: UInt64(parentID), name: FileName(cString: name)), in: parent)
    }

    /// An O_PATH descriptor on what `fd` (just opened by `name` in `parent`) refers to: by the
    /// name, a lookup of one name, when that still leads to the same object (with its
    /// attributes); else by `fd`'s /proc path, a walk of /proc.
    private func pathDescriptor(of fd: Int32, named name: UnsafePointer<CChar>, in parent: Inode) throws(Errno) -> (Int32, stat?) {
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
    private func openPath(_ directory: Int32, _ name: UnsafePointer<CChar>) throws(Errno) -> Int32 {
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
    private func rememberEntry(pathFD fd: Int32, name: EntryName?, in parent: Inode? = nil, stated: stat? = nil,
                               protection known: Protection? = nil) throws(Errno) -> fuse_entry_param {
        let attributes: stat
        do throws(Errno) {
            if let stated { attributes = stated } else { attributes = try Syscall.stat(of: fd) }
        } catch {
            Syscall.close(fd)
            throw error
        }
        let id = inodes.remember(fd: fd, attributes: attributes, name: name)
        _ = underInodePressure
        guard let inode = try? inodes.inode(id) else { return entryParam(id: id, attributes: attributes) }
        if let known {
            inode.protectionState.withLock { $0.protection = known }
        } else if let parent, let name {
            _ = protection(of: inode, lookedUpAs: BackingEntry(directory: parent, name: name.name))
        }
        var entry = entryParam(id: id, attributes: presented(attributes, of: inode))
        entry.attr_timeout = attributeTimeout(of: inode)
        return entry
    }

    func lookup(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            var entry = try lookupEntry(in: try inodes.inode(UInt64(parentID)), parentID, name)
            fuse_reply_entry(req, &entry)
        } catch where error == .noSuchFile && options.negativeTimeout > 0 {
            var negative = fuse_entry_param()
            negative.entry_timeout = options.negativeTimeout
            fuse_reply_entry(req, &negative)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func forget(_ id: fuse_ino_t, _ count: UInt64) {
        inodes.forget(UInt64(id), count: count)
    }

    func getattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            var attributes: stat
            if let fi, fi.pointee.fh != 0, inode.isRegularFile, let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) {
                // With the writeback cache the kernel asks for attributes through the handle before
                // it takes a write into its page cache (when they are not cached): a handle whose
                // keys are revoked fails here, so the write fails with EACCES instead of waiting
                // in the page cache for an unlock.
                _ = try liveContent(file)
                attributes = try Syscall.fstat(file.backingFD)
            } else {
                attributes = try Syscall.stat(of: inode.fd)
            }
            attributes = presented(attributes, of: inode)
            fuse_reply_attr(req, &attributes, attributeTimeout(of: inode))
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func setattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ new: UnsafeMutablePointer<stat>, _ toSet: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>?) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let file: OpenFile? = fi.flatMap { $0.pointee.fh != 0 && inode.isRegularFile ? HandleBox.borrow($0.pointee.fh, as: OpenFile.self) : nil }
            if toSet & custody_SET_ATTR_MODE != 0 {
                if let file {
                    try Syscall.fchmod(file.backingFD, new.pointee.st_mode)
                } else if inode.isSymlink {
                    throw Errno.notSupported
                } else {
                    try Syscall.chmod(of: inode.fd, new.pointee.st_mode)
                }
            }
            if toSet & (custody_SET_ATTR_UID | custody_SET_ATTR_GID) != 0 {
                let uid = toSet & custody_SET_ATTR_UID != 0 ? new.pointee.st_uid : uid_t.max
                let gid = toSet & custody_SET_ATTR_GID != 0 ? new.pointee.st_gid : gid_t.max
                try Syscall.fchownat(inode.fd, "", uid, gid, Linux.AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
            }
            if toSet & custody_SET_ATTR_SIZE != 0 {
                // A truncation ends the refusal of gaps after a failed write.
                inode.protectionState.withLock { $0.refusingGaps = nil }
                let size = UInt64(max(0, new.pointee.st_size))
                // Extending an encrypted file writes its last block.
                func truncate(_ content: ProtectedContent) throws(Errno) {
                    try content.requireWritable()
                    try asOwner(of: inode) { () throws(Errno) in
                        do throws(FormatError) { try content.file.truncate(to: size) } catch { throw error.errnoValue }
                    }
                }
                if let file, let content = try liveContent(file) {
                    try truncate(content)
                } else if inode.isRegularFile, protection(of: inode).isEncrypted {
                    try withContent(inode) { (content) throws(Errno) in try truncate(content) }
                } else if let file {
                    try Syscall.ftruncate(file.fd, Int64(new.pointee.st_size))
                } else {
                    try Syscall.truncate(inode.procPath, Int64(new.pointee.st_size))
                }
            }
            if toSet & (custody_SET_ATTR_ATIME | custody_SET_ATTR_MTIME) != 0 {
                let omit = timespec(tv_sec: 0, tv_nsec: Linux.UTIME_OMIT)
                let now = timespec(tv_sec: 0, tv_nsec: Linux.UTIME_NOW)
                var times = [omit, omit]
                if toSet & custody_SET_ATTR_ATIME_NOW != 0 { times[0] = now }
                else if toSet & custody_SET_ATTR_ATIME != 0 { times[0] = new.pointee.st_atim }
                if toSet & custody_SET_ATTR_MTIME_NOW != 0 { times[1] = now }
                else if toSet & custody_SET_ATTR_MTIME != 0 { times[1] = new.pointee.st_mtim }
                if let file {
                    try Syscall.futimens(file.backingFD, times)
                } else if inode.isSymlink {
                    try Syscall.utimensat(inode.fd, "", times, Linux.AT_EMPTY_PATH)
                } else {
                    try Syscall.utimens(of: inode.fd, times)
                }
            }
            func attributesNow() throws(Errno) -> stat {
                if let file { try Syscall.fstat(file.backingFD) } else { try Syscall.stat(of: inode.fd) }
            }
            // A truncation by a process without CAP_FSETID, or a chown: the set-ID bits go. When
            // there are none, the attributes read to find out are the answer.
            var unchanged: stat?
            if requestKillsSetIDBits(), inode.isRegularFile {
                let current = try attributesNow()
                if let kept = Self.withoutSetIDBits(current.st_mode) {
                    if let file { try Syscall.fchmod(file.backingFD, kept) } else { try Syscall.chmod(of: inode.fd, kept) }
                } else {
                    unchanged = current
                }
            }
            var attributes = if let unchanged { unchanged } else { try attributesNow() }
            attributes = presented(attributes, of: inode)
            fuse_reply_attr(req, &attributes, attributeTimeout(of: inode))
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func access(_ req: fuse_req_t, _ id: fuse_ino_t, _ mask: Int32) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            if !inode.isSymlink {
                try Syscall.faccessat(AT_FDCWD, inode.procPath, mask, AT_EACCESS)
            }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func readlink(_ req: fuse_req_t, _ id: fuse_ino_t) {
        do throws(Errno) {
            let target = try Syscall.readlinkat(try inodes.inode(UInt64(id)).fd, "")
            target.withUnsafeBufferPointer { _ = fuse_reply_readlink(req, $0.baseAddress) }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func statfs(_ req: fuse_req_t, _ id: fuse_ino_t) {
        do throws(Errno) {
            var st = try Syscall.fstatvfs(try inodes.inode(UInt64(id)).fd)
            fuse_reply_statfs(req, &st)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    // MARK: Creating and removing names

    /// Gives a new object the caller's uid and gid, as the kernel would have. The daemon creates it
    /// with its own credentials; the kernel has already checked the caller's permission to create.
    private func giveToCaller(_ req: fuse_req_t, parent: Inode, name: UnsafePointer<CChar>?, fd: Int32?, mode: mode_t) throws(Errno) {
        guard let context = fuse_req_ctx(req)?.pointee else { return }
        guard context.uid != daemonUID || context.gid != daemonGID else { return }
        // In a set-group-ID directory the new object already has the directory's group.
        let parentAttributes = try Syscall.stat(of: parent.fd)
        let gid = parentAttributes.st_mode & S_ISGID != 0 ? gid_t.max : context.gid
        // chown clears set-user-ID and set-group-ID bits on non-directories: put back the mode
        // the object was made with (the one asked for, less the umask).
        var madeWith: mode_t?
        if mode & (S_ISUID | S_ISGID) != 0, mode & S_IFMT != S_IFDIR, let fd { madeWith = try Syscall.fstat(fd).st_mode }
        if let fd {
            try Syscall.fchownat(fd, "", context.uid, gid, Linux.AT_EMPTY_PATH)
        } else if let name {
            try Syscall.fchownat(parent.fd, name, context.uid, gid, AT_SYMLINK_NOFOLLOW)
        }
        if let madeWith, let fd { try Syscall.fchmod(fd, madeWith & ~S_IFMT) }
    }

    /// Calls `body` with the mode to create an object with, under the caller's umask. Where the
    /// kernel checks permissions it leaves the umask to the daemon (FUSE_DONT_MASK), and the
    /// backing file system applies it unless the directory has a default ACL; elsewhere the
    /// kernel has applied it already.
    @inline(__always)
    private func withCallerMask<T>(_ req: fuse_req_t, _ mode: mode_t, _ body: (mode_t) throws(Errno) -> T) throws(Errno) -> T {
        guard options.kernelChecksPermissions, let mask = fuse_req_ctx(req)?.pointee.umask else { return try body(mode) }
        return try CreationMask.creating(mode: mode, mask: mask, body)
    }

    func mkdir(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ mode: mode_t) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            try creatingAsCaller(req, on: parent.device) { () throws(Errno) in
                try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.mkdirat(parent.fd, name, mode) }
            }
            try giveToCaller(req, parent: parent, name: name, fd: nil, mode: mode | S_IFDIR)
            var entry = try lookupEntry(in: parent, parentID, name)
            fuse_reply_entry(req, &entry)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func mknod(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ mode: mode_t, _ device: dev_t) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            try creatingAsCaller(req, on: parent.device) { () throws(Errno) in
                try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.mknodat(parent.fd, name, mode, device) }
            }
            try giveToCaller(req, parent: parent, name: name, fd: nil, mode: mode)
            var entry = try lookupEntry(in: parent, parentID, name)
            fuse_reply_entry(req, &entry)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func symlink(_ req: fuse_req_t, _ target: UnsafePointer<CChar>, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            try creatingAsCaller(req, on: parent.device) { () throws(Errno) in try Syscall.symlinkat(target, parent.fd, name) }
            try giveToCaller(req, parent: parent, name: name, fd: nil, mode: S_IFLNK)
            var entry = try lookupEntry(in: parent, parentID, name)
            fuse_reply_entry(req, &entry)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func link(_ req: fuse_req_t, _ id: fuse_ino_t, _ newParentID: fuse_ino_t, _ newName: UnsafePointer<CChar>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let newParent = try inodes.inode(UInt64(newParentID))
            try creatingAsCaller(req, on: newParent.device) { () throws(Errno) in
                try Syscall.linkat(AT_FDCWD, inode.procPath, newParent.fd, newName, AT_SYMLINK_FOLLOW)
            }
            var entry = try lookupEntry(in: newParent, newParentID, newName)
            fuse_reply_entry(req, &entry)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func unlink(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let victim = knownObject(in: parent, name)
            try Syscall.unlinkat(parent.fd, name, 0)
            removed(victim)
            replyError(req, 0)
            if let victim, victim.inode.isRegularFile { storageEdges.releaseSoon(victim.inode) }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    /// The node the kernel knows for `name` in `parent`, if any, and its link count, looked at
    /// before it is removed or replaced.
    private func knownObject(in parent: Inode, _ name: UnsafePointer<CChar>) -> (id: UInt64, inode: Inode, links: UInt64)? {
        guard let attributes = try? Syscall.fstatat(parent.fd, name, AT_SYMLINK_NOFOLLOW),
              let id = inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)),
              let inode = try? inodes.inode(id) else { return nil }
        return (id, inode, UInt64(attributes.st_nlink))
    }

    /// After a name went: an object that had no other name is detached from its inode number
    /// before the answer, so a file that gets the number next is a new node (`InodeTable`).
    private func removed(_ victim: (id: UInt64, inode: Inode, links: UInt64)?) {
        guard let victim, victim.inode.isDirectory || victim.links <= 1 else { return }
        inodes.detach(victim.id)
    }

    func rmdir(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let victim = knownObject(in: parent, name)
            try Syscall.unlinkat(parent.fd, name, AT_REMOVEDIR)
            removed(victim)
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func rename(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ newParentID: fuse_ino_t, _ newName: UnsafePointer<CChar>, _ flags: UInt32) {
        do throws(Errno) {
            guard flags & Linux.RENAME_WHITEOUT == 0 else { throw Errno.invalidArgument }
            let parent = try inodes.inode(UInt64(parentID))
            let newParent = try inodes.inode(UInt64(newParentID))
            let replaced = flags & Linux.RENAME_EXCHANGE == 0 ? knownObject(in: newParent, newName) : nil
            try creatingAsCaller(req, on: newParent.device) { () throws(Errno) in
                try Syscall.renameat2(parent.fd, name, newParent.fd, newName, flags)
            }
            removed(replaced)
            replyError(req, 0)
            if let replaced, replaced.inode.isRegularFile { storageEdges.releaseIfUnlinked(replaced.inode) }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    // MARK: Files

    /// The flags to open the backing file with.
    private func backingFlags(_ requested: Int32) -> Int32 {
        var flags = requested & ~(O_NOFOLLOW | O_CREAT | O_EXCL | Linux.O_DIRECT) | O_CLOEXEC
        if options.writebackCache {
            // The kernel reads pages to complete partial writes, and appends by itself.
            if flags & O_ACCMODE == O_WRONLY {
                flags = (flags & ~O_ACCMODE) | O_RDWR
            }
            flags &= ~O_APPEND
        }
        return flags
    }

    /// How the kernel caches a new handle's data.
    private func setCaching(_ fi: UnsafeMutablePointer<fuse_file_info>) {
        // O_DIRECT goes straight to the daemon, encrypted or not (otherwise the kernel takes its
        // page-cache path for each request: an asynchronous-I/O wait per read).
        if fi.pointee.flags & Linux.O_DIRECT != 0 { fi.pointee.direct_io = 1 }
        // This daemon is the only writer of the backing tree: cached pages stay valid.
        fi.pointee.keep_cache = 1
    }

    /// Whether the request being served asks for the set-ID bits to go (see `clearSetIDBits`).
    private func requestKillsSetIDBits() -> Bool {
        custody_fuse_request_kills_suidgid() != 0
    }

    /// Clears a backing file's set-user-ID bit, and its set-group-ID bit where group execution is
    /// allowed, as a local file system does when a process without CAP_FSETID writes or truncates
    /// a file, and at a chown. The daemon holds CAP_FSETID, so the backing file system would keep
    /// them on the daemon's own writes; the kernel says in the request when they must go
    /// (FUSE_HANDLE_KILLPRIV_V2). File capabilities (`security.capability`) need nothing here:
    /// the backing file system drops them at every write, truncation and chown, the daemon's too.
    /// Whether any bit went.
    @discardableResult
    func clearSetIDBits(_ fd: Int32) throws(Errno) -> Bool {
        guard let kept = Self.withoutSetIDBits(try Syscall.fstat(fd).st_mode) else { return false }
        try Syscall.fchmod(fd, kept)
        return true
    }

    /// The permission bits `mode` keeps once its set-ID bits are cleared; nil when none go.
    static func withoutSetIDBits(_ mode: mode_t) -> mode_t? {
        let bits = mode & 0o7777
        var kept = bits & ~S_ISUID
        if bits & S_IXGRP != 0 { kept &= ~S_ISGID }
        return kept == bits ? nil : kept
    }

    func open(_ req: fuse_req_t, _ id: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            var current = inode.isRegularFile ? protection(of: inode) : .untracked
            var fresh: ProtectedContent?
            // Truncating re-owns the file to the caller below: none of the old owner's data is
            // left to move. Any other open is a transfer when the identities differ.
            let grant = engine != nil && fi.pointee.flags & O_TRUNC != 0 ? nil : try checkTransfer(req, inode, flags: fi.pointee.flags)
            if inode.isRegularFile, engine != nil, fi.pointee.flags & O_TRUNC != 0 {
                // Opened with truncate: the file gets the caller's effective identity as owner.
                let (wanted, classKey) = try plan(for: callerIdentity(req).identity)
                if wanted != current {
                    let busy = inode.protectionState.withLock { $0.content != nil }
                    if busy { throw Errno(EBUSY) }
                    let fd = try withDescriptor { () throws(Errno) in try Syscall.open(inode.procPath, O_RDWR | O_CLOEXEC) }
                    defer { Syscall.close(fd) }
                    fresh = try applyProtection(wanted, classKey: classKey, fd: fd, inode: inode)
                    if let fresh { inode.protectionState.withLock { $0.content = fresh } }
                    current = wanted
                }
            }
            if let fresh {
                // Re-protected just now: the new, empty content is this handle's.
                fi.pointee.fh = HandleBox.store(OpenFile(content: fresh, inode: inode))
            } else if current.isEncrypted {
                let content = try acquireContent(inode)
                if content.readOnly, fi.pointee.flags & O_ACCMODE != O_RDONLY || fi.pointee.flags & O_TRUNC != 0 {
                    releaseContent(content, of: inode)
                    throw Errno.readOnlyFileSystem
                }
                if fi.pointee.flags & O_TRUNC != 0 {
                    do throws(FormatError) { try content.file.truncate(to: 0) } catch {
                        releaseContent(content, of: inode)
                        throw error.errnoValue
                    }
                }
                fi.pointee.fh = HandleBox.store(OpenFile(content: content, inode: inode, grant: grant))
            } else {
                let fd = try withDescriptor { () throws(Errno) in try Syscall.open(inode.procPath, backingFlags(fi.pointee.flags)) }
                fi.pointee.fh = HandleBox.store(OpenFile(fd: fd, inode: inode, grant: grant))
            }
            if requestKillsSetIDBits(), let handle = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) {
                // Opened with O_TRUNC by a process without CAP_FSETID.
                do throws(Errno) { try clearSetIDBits(handle.backingFD) } catch {
                    releaseHandle(fi.pointee.fh)
                    throw error
                }
            }
            setCaching(fi)
            // Across identities every request reaches the daemon, which checks the grant again:
            // nothing is served from pages an owner's reads cached.
            if grant?.bypassesCache == true { fi.pointee.direct_io = 1 }
            // Noted before the answer, so that the program's next open, which may come on
            // another thread as soon as this one is answered, finds this one done.
            if inode.isRegularFile, fi.pointee.flags & O_ACCMODE == O_RDONLY, let parent = inodes.name(of: UInt64(id))?.parent {
                directoryReadAhead.opened(UInt64(id), in: parent)
            }
            if fuse_reply_open(req, fi) != 0 {
                releaseHandle(fi.pointee.fh)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func create(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ mode: mode_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            var (wanted, classKey): (Protection, ClassKey?) = (.untracked, nil)
            if let engine {
                let caller = callerIdentity(req)
                let owner = engine.ownerForNewFile(caller, directoryOwner: directoryOwner(parent))
                try checkCreateTransfer(req, caller: caller, newOwner: owner, in: parent)
                (wanted, classKey) = try plan(for: owner)
            }
            var flags = backingFlags(fi.pointee.flags) | O_CREAT | (fi.pointee.flags & O_EXCL)
            if wanted.isEncrypted { flags = (flags & ~(O_ACCMODE | O_APPEND)) | O_RDWR }
            // A tracked file starts empty: O_TRUNC empties one that appeared in the backing
            // directory meanwhile (and does nothing to a file this open creates).
            if wanted != .untracked { flags |= O_TRUNC }
            // The inode, and an encrypted file's header and owner record, are made as the caller.
            let (fd, content) = try creatingAsCaller(req, on: parent.device) { () throws(Errno) -> (Int32, ProtectedContent?) in
                let fd = try withDescriptor { () throws(Errno) in
                    try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.openat(parent.fd, name, flags | O_NOFOLLOW, mode) }
                }
                do throws(Errno) {
                    try giveToCaller(req, parent: parent, name: nil, fd: fd, mode: mode)
                    guard wanted != .untracked else { return (fd, nil) }
                    return (fd, try applyProtection(wanted, classKey: classKey, fd: fd, inode: nil, isNew: true))
                } catch {
                    Syscall.close(fd)
                    _ = unlinkat(parent.fd, name, 0)
                    throw error
                }
            }
            let handle: OpenFile
            let (pathFD, stated) = try pathDescriptor(of: fd, named: name, in: parent)
            var entry = try rememberEntry(pathFD: pathFD, name: EntryName(parent: UInt64(parentID), name: FileName(cString: name)),
                                          stated: stated, protection: wanted)
            let inode = try inodes.inode(UInt64(entry.ino))
            metrics?.created(wanted.isEncrypted ? .encrypted : wanted == .untracked ? .none : .plain)
            if let content {
                Syscall.close(fd)
                inode.protectionState.withLock { $0.content = content }
                handle = OpenFile(content: content, inode: inode)
            } else {
                handle = OpenFile(fd: fd, inode: inode)
            }
            fi.pointee.fh = HandleBox.store(handle)
            setCaching(fi)
            if fuse_reply_create(req, &entry, fi) != 0 {
                releaseHandle(fi.pointee.fh)
                inodes.forget(UInt64(entry.ino), count: 1)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    /// Ends a handle: closes its descriptor, or releases its share of the encrypted content.
    private func releaseHandle(_ fh: UInt64) {
        /// Ends the handle (its descriptor closes with it); the inode if it was removed meanwhile.
        func end() -> Inode? {
            guard let file = HandleBox.release(fh, as: OpenFile.self), let inode = file.inode else { return nil }
            let unlinked = inode.protectionState.withLock { state -> Bool in
                state.openHandles -= 1
                if state.openHandles == 0 { state.refusingGaps = nil }
                return state.releaseWhenClosed && state.openHandles == 0
            }
            if let content = file.content { releaseContent(content, of: inode) }
            return unlinked ? inode : nil
        }
        if let removed = end() { storageEdges.releaseIfUnlinked(removed) }
    }

    func read(_ req: fuse_req_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        let content: ProtectedContent
        do throws(Errno) {
            try checkGrant(file, write: false)
            guard let live = try liveContent(file) else {
                readPlain(req, file.fd, size, offset)
                return
            }
            content = live
        } catch {
            replyError(req, error.rawValue)
            return
        }
        func answer(from buffer: UnsafeMutableRawBufferPointer) {
            do throws(FormatError) {
                let count = try content.file.read(into: buffer, at: UInt64(offset))
                metrics?.bytesDecrypted.increment(by: Int64(count))
                fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), count)
            } catch {
                log("read of an encrypted file failed: \(error)")
                noteTampering(error, of: file.inode, owner: content.lease.identity, content: content)
                replyError(req, error.errnoValue.rawValue)
            }
        }
        // On a request ring the plaintext goes straight into the ring entry (zeroed once sent).
        if let buffer = ringAnswerBuffer(size, sensitive: true) { return answer(from: buffer) }
        Self.plaintextBuffers.withBuffer(byteCount: size) { answer(from: $0) }
    }

    /// The request ring entry's payload, where a READ's answer is built and then sent without a
    /// copy; nil when the request did not come from a ring (see `RequestRings`).
    @inline(__always)
    private func ringAnswerBuffer(_ size: Int, sensitive: Bool) -> UnsafeMutableRawBufferPointer? {
        guard requestRings != nil, let base = custody_fuse_ring_borrow_payload(size, sensitive ? 1 : 0) else { return nil }
        return UnsafeMutableRawBufferPointer(start: base, count: size)
    }

    /// Buffers for reads of plain files (up to 1 MiB), kept for reuse; not zeroed, as the same
    /// bytes lie unencrypted in the backing file.
    static let passthroughBuffers = BufferPool(capacity: 1 << 20, keep: 2, zeroesOnReturn: false, smallLimit: 64 << 10)

    /// A plain file's bytes are read into a kept buffer and sent from there. Handing libfuse the
    /// descriptor (`fuse_reply_data`) would splice only replies of 8 KiB or more that a pipe holds
    /// whole, never a 1 MiB read without `CAP_SYS_RESOURCE`, and otherwise reads into memory
    /// allocated for each request: 256 fresh pages per MiB (see `docs/performance.md`).
    private func readPlain(_ req: fuse_req_t, _ fd: Int32, _ size: Int, _ offset: off_t) {
        func answer(from buffer: UnsafeMutableRawBufferPointer) {
            do throws(Errno) {
                let count = try buffer.baseAddress.map { (base) throws(Errno) in try Syscall.preadAll(fd, base, size, Int64(offset)) } ?? 0
                fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), count)
            } catch {
                replyError(req, error.rawValue)
            }
        }
        if let buffer = ringAnswerBuffer(size, sensitive: false) { return answer(from: buffer) }
        Self.passthroughBuffers.withBuffer(byteCount: size) { answer(from: $0) }
    }

    /// Large writes come from the kernel's write-back of a file being streamed: start the backing
    /// file's own write-back at once, so that the disk works while more data arrives instead of
    /// all at the final fsync. Small writes (databases rewriting pages) wait for the kernel's
    /// usual write-back.
    static let writeBehindThreshold = 256 * 1024

    /// Starts the write-back before the WRITE is answered. Starting it is not always quick: a
    /// journalling store takes room in its journal first, which on a slow store waits for the
    /// store. Before the answer, that wait counts against the kernel's limit of requests nobody
    /// waits for (`MountOptions.mostBackgroundRequests`), so the write-back of one streamed file
    /// can keep at most that many threads (or ring entries) and never all of them; after the
    /// answer it counted against nothing, and with /dev/fuse the kernel sent WRITE after WRITE
    /// until every thread waited in write-back and another user's `stat` waited seconds for one.
    private func writeBehind(_ fd: Int32, written: Int) {
        if written >= Self.writeBehindThreshold { Syscall.startWriteback(fd) }
    }

    /// Plaintext of one encrypted read or write (up to 1 MiB), kept for reuse and zeroed after
    /// each use (see `BufferPool`).
    static let plaintextBuffers = BufferPool(capacity: 1 << 20, keep: 2, zeroesOnReturn: true, smallLimit: 64 << 10)

    /// Whom space for an inode's file is allocated as: its owner (`AllocationCredentials`).
    @inline(__always)
    private func allocationOwner(_ inode: Inode?) -> uid_t {
        inode.map { uid_t($0.ownerUID.load(ordering: .relaxed)) } ?? AllocationCredentials.daemonFSUID
    }

    /// Runs `body`, a write of up to 1 MiB to `inode`'s file, as its owner where it could reach
    /// the space the backing store keeps for root (`RootReserve`). Larger allocations
    /// (fallocate, copy_file_range, an encrypted file's extension) always go as the owner.
    @inline(__always)
    private func writingAsOwner<T, E: Error>(of inode: Inode?, _ body: () throws(E) -> T) throws(E) -> T {
        guard let inode else {
            AllocationCredentials.prepareThread()
            return try body()
        }
        return try allocating(as: allocationOwner(inode), nearReserveOn: inode.device, body)
    }

    /// Runs `body`, which allocates on `device`, as `user` where that could reach the space the
    /// backing store keeps for root (`RootReserve`); elsewhere with the daemon's fsuid (changing
    /// it costs more than a small write).
    @inline(__always)
    private func allocating<T, E: Error>(as user: uid_t, nearReserveOn device: UInt64, _ body: () throws(E) -> T) throws(E) -> T {
        guard rootReserve.ownerNeeded(onDevice: device) else {
            AllocationCredentials.prepareThread()
            return try body()
        }
        return try AllocationCredentials.allocating(for: user, body)
    }

    /// Runs `body`, which allocates space for `inode`'s file, as its owner.
    @inline(__always)
    private func asOwner<T, E: Error>(of inode: Inode?, _ body: () throws(E) -> T) throws(E) -> T {
        try AllocationCredentials.allocating(for: allocationOwner(inode), body)
    }

    /// Runs `body`, which makes something new for the caller on `device` (an object's inode, a
    /// directory's entry and the blocks it may grow by, a symlink's target, an attribute, an
    /// encrypted file's header), as the caller where that could reach the space the backing
    /// store keeps for root (`RootReserve`): a local file system decides it from the caller's
    /// credentials, and without this a user could take root's reserve a directory at a time.
    @inline(__always)
    func creatingAsCaller<T, E: Error>(_ req: fuse_req_t, on device: UInt64, _ body: () throws(E) -> T) throws(E) -> T {
        try allocating(as: callerUID(req), nearReserveOn: device, body)
    }

    /// Runs `body`, which may allocate any amount of space for the caller (a file rewritten into
    /// another protection), as the caller.
    func asCaller<T, E: Error>(_ req: fuse_req_t, _ body: () throws(E) -> T) throws(E) -> T {
        try AllocationCredentials.allocating(for: callerUID(req), body)
    }

    /// The uid of the process that made the request (the daemon's when there is none).
    @inline(__always)
    private func callerUID(_ req: fuse_req_t) -> uid_t {
        fuse_req_ctx(req)?.pointee.uid ?? AllocationCredentials.daemonFSUID
    }

    func writeBuffers(_ req: fuse_req_t, _ buffers: UnsafeMutablePointer<fuse_bufvec>, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        let content: ProtectedContent
        do throws(Errno) {
            try checkGrant(file, write: true)
            // A write by a process without CAP_FSETID: through the page cache the kernel sends
            // it straight away with this flag, and direct writes always carry it.
            // A WRITE's answer carries no attributes: the kernel would show the old mode until
            // its attributes expire.
            if requestKillsSetIDBits(), try clearSetIDBits(file.backingFD), let inode = file.inode,
               let id = inodes.id(device: inode.device, number: inode.number) {
                storageEdges.invalidateAttributes(id)
            }
            guard let live = try liveContent(file) else {
                if let refused = refusedGap(file, at: offset) {
                    replyError(req, refused)
                    return
                }
                let written = writingAsOwner(of: file.inode) { custody_copy_bufvec_to_fd(buffers, file.fd, offset) }
                if written < 0 {
                    replyError(req, Int32(-written))
                    settleAfterFailedPlainWrite(file, at: offset, code: Int32(-written))
                    writeFailed(file.inode)
                } else {
                    writeBehind(file.fd, written: Int(written))
                    fuse_reply_write(req, Int(written))
                }
                return
            }
            content = live
        } catch {
            // Often a write-back from the kernel's cache: the writer sees it later, as EIO from
            // another call (utimensat, fsync, close), so the log is where the cause shows.
            log("write to \(file.inode.map { mountRelativePath(of: $0) } ?? "a file") refused: \(error)")
            replyError(req, error.rawValue)
            writeFailed(file.inode)
            return
        }
        let size = fuse_buf_size(buffers)
        if let memory = custody_bufvec_memory(buffers) {
            // libfuse read the request into its own buffer: encrypt straight from it, then zero it
            // as the pooled buffers are. Copying it into a pooled buffer first cost a copy per
            // request, and fresh pages whenever more writes were in flight than the pool keeps
            // buffers: 21,000–28,000 page faults per 512 MiB written, against about 2,400 now in a
            // fresh mount's first such write (the pools filling) and a few dozen after.
            writeEncrypted(content, UnsafeRawBufferPointer(start: memory, count: size), offset, req, file.inode)
            memory.initializeMemory(as: UInt8.self, repeating: 0, count: size)
            return
        }
        Self.plaintextBuffers.withBuffer(byteCount: size) { buffer in
            let copied = custody_copy_bufvec_to_memory(buffers, buffer.baseAddress, size)
            guard copied >= 0 else {
                replyError(req, Int32(-copied))
                return
            }
            writeEncrypted(content, UnsafeRawBufferPointer(rebasing: buffer[0..<Int(copied)]), offset, req, file.inode)
        }
    }

    private func writeEncrypted(_ content: ProtectedContent, _ data: UnsafeRawBufferPointer, _ offset: off_t, _ req: fuse_req_t, _ inode: Inode?) {
        guard !content.readOnly else {
            replyError(req, EROFS)
            return
        }
        do throws(FormatError) {
            try writingAsOwner(of: inode) { () throws(FormatError) in
                try content.file.write(data, at: UInt64(offset))
            }
            metrics?.bytesEncrypted.increment(by: Int64(data.count))
            writeBehind(content.fd, written: data.count)
            fuse_reply_write(req, data.count)
        } catch {
            log("write to an encrypted file failed: \(error)")
            noteTampering(error, of: inode, owner: content.lease.identity, content: content)
            replyError(req, error.errnoValue.rawValue)
            // The file stays a clean prefix of what was written (see ProtectedFile).
            content.file.settleAfterFailedWrite(error)
            writeFailed(inode)
        }
    }

    /// After a failed write the kernel's cache and size are ahead of the disk: drop them now,
    /// and again when the file is flushed (pages written meanwhile may have failed too).
    func writeFailed(_ inode: Inode?) {
        guard let inode, let id = inodes.id(device: inode.device, number: inode.number) else { return }
        inode.protectionState.withLock { $0.writeFailed = true }
        storageEdges.invalidate(id)
    }

    /// At flush and fsync: if a write of the file failed since the last time, drop the kernel's
    /// cache of it once more (after the reply: invalidation waits for write-back).
    func afterFlush(_ inode: Inode?) {
        guard let inode, inode.protectionState.withLock({ state in defer { state.writeFailed = false }; return state.writeFailed }),
              let id = inodes.id(device: inode.device, number: inode.number) else { return }
        storageEdges.invalidate(id)
    }

    func flush(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard servesFlush else {
            // The kernel has written the cached pages back before it asks (their errors reach
            // the caller's close without us); from now on it does not ask. The handle is taken
            // before the answer: once answered, the RELEASE may come and end it.
            let inode = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self)?.inode
            replyError(req, ENOSYS)
            afterFlush(inode)
            return
        }
        // Closing a duplicate reports deferred write errors of the backing file system (as NFS does).
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            let duplicate = try Syscall.dup(file.backingFD)
            let result = Glibc.close(duplicate)
            replyError(req, result == -1 ? errno : 0)
            afterFlush(file.inode)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func release(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        if fi.pointee.fh != 0 {
            // Without FLUSH this is the first word of the last close (after the write-back).
            if !servesFlush { afterFlush(HandleBox.borrow(fi.pointee.fh, as: OpenFile.self)?.inode) }
            releaseHandle(fi.pointee.fh)
        }
        replyError(req, 0)
    }

    func fsync(_ req: fuse_req_t, _ dataOnly: Bool, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if dataOnly { try Syscall.fdatasync(file.backingFD) } else { try Syscall.fsync(file.backingFD) }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
        afterFlush(file.inode)
    }

    func fallocate(_ req: fuse_req_t, _ mode: Int32, _ offset: off_t, _ length: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if let content = try liveContent(file) {
                // Encrypted: allocation means the size; holes cannot be punched into ciphertext.
                guard mode & ~Linux.FALLOC_FL_KEEP_SIZE == 0 else { throw Errno.notSupported }
                let end = UInt64(offset) + UInt64(length)
                try content.requireWritable()
                if mode & Linux.FALLOC_FL_KEEP_SIZE == 0, end > content.file.size {
                    try asOwner(of: file.inode) { () throws(Errno) in
                        do throws(FormatError) { try content.file.truncate(to: end) } catch { throw error.errnoValue }
                    }
                }
            } else {
                try asOwner(of: file.inode) { () throws(Errno) in try Syscall.fallocate(file.fd, mode, Int64(offset), Int64(length)) }
            }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func lseek(_ req: fuse_req_t, _ offset: off_t, _ whence: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if let content = file.content {
                // Encrypted files report all of their content as data (holes are not exposed).
                let size = Int64(content.file.size)
                guard offset >= 0, Int64(offset) < size || (whence != Linux.SEEK_DATA && whence != Linux.SEEK_HOLE) else { throw Errno(ENXIO) }
                switch whence {
                case Linux.SEEK_DATA: fuse_reply_lseek(req, offset)
                case Linux.SEEK_HOLE: fuse_reply_lseek(req, off_t(size))
                default: throw Errno.invalidArgument
                }
                return
            }
            fuse_reply_lseek(req, off_t(try Syscall.lseek(file.fd, Int64(offset), whence)))
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func copyFileRange(_ req: fuse_req_t, _ inOffset: off_t, _ inFI: UnsafeMutablePointer<fuse_file_info>, _ outOffset: off_t, _ outFI: UnsafeMutablePointer<fuse_file_info>, _ length: Int, _ flags: UInt32) {
        guard let input = HandleBox.borrow(inFI.pointee.fh, as: OpenFile.self),
              let output = HandleBox.borrow(outFI.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        // Ciphertext cannot be copied as bytes: the kernel falls back to reading and writing.
        guard input.content == nil, output.content == nil else {
            replyError(req, EOPNOTSUPP)
            return
        }
        do throws(Errno) {
            try checkGrant(input, write: false)
            try checkGrant(output, write: true)
            var from = Int64(inOffset)
            var to = Int64(outOffset)
            let copied = try asOwner(of: output.inode) { () throws(Errno) in try Syscall.copyFileRange(input.fd, &from, output.fd, &to, length, flags) }
            fuse_reply_write(req, copied)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    // MARK: Directories

    func opendir(_ req: fuse_req_t, _ id: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let fd = try withDescriptor { () throws(Errno) in try Syscall.openat(inode.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
            guard let dir = fdopendir(fd) else {
                let error = Errno.current
                Syscall.close(fd)
                throw error
            }
            fi.pointee.fh = HandleBox.store(OpenDirectory(dir: dir))
            fi.pointee.cache_readdir = 1
            if fuse_reply_open(req, fi) != 0 {
                HandleBox.release(fi.pointee.fh, as: OpenDirectory.self)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func releasedir(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        if fi.pointee.fh != 0 {
            HandleBox.release(fi.pointee.fh, as: OpenDirectory.self)
        }
        replyError(req, 0)
    }

    func fsyncdir(_ req: fuse_req_t, _ dataOnly: Bool, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let dir = HandleBox.borrow(fi.pointee.fh, as: OpenDirectory.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if dataOnly { try Syscall.fdatasync(dir.fd) } else { try Syscall.fsync(dir.fd) }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    private static let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19

    /// Lists entries from `offset`, as many as fit in `size` bytes. With `plus`, each entry
    /// (but . and ..) is looked up too, so the kernel needs no separate lookup per name.
    func readdir(_ req: fuse_req_t, _ id: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>, plus: Bool) {
        guard let directory = HandleBox.borrow(fi.pointee.fh, as: OpenDirectory.self) else {
            replyError(req, EBADF)
            return
        }
        let parent: Inode
        do { parent = try inodes.inode(UInt64(id)) } catch {
            replyError(req, error.rawValue)
            return
        }
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: max(size, 1), alignment: 8)
        defer { buffer.deallocate() }
        // The regular files listed, in order, for read-ahead across them.
        var files: [UInt64] = []
        let (used, failure) = directory.stream.withLock { stream -> (Int, Int32) in
            if stream.offset != Int64(offset) {
                seekdir(stream.dir, Int(offset))
                stream.offset = Int64(offset)
            }
            var used = 0
            while true {
                errno = 0
                guard let record = Glibc.readdir(stream.dir) else {
                    return (used, used == 0 ? errno : 0)
                }
                let name = (UnsafeRawPointer(record) + Self.nameOffset).assumingMemoryBound(to: CChar.self)
                let next = Int64(record.pointee.d_off)
                let remaining = size - used
                let needed: Int
                if plus {
                    var entry: fuse_entry_param
                    if Self.isDotOrDotDot(name) || underInodePressure {
                        // Names only (no inode for the kernel) for dot entries, and while the
                        // kernel holds too many inodes: it looks them up when it needs them.
                        entry = fuse_entry_param()
                        entry.attr.st_ino = record.pointee.d_ino
                        entry.attr.st_mode = mode_t(record.pointee.d_type) << 12
                    } else {
                        do {
                            entry = try lookupEntry(in: parent, id, name)
                        } catch {
                            // Removed since the listing was read: skip it.
                            stream.offset = next
                            continue
                        }
                    }
                    needed = fuse_add_direntry_plus(req, buffer + used, remaining, name, &entry, off_t(next))
                    if needed > remaining, entry.ino != 0 {
                        inodes.forget(UInt64(entry.ino), count: 1)
                    } else if entry.ino != 0, entry.attr.st_mode & S_IFMT == S_IFREG {
                        files.append(UInt64(entry.ino))
                    }
                } else {
                    var attributes = stat()
                    attributes.st_ino = record.pointee.d_ino
                    attributes.st_mode = mode_t(record.pointee.d_type) << 12
                    needed = fuse_add_direntry(req, buffer + used, remaining, name, &attributes, off_t(next))
                }
                if needed > remaining {
                    // Did not fit: the next call starts again with this entry.
                    seekdir(stream.dir, Int(stream.offset))
                    return (used, 0)
                }
                used += needed
                stream.offset = next
            }
        }
        if failure != 0 {
            replyError(req, failure)
        } else {
            // Recorded before the answer: once answered, the program may open the first file,
            // on another thread, and that open looks for this listing.
            if plus { directoryReadAhead.listed(files, in: UInt64(id), fromStart: offset == 0) }
            fuse_reply_buf(req, buffer.assumingMemoryBound(to: CChar.self), used)
        }
    }

    private static func isDotOrDotDot(_ name: UnsafePointer<CChar>) -> Bool {
        name[0] == 0x2E && (name[1] == 0 || (name[1] == 0x2E && name[2] == 0))
    }
}
