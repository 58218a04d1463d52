import CLinux
import Glibc

/// Creating a file with another process's file-creation mask (umask), as a local file system
/// applies it: the backing file system ignores the mask where the new object's directory has a
/// default POSIX ACL, and applies it otherwise. A umask belongs to the process's file-system
/// context, which its threads share; a thread that creates files for a caller first gets a
/// context of its own (`unshare(CLONE_FS)`), sets the caller's mask around the creation and puts
/// its own back after, so that the daemon's other creations (which give exact modes) keep theirs.
public enum CreationMask {
    final class ThreadContext {
        /// Whether this thread has a file-system context of its own; nil until first asked.
        var own: Bool?
    }

    static let contexts = PerThread { ThreadContext() }

    /// Calls `body` with the mode to create with, while the calling thread's umask is `mask`. On a
    /// thread that cannot have a context of its own, `body` gets `mode` with `mask` applied
    /// (a directory's default ACL then cannot widen it).
    @inline(__always)
    public static func creating<T, E: Error>(mode: mode_t, mask: mode_t, _ body: (mode_t) throws(E) -> T) throws(E) -> T {
        let mask = mask & 0o777
        guard mask != 0, threadHasOwnContext() else { return try body(mode & ~mask) }
        let previous = umask(mask)
        defer { umask(previous) }
        return try body(mode)
    }

    /// Whether the calling thread has its own file-system context (made on first call).
    static func threadHasOwnContext() -> Bool {
        let context = contexts.value
        if let own = context.own { return own }
        let own = clinux_unshare_fs() == 0
        context.own = own
        return own
    }
}
