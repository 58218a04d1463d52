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
    func knownObject(in parent: Inode, _ name: UnsafePointer<CChar>) -> (id: UInt64, inode: Inode, links: UInt64)? {
        guard let attributes = try? Syscall.fstatat(parent.fd, name, AT_SYMLINK_NOFOLLOW),
              let id = inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)),
              let inode = try? inodes.inode(id) else { return nil }
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
}
