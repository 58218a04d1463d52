import CLinux
import Glibc

/// Allocating disk space as a file's owner rather than as the daemon. A local file system decides
/// from the writer's credentials whether a write may take the blocks it keeps for root (ext4's
/// reserved blocks, for root and its `resuid` user) and whether a quota's hard limit holds
/// (`CAP_SYS_RESOURCE` overrides both). The daemon writes for every user, as root: without this,
/// any user of a multi-user mount could fill the disk to its last block.
///
/// A thread that allocates first gives up `CAP_SYS_RESOURCE` from its effective set (once; the
/// daemon's other threads keep theirs), and takes the owner's file-system uid around the
/// allocation. That change of fsuid clears capabilities such as `CAP_FSETID` from the effective
/// set; they are put back at once, so that set-ID bits go only where the daemon clears them.
public enum AllocationCredentials {
    static let resourceCapability: Int32 = 24 // CAP_SYS_RESOURCE
    /// The daemon's own file-system uid: allocations for its files need no change.
    public static let daemonFSUID = geteuid()

    final class ThreadState {
        var prepared = false
    }

    static let threads = PerThread { ThreadState() }

    /// Drops `CAP_SYS_RESOURCE` from the calling thread's effective set, on its first call.
    @inline(__always)
    public static func prepareThread() {
        let thread = threads.value
        guard !thread.prepared else { return }
        thread.prepared = true
        _ = clinux_thread_drop_capability(resourceCapability)
    }

    /// Runs `body`, which allocates space for a file that `owner` owns, with the owner's fsuid.
    @inline(__always)
    public static func allocating<T, E: Error>(for owner: uid_t, _ body: () throws(E) -> T) throws(E) -> T {
        prepareThread()
        guard owner != daemonFSUID else { return try body() }
        let previous = clinux_thread_set_fsuid_keeping_capabilities(owner)
        defer { _ = clinux_setfsuid(uid_t(truncatingIfNeeded: previous)) }
        return try body()
    }
}
