import CFuse3
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Keeps the number of inodes the kernel holds (one `O_PATH` descriptor each) well under the
/// descriptor limit. Above the high-water mark it asks the kernel to drop the least recently used
/// names (`notify_inval_entry`); the kernel then forgets the inodes nobody uses, and their
/// descriptors close. Without this, a tree with more files than the limit would end in EMFILE.
///
/// It runs on a thread of its own (a notification from inside a request handler can deadlock).
/// The same thread gives the heap's free memory back to the kernel when a burst of requests ends
/// (`Syscall.releaseFreeMemory`, and the request rings' added entries), so that buffers freed
/// during a burst do not stay resident.
final class InodePruner: @unchecked Sendable {
    private let filesystem: MountFileSystem
    private let session: OpaquePointer
    private let stopping = Atomic<Bool>(false)
    private var thread: pthread_t?

    init(filesystem: MountFileSystem, session: OpaquePointer) {
        self.filesystem = filesystem
        self.session = session
    }

    static func descriptorLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        return Int(min(limit.rlim_cur, rlim_t(Int32.max)))
    }

    func start() {
        thread = try? DaemonThread.start("custody-prune") { [self] in run() }
    }

    func stop() {
        stopping.store(true, ordering: .releasing)
        filesystem.pruneSignal.signal()
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    private func run() {
        var lastCount: UInt64 = 0, trimmedAt: UInt64 = 0
        while !stopping.load(ordering: .acquiring) {
            // Woken by a request that saw the pressure, or every 100 ms.
            _ = filesystem.pruneSignal.wait(timeout: .now() + .milliseconds(100))
            filesystem.inodes.advanceEpoch()
            pruneIfNeeded()
            // A burst of requests is over (none for a tick): give the freed buffers back once.
            let count = filesystem.requestCount.load(ordering: .relaxed)
            if count == lastCount, count != trimmedAt {
                Syscall.releaseFreeMemory()
                filesystem.requestRings?.releaseMemory()
                trimmedAt = count
            }
            lastCount = count
        }
    }

    /// One round: when above the high-water mark, drop the oldest names down to the low one.
    func pruneIfNeeded() {
        let count = filesystem.inodes.count
        guard count > filesystem.inodeHighWater else { return }
        for entry in filesystem.inodes.leastRecentlyUsed(count - filesystem.inodeLowWater) {
            if stopping.load(ordering: .acquiring) { return }
            _ = fuse_lowlevel_notify_inval_entry(session, fuse_ino_t(entry.parent), entry.name.cString, entry.name.count)
        }
    }
}
