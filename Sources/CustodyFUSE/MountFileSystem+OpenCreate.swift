import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Opening and creating files (OPEN, CREATE), how the backing file is opened and cached, the
/// set-ID bits a write must clear, and the end of a handle.
extension MountFileSystem {
    /// The flags to open the backing file with.
    func backingFlags(_ requested: Int32) -> Int32 {
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
    func setCaching(_ fi: UnsafeMutablePointer<fuse_file_info>) {
        // O_DIRECT goes straight to the daemon, encrypted or not (otherwise the kernel takes its
        // page-cache path for each request: an asynchronous-I/O wait per read).
        if fi.pointee.flags & Linux.O_DIRECT != 0 { fi.pointee.direct_io = 1 }
        // Where this daemon is the only writer of the backing tree, cached pages stay valid; on a
        // shared store each open starts from what the store holds.
        fi.pointee.keep_cache = options.sharedStore ? 0 : 1
    }

    /// Whether the request being served asks for the set-ID bits to go (see `clearSetIDBits`).
    func requestKillsSetIDBits() -> Bool {
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
            readProtectionAgainOnSharedStore(inode)
            var current = inode.isRegularFile ? protection(of: inode) : .untracked
            var fresh: ProtectedContent?
            // Truncating re-owns the file to the caller below: none of the old owner's data is
            // left to move. Any other open is a transfer when the identities differ.
            let grant = engine != nil && fi.pointee.flags & O_TRUNC != 0 ? nil : try checkTransfer(req, inode, flags: fi.pointee.flags)
            try checkHolding(req, inode, flags: fi.pointee.flags)
            if inode.isRegularFile, engine != nil {
                let owner = fi.pointee.flags & O_TRUNC != 0 ? callerIdentity(req).identity : current.owner?.display
                try checkReceiving(req, owner: owner, flags: fi.pointee.flags)
            }
            if inode.isRegularFile, engine != nil, fi.pointee.flags & O_TRUNC != 0 {
                // Opened with truncate: the file gets the caller's effective identity as owner.
                let (wanted, classKey) = try plan(for: callerIdentity(req).identity)
                if wanted != current {
                    let busy = inode.protectionState.withLock { $0.content != nil }
                    if busy { throw Errno.resourceBusy }
                    let fd = try withDescriptor { () throws(Errno) in try Syscall.open(inode.procPath, O_RDWR | O_CLOEXEC) }
                    defer { Syscall.close(fd) }
                    fresh = try applyProtection(wanted, classKey: classKey, fd: fd, inode: inode)
                    if let fresh { inode.protectionState.withLock { $0.content = fresh } }
                    // Its name follows its new owner.
                    if wanted.owner != current.owner, let known = inodes.name(of: UInt64(id)), let directory = try? inodes.inode(known.parent) {
                        renameForOwner(known.storedName, in: directory, owner: wanted.owner?.display)
                    }
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
                    try asErrno({ () throws(FormatError) in try content.file.truncate(to: 0) }, failed: { _ in releaseContent(content, of: inode) })
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
            var resolved = ResolvedName.plain(FileName(cString: name))
            // An entry of that name stored in another form (put in the backing directory while the
            // kernel held the name as missing) is opened by its name, then renamed into its form.
            var renamedInto: ResolvedName?
            if let engine {
                try requirePolicy()
                let caller = callerIdentity(req)
                let owner = engine.ownerForNewFile(caller, directoryOwner: directoryOwner(parent))
                try checkCreateTransfer(req, caller: caller, newOwner: owner, in: parent)
                try checkReceiving(req, owner: owner, flags: fi.pointee.flags | O_CREAT)
                // The engine is asked about the owner once, for the file and for its name.
                var key: NameKey?
                if let owner {
                    let described = engine.newFileOwner(owner)
                    (wanted, classKey) = try plan(for: described)
                    key = try nameKey(for: described)
                }
                let (wanted, other) = try newEntryName(name, in: parent, key: key, keepingOtherForm: fi.pointee.flags & O_EXCL == 0)
                resolved = other ?? wanted
                if other != nil { renamedInto = wanted }
            }
            let stored = resolved.stored.cString
            storing(resolved, in: parent)
            if let renamedInto { storing(renamedInto, in: parent) }
            var flags = backingFlags(fi.pointee.flags) | O_CREAT | (fi.pointee.flags & O_EXCL)
            if wanted.isEncrypted { flags = (flags & ~(O_ACCMODE | O_APPEND)) | O_RDWR }
            // A tracked file starts empty: O_TRUNC empties one that appeared in the backing
            // directory meanwhile (and does nothing to a file this open creates).
            if wanted != .untracked { flags |= O_TRUNC }
            // The inode, and an encrypted file's header and owner record, are made as the caller.
            let (fd, content) = try creatingAsCaller(req, on: parent.device) { () throws(Errno) -> (Int32, ProtectedContent?) in
                let fd = try withDescriptor { () throws(Errno) in
                    try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.openat(parent.fd, stored, flags | O_NOFOLLOW, mode) }
                }
                do throws(Errno) {
                    try storeLongForm(of: resolved, in: parent)
                    try giveToCaller(req, parent: parent, name: nil, fd: fd, mode: mode)
                    guard wanted != .untracked else { return (fd, nil) }
                    return (fd, try applyProtection(wanted, classKey: classKey, fd: fd, inode: nil, isNew: true))
                } catch {
                    Syscall.close(fd)
                    _ = unlinkat(parent.fd, stored, 0)
                    throw error
                }
            }
            if let renamedInto {
                do throws(Errno) {
                    try moveIntoForm(resolved.stored, in: parent, renamedInto)
                    resolved = renamedInto
                } catch {
                    log("a file created over an entry of the same name keeps that entry's stored name: \(error)")
                }
            }
            let handle: OpenFile
            let (pathFD, stated) = try pathDescriptor(of: fd, named: resolved.stored.cString, in: parent)
            var entry = try rememberEntry(pathFD: pathFD, name: resolved.entryName(in: UInt64(parentID)),
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
    func releaseHandle(_ fh: UInt64) {
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
}
