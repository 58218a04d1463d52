import CFuse3
import CustodyCore
import CustodyFormat
import Dispatch
import Synchronization

/// Keeps the kernel's caches in step with the engine's locks (`MountVolume` passes on the
/// engine's calls): when an identity's lock is requested, its class A files are flushed (dirty pages are written while the keys still exist,
/// during the grace period); when the lock completes, their cached pages and attributes are
/// invalidated, so no plaintext is served from the page cache and every later read reaches the
/// daemon, which refuses it.
///
/// Notifications go out from a queue of their own, never from a request handler: libfuse warns
/// that notifying from inside a request can deadlock.
final class LockEnforcement: @unchecked Sendable {
    private let filesystem: MountFileSystem
    private let session: UncheckedSession
    private let queue = DispatchQueue(label: "custody.lock-enforcement")

    struct UncheckedSession: @unchecked Sendable { let pointer: OpaquePointer }

    init(filesystem: MountFileSystem, session: OpaquePointer) {
        self.filesystem = filesystem
        self.session = UncheckedSession(pointer: session)
    }

    /// Flushes the dirty pages of `account`'s class A files (a lock was requested) or drops
    /// their cached pages (the lock completed).
    func classAFiles(of account: Account) { queue.async { self.invalidate(account, onlyClassA: true) } }

    /// Drops the cached pages of all `account`'s files: on a wipe, and when its policy changed
    /// (mappings made across identities then fault again and ask the daemon).
    func allFiles(of account: Account) { queue.async { self.invalidate(account, onlyClassA: false) } }

    /// Returns once every invalidation queued so far has been sent to the kernel (before a
    /// suspend, and before the session ends).
    func settle() { queue.sync {} }

    private func invalidate(_ account: Account, onlyClassA: Bool) {
        let aliases = Set(account.keys.map(\.folded))
        for (id, inode) in filesystem.inodes.snapshot() where inode.isRegularFile {
            let protection = filesystem.protection(of: inode)
            guard let owner = protection.owner, aliases.contains(owner.canonical) else { continue }
            if onlyClassA {
                guard case .encrypted(_, let protectionClass) = protection, protectionClass == .complete else { continue }
            }
            // Offset 0, length 0: every cached page (dirty ones are written back first) and the attributes.
            _ = fuse_lowlevel_notify_inval_inode(session.pointer, fuse_ino_t(id), 0, 0)
        }
    }
}
