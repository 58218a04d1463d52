import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Whose file system uid pays for space: a write as the file's owner near the store's reserve
/// for root, what a request creates as its caller (see `RootReserve`, `AllocationCredentials`).
extension MountFileSystem {
    /// Whom space for an inode's file is allocated as: its owner (`AllocationCredentials`).
    @inline(__always)
    func allocationOwner(_ inode: Inode?) -> uid_t {
        inode.map { uid_t($0.ownerUID.load(ordering: .relaxed)) } ?? AllocationCredentials.daemonFSUID
    }

    /// Runs `body`, a write of up to 1 MiB to `inode`'s file, as its owner where it could reach
    /// the space the backing store keeps for root (`RootReserve`). Larger allocations
    /// (fallocate, copy_file_range, an encrypted file's extension) always go as the owner.
    @inline(__always)
    func writingAsOwner<T, E: Error>(of inode: Inode?, _ body: () throws(E) -> T) throws(E) -> T {
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
    func allocating<T, E: Error>(as user: uid_t, nearReserveOn device: UInt64, _ body: () throws(E) -> T) throws(E) -> T {
        guard rootReserve.ownerNeeded(onDevice: device) else {
            AllocationCredentials.prepareThread()
            return try body()
        }
        return try AllocationCredentials.allocating(for: user, body)
    }

    /// Runs `body`, which allocates space for `inode`'s file, as its owner.
    @inline(__always)
    func asOwner<T, E: Error>(of inode: Inode?, _ body: () throws(E) -> T) throws(E) -> T {
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
    func callerUID(_ req: fuse_req_t) -> uid_t {
        fuse_req_ctx(req)?.pointee.uid ?? AllocationCredentials.daemonFSUID
    }
}
