import CFuse3
import CustodyCore
import CustodyFormat
import Dispatch
import Synchronization

/// Keeps the kernel's caches in step with the engine's locks: when an identity's lock is
/// requested, its class A files are flushed (dirty pages are written while the keys still exist,
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
    private var subscription: Int?
    private weak var engine: Engine?

    struct UncheckedSession: @unchecked Sendable { let pointer: OpaquePointer }

    init(filesystem: MountFileSystem, session: OpaquePointer, engine: Engine) {
        self.filesystem = filesystem
        self.session = UncheckedSession(pointer: session)
        self.engine = engine
        subscription = engine.events.subscribe { [weak self] event in
            guard let self, let identity = event.identity else { return }
            switch event.kind {
            case .lockRequested, .locked, .wipeStarted, .policyChanged:
                self.queue.async { self.invalidate(identity: identity, kind: event.kind) }
            default:
                break
            }
        }
    }

    /// Returns once every invalidation queued so far has been sent to the kernel.
    func settle() { queue.sync {} }

    func stop() {
        if let subscription { engine?.events.unsubscribe(subscription) }
        subscription = nil
        queue.sync {}
    }

    /// Flushes or invalidates the cached data of `identity`'s class A files; on a wipe, and when
    /// its policy changed (mappings made across identities then fault again and ask the
    /// daemon), of all its files.
    private func invalidate(identity: String, kind: EngineEvent.Kind) {
        let wanted = Account.canonical(identity)
        let aliases = Set([wanted] + ((try? engine?.account(identity)).flatMap { $0.map { [Account.canonical($0.id), Account.canonical($0.upn)] } } ?? []))
        for (id, inode) in filesystem.inodes.snapshot() where inode.isRegularFile {
            let protection = filesystem.protection(of: inode)
            guard let owner = protection.owner, aliases.contains(owner.canonical) else { continue }
            if kind != .wipeStarted, kind != .policyChanged {
                guard case .encrypted(_, let protectionClass) = protection, protectionClass == .complete else { continue }
            }
            // Offset 0, length 0: every cached page (dirty ones are written back first) and the attributes.
            _ = fuse_lowlevel_notify_inval_inode(session.pointer, fuse_ino_t(id), 0, 0)
        }
    }
}
