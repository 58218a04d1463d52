import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Creating and removing names: MKDIR, MKNOD, SYMLINK, LINK, UNLINK, RMDIR, RENAME, each made
/// with the caller's ownership and creation mask.
extension MountFileSystem {
    /// Gives a new object the caller's uid and gid, as the kernel would have. The daemon creates it
    /// with its own credentials; the kernel has already checked the caller's permission to create.
    func giveToCaller(_ req: fuse_req_t, parent: Inode, name: UnsafePointer<CChar>?, fd: Int32?, mode: mode_t) throws(Errno) {
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
    func withCallerMask<T>(_ req: fuse_req_t, _ mode: mode_t, _ body: (mode_t) throws(Errno) -> T) throws(Errno) -> T {
        guard options.kernelChecksPermissions, let mask = fuse_req_ctx(req)?.pointee.umask else { return try body(mode) }
        return try CreationMask.creating(mode: mode, mask: mask, body)
    }

    /// The owner a new entry in `parent` has, for its name: the caller's identity, else the
    /// directory's owner (as for files).
    func newEntryOwner(_ req: fuse_req_t, in parent: Inode) -> String? {
        guard let engine else { return nil }
        return engine.ownerForNewFile(callerIdentity(req), directoryOwner: directoryOwner(parent))
    }

    /// The stored name of a new entry the caller makes called `name` in `parent`.
    func newEntryName(_ req: fuse_req_t, _ name: UnsafePointer<CChar>, in parent: Inode) throws(Errno) -> ResolvedName {
        try requirePolicy()
        return try newEntryName(name, in: parent, key: try nameKey(forNewEntryOf: newEntryOwner(req, in: parent)))
    }

    /// A mount with `policyRequired` creates nothing until its policy exists (`Engine.mayCreate`).
    func requirePolicy() throws(Errno) {
        guard options.policyRequired, let engine else { return }
        guard engine.mayCreate(policyRequiredIn: mountPointPath) else { throw Errno.accessDenied }
    }

    /// Makes an entry with `make` (given its stored name), as the caller, with its long form kept
    /// and the caller as its owner, and answers with it.
    private func makeEntry(_ req: fuse_req_t, _ parent: Inode, _ parentID: fuse_ino_t, _ resolved: ResolvedName, mode: mode_t,
                           _ make: (UnsafePointer<CChar>) throws(Errno) -> Void) throws(Errno) {
        let made = mode & S_IFMT == S_IFDIR ? madeDirectoryNames() : nil
        storing(resolved, in: parent)
        try creatingAsCaller(req, on: parent.device) { () throws(Errno) in try make(resolved.stored.cString) }
        var tweak: [UInt8]?
        do throws(Errno) {
            try storeLongForm(of: resolved, in: parent)
            try giveToCaller(req, parent: parent, name: resolved.stored.cString, fd: nil, mode: mode)
            // A managed identity's directory will hold its names: its tweak is made with it, by
            // the descriptor at hand, rather than at its first entry, by path.
            if resolved.isEncrypted, mode & S_IFMT == S_IFDIR { tweak = try makeTweak(ofNew: resolved.stored, in: parent) }
        } catch {
            _ = unlinkat(parent.fd, resolved.stored.cString, mode & S_IFMT == S_IFDIR ? AT_REMOVEDIR : 0)
            throw error
        }
        var entry = try lookupEntry(in: parent, parentID, resolved, made: made)
        if let tweak, let made = try? inodes.inode(UInt64(entry.ino)) { made.tweak.withLock { $0 = .known(tweak) } }
        fuse_reply_entry(req, &entry)
    }

    func mkdir(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ mode: mode_t) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let resolved = try newEntryName(req, name, in: parent)
            try makeEntry(req, parent, parentID, resolved, mode: mode | S_IFDIR) { (stored) throws(Errno) in
                try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.mkdirat(parent.fd, stored, mode) }
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func mknod(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ mode: mode_t, _ device: dev_t) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let resolved = try newEntryName(req, name, in: parent)
            try makeEntry(req, parent, parentID, resolved, mode: mode) { (stored) throws(Errno) in
                try withCallerMask(req, mode) { (mode) throws(Errno) in try Syscall.mknodat(parent.fd, stored, mode, device) }
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func symlink(_ req: fuse_req_t, _ target: UnsafePointer<CChar>, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let resolved = try newEntryName(req, name, in: parent)
            let storedTarget = try storedTarget(target, key: resolved.key)
            try makeEntry(req, parent, parentID, resolved, mode: S_IFLNK) { (stored) throws(Errno) in
                try Syscall.symlinkat(storedTarget, parent.fd, stored)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    /// The key the names of the object `id` are encrypted with (its link keeps it): that of the
    /// name it was looked up by. EACCES when that key is not held.
    func nameKey(ofObject id: UInt64) throws(Errno) -> NameKey? {
        guard engine != nil, let stored = inodes.name(of: id)?.stored?.text,
              let tag = NameCipher.keyTag(of: stored) else { return nil }
        guard let key = heldNameKeys().byTag[tag] else { throw Errno.accessDenied }
        return key
    }

    func link(_ req: fuse_req_t, _ id: fuse_ino_t, _ newParentID: fuse_ino_t, _ newName: UnsafePointer<CChar>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let newParent = try inodes.inode(UInt64(newParentID))
            let resolved = try newEntryName(newName, in: newParent, key: try nameKey(ofObject: UInt64(id)))
            storing(resolved, in: newParent)
            try creatingAsCaller(req, on: newParent.device) { () throws(Errno) in
                try Syscall.linkat(AT_FDCWD, inode.procPath, newParent.fd, resolved.stored.cString, AT_SYMLINK_FOLLOW)
            }
            var entry = try lookupEntry(in: newParent, newParentID, resolved)
            fuse_reply_entry(req, &entry)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func unlink(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let (resolved, attributes) = try existingEntry(name, in: parent, parentID: UInt64(parentID))
            let victim = knownObject(attributes)
            try Syscall.unlinkat(parent.fd, resolved.stored.cString, 0)
            removed(victim)
            nameRemoved(resolved, from: parent)
            replyError(req, 0)
            if let victim, victim.inode.isRegularFile { storageEdges.releaseSoon(victim.inode) }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    /// The node the kernel knows for the object with `attributes`, if any, and its link count,
    /// looked at before it is removed or replaced.
    func knownObject(_ attributes: stat?) -> (id: UInt64, inode: Inode, links: UInt64)? {
        guard let attributes, let (id, inode) = inodes.known(attributes) else { return nil }
        return (id, inode, UInt64(attributes.st_nlink))
    }

    /// After a name went: an object that had no other name is detached from its inode number
    /// before the answer, so a file that gets the number next is a new node (`InodeTable`).
    func removed(_ victim: (id: UInt64, inode: Inode, links: UInt64)?) {
        guard let victim, victim.inode.isDirectory || victim.links <= 1 else { return }
        inodes.detach(victim.id)
    }

    func rmdir(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let parent = try inodes.inode(UInt64(parentID))
            let (resolved, attributes) = try existingEntry(name, in: parent, parentID: UInt64(parentID))
            let victim = knownObject(attributes)
            try Syscall.unlinkat(parent.fd, resolved.stored.cString, AT_REMOVEDIR)
            removed(victim)
            nameRemoved(resolved, from: parent)
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    /// RENAME, with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`. A moved entry keeps the key of its
    /// name (re-encrypted for the new directory and name); a plain one stays plain. When the
    /// target exists in another form than the one the moved entry gets (a plain file replaced by
    /// an identity's), the entry is renamed into its form first and the other form removed after,
    /// so that the name never stops existing; an exchange swaps the entries, then gives each the
    /// form of its key.
    func rename(_ req: fuse_req_t, _ parentID: fuse_ino_t, _ name: UnsafePointer<CChar>, _ newParentID: fuse_ino_t, _ newName: UnsafePointer<CChar>, _ flags: UInt32) {
        do throws(Errno) {
            guard flags & Linux.RENAME_WHITEOUT == 0 else { throw Errno.invalidArgument }
            let parent = try inodes.inode(UInt64(parentID))
            let newParent = try inodes.inode(UInt64(newParentID))
            let (source, sourceAttributes) = try existingEntry(name, in: parent, parentID: UInt64(parentID))
            // A no-key name cannot be encrypted again for another place.
            if engine != nil, Self.isReservedName(name), source.key == nil { throw Errno.accessDenied }
            let existing = try? existingEntry(newName, in: newParent, parentID: UInt64(newParentID))
            if let existing, existing.1.st_dev == sourceAttributes.st_dev, existing.1.st_ino == sourceAttributes.st_ino {
                // Two names of one object: rename does nothing.
                replyError(req, 0)
                return
            }
            if flags & Linux.RENAME_NOREPLACE != 0, existing != nil { throw Errno.exists }
            if flags & Linux.RENAME_EXCHANGE != 0, engine != nil, Self.isReservedName(newName) { throw Errno.accessDenied }
            let target = try storedForm(of: newName, in: newParent, key: source.key)
            if flags & Linux.RENAME_EXCHANGE != 0 {
                guard let (other, _) = existing else { throw Errno.noSuchFile }
                // Each name may hold the other's form for a moment; their forms change after.
                storing(ResolvedName(shown: other.shown, stored: other.stored, longForm: nil, key: source.key), in: newParent)
                storing(ResolvedName(shown: source.shown, stored: source.stored, longForm: nil, key: other.key), in: parent)
                try creatingAsCaller(req, on: newParent.device) { () throws(Errno) in
                    try Syscall.renameat2(parent.fd, source.stored.cString, newParent.fd, other.stored.cString, flags)
                    // Each entry now holds the other's object: give each the form of its object's key.
                    try moveIntoForm(other.stored, in: newParent, target)
                    try moveIntoForm(source.stored, in: parent, try storedForm(of: name, in: parent, key: other.key))
                }
                replyError(req, 0)
                return
            }
            var replaced = knownObject(existing?.1)
            var otherForm: (ResolvedName, stat)?
            if let existing, existing.0.stored != target.stored {
                otherForm = existing
                let sourceIsDirectory = sourceAttributes.st_mode & S_IFMT == S_IFDIR
                let targetIsDirectory = existing.1.st_mode & S_IFMT == S_IFDIR
                if sourceIsDirectory, !targetIsDirectory { throw Errno.notDirectory }
                if !sourceIsDirectory, targetIsDirectory { throw Errno.isDirectory }
                if targetIsDirectory {
                    // An empty directory in the way goes first (rename would replace it only if empty).
                    try Syscall.unlinkat(newParent.fd, existing.0.stored.cString, AT_REMOVEDIR)
                    removed(replaced)
                    (replaced, otherForm) = (nil, nil)
                }
            }
            storing(target, in: newParent)
            try creatingAsCaller(req, on: newParent.device) { () throws(Errno) in
                try Syscall.renameat2(parent.fd, source.stored.cString, newParent.fd, target.stored.cString, flags)
            }
            nameRemoved(source, from: parent)
            try? storeLongForm(of: target, in: newParent)
            if let (other, _) = otherForm { try Syscall.unlinkat(newParent.fd, other.stored.cString, 0) }
            removed(replaced)
            replyError(req, 0)
            if let replaced, replaced.inode.isRegularFile { storageEdges.releaseIfUnlinked(replaced.inode) }
        } catch {
            replyError(req, error.rawValue)
        }
    }
}
