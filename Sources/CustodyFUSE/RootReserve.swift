import CustodySystem
import Glibc
import Synchronization

/// Whether a write could reach the blocks the backing file system keeps for root (ext4's
/// reserved blocks). Only then is space allocated as the file's owner (`AllocationCredentials`):
/// changing a thread's credentials costs about 8 µs a write here, three commits of new
/// credentials. The backing root's free space is read at most once a millisecond; while users
/// still have more than `margin` free, no write of up to 1 MiB from this mount's CPUs can reach
/// the reserve before the next reading. Files on another file system below the backing directory
/// are always written as their owner.
final class RootReserve: @unchecked Sendable {
    static let margin: UInt64 = 64 << 20
    static let interval: Int64 = 1_000_000

    private let fd: Int32
    private let device: UInt64
    private let readAt = Atomic<Int64>(0)
    private let roomy = Atomic<Bool>(false)

    /// `fd` (the backing root's descriptor) stays open for the mount's life.
    init(fd: Int32, device: UInt64) {
        self.fd = fd
        self.device = device
    }

    /// Whether a write to a file on `device` must be made as the file's owner.
    @inline(__always)
    func ownerNeeded(onDevice device: UInt64) -> Bool {
        guard device == self.device else { return true }
        let now = monotonicNanoseconds()
        if now &- readAt.load(ordering: .relaxed) > Self.interval { read(at: now) }
        return !roomy.load(ordering: .relaxed)
    }

    private func read(at now: Int64) {
        readAt.store(now, ordering: .relaxed)
        guard let info = try? Syscall.fstatvfs(fd) else {
            roomy.store(false, ordering: .relaxed)
            return
        }
        let fragment = UInt64(info.f_frsize)
        let forUsers = UInt64(info.f_bavail) &* fragment
        // No reserve (f_bfree equal to f_bavail: XFS, tmpfs, ext4 made with -m 0), or plenty left.
        roomy.store(info.f_bfree == info.f_bavail || forUsers > Self.margin, ordering: .relaxed)
    }
}
