import CFuse3
import CLinux
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

// Full disks and freed space.
//
// - A file removed through the mount frees its space at once, as on the backing file system (the
//   work is done on a queue after the answer, and every request that takes or reports space
//   waits for it first: `settleReleases`). The
//   daemon keeps an O_PATH descriptor on every inode the kernel knows, and the kernel forgets an
//   unlinked inode only when it evicts it (which may take a while, and longer while a failed
//   write-back holds its pages). So once a regular file has no name left and no open handle, its
//   descriptor is pointed (dup2) at an empty placeholder: an anonymous memfd made once per
//   mount. The number stays valid for any request still holding the inode, and nothing can reach
//   the removed file through the mount any more.
// - A write that fails (ENOSPC, EDQUOT, EIO) leaves the kernel's page cache and size ahead of
//   what is stored. The daemon then asks the kernel to drop the file's cached pages and
//   attributes, so the next read sees what the disk holds (for encrypted files, the clean prefix
//   `ProtectedFile` keeps) and the kernel learns the size from the short read.

/// Where freed inodes point, and the kernel notifications about failed writes and changed modes.
final class StorageEdges: @unchecked Sendable {
    /// O_PATH descriptor of an empty anonymous file (a memfd: nothing on the backing store; -1
    /// if none could be made: then space comes back when the kernel forgets the inode).
    let placeholder: Int32
    private let session = Mutex<LockEnforcement.UncheckedSession?>(nil)
    /// Notifications never go out from a request handler (they may wait for requests).
    private let queue = DispatchQueue(label: "custody.storage-edges")

    init() {
        var placeholder: Int32 = -1
        let file = clinux_memfd("custody-removed-file")
        if file >= 0 {
            placeholder = (try? Syscall.openat(AT_FDCWD, Syscall.procPath(file), Linux.O_PATH | O_CLOEXEC, 0)) ?? -1
            Syscall.close(file)
        }
        self.placeholder = placeholder
    }

    deinit { if placeholder >= 0 { Syscall.close(placeholder) } }

    func attach(_ session: OpaquePointer?) { self.session.withLock { $0 = session.map(LockEnforcement.UncheckedSession.init) } }

    /// Drops the kernel's cached pages and attributes of node `id`, soon, from the queue.
    func invalidate(_ id: UInt64) {
        queue.async { [self] in
            session.withLock { session in
                guard let session else { return }
                _ = fuse_lowlevel_notify_inval_inode(session.pointer, fuse_ino_t(id), 0, 0)
            }
        }
    }

    /// Drops the kernel's cached attributes of node `id` now. Safe from a request handler: an
    /// attributes-only notification waits for nothing (no page, no inode lock).
    func invalidateAttributes(_ id: UInt64) {
        session.withLock { session in
            guard let session else { return }
            _ = fuse_lowlevel_notify_inval_inode(session.pointer, fuse_ino_t(id), -1, 0)
        }
    }

    /// Waits until queued notifications went out (before the session ends).
    func drain() { queue.sync {} }

    /// Releases handed to `releaseSoon` and not done yet.
    private let pendingReleases = Atomic<Int>(0)
    /// Where removed files' storage is let go after the UNLINK was answered.
    private let releases = DispatchQueue(label: "custody.storage-release")

    /// `releaseIfUnlinked`, on a queue of its own: freeing a removed file's blocks (ext4 does it
    /// when the daemon's last descriptor goes) then runs beside the caller's next request, on
    /// whichever CPU is free, instead of before the answer of a request ring's UNLINK (whose
    /// answer leaves only when the handler returns). `settleReleases` keeps the space promise.
    func releaseSoon(_ inode: Inode) {
        guard placeholder >= 0, inode.isRegularFile else { return }
        pendingReleases.add(1, ordering: .acquiringAndReleasing)
        releases.async { [self] in
            releaseIfUnlinked(inode)
            pendingReleases.subtract(1, ordering: .acquiringAndReleasing)
        }
    }

    /// Waits for the releases handed over so far: called before every request that takes space
    /// or reports it (writes, creations, statfs …), so a file removed through the mount has given
    /// its space back by then, as on the backing file system. One atomic load when none wait.
    func settleReleases() {
        guard pendingReleases.load(ordering: .acquiring) > 0 else { return }
        releases.sync {}
    }

    /// By `FileOperation.rawValue`: whether a request may need space on the backing store, or
    /// reports it, and so calls `settleReleases` first (in `MountFileSystem.serve`).
    static let waitsForReleases: [Bool] = FileOperation.allCases.map { operation in
        switch operation {
        // Not SETATTR: `rm -rf` sends one after every UNLINK (the change time), and a truncation
        // needs no new blocks.
        case .statfs, .mkdir, .mknod, .symlink, .link, .rename, .create, .write, .fallocate, .copyFileRange, .setxattr:
            return true
        default:
            return false
        }
    }

    /// Lets the storage of a regular file go once it has no name and no open handle.
    func releaseIfUnlinked(_ inode: Inode) {
        guard placeholder >= 0, inode.isRegularFile else { return }
        let held = inode.protectionState.withLock { state -> Int32 in
            guard state.openHandles == 0, state.content == nil, !state.storageReleased else {
                if !state.storageReleased { state.releaseWhenClosed = true }
                return -1
            }
            guard let attributes = try? Syscall.fstat(inode.fd), attributes.st_nlink == 0 else { return -1 }
            // The descriptor number stays (requests may hold it); what it refers to changes at once.
            // The file itself stays open on `held` until the lock is released: closing its last
            // descriptor frees its blocks, which takes a while for a large file, and the kernel's
            // SETATTR that follows an UNLINK waits on this lock.
            let held = fcntl(inode.fd, F_DUPFD_CLOEXEC, 0)
            if dup2(placeholder, inode.fd) >= 0 {
                _ = fcntl(inode.fd, F_SETFD, FD_CLOEXEC)
                state.storageReleased = true
            }
            return held
        }
        if held >= 0 { close(held) }
    }
}
