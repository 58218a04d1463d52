import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Looking names up, attributes, access checks, links' targets and the file system's figures
/// (LOOKUP, FORGET, GETATTR, SETATTR, ACCESS, READLINK, STATFS).
extension MountFileSystem {
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
                        try asErrno { () throws(FormatError) in try content.file.truncate(to: size) }
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
            let target = try shownTarget(try Syscall.readlinkat(try inodes.inode(UInt64(id)).fd, ""))
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
}
