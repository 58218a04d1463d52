import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import Dispatch
import Glibc

/// Re-protects an identity's existing files after its policy changes, in the background:
/// encryption turned on (plain → encrypted), off (encrypted → plain), or another protection level
/// (the file key is rewrapped in the header, in place; the content is not re-encrypted). Files that
/// are open are left for later and retried once closed, so a write racing with re-protection is
/// never lost; every rewrite is crash-safe (see `reprotect`).
final class PolicyReprotection: @unchecked Sendable {
    private let filesystem: MountFileSystem
    private weak var engine: Engine?
    /// Shared with the mount's `FormatUpgrade` (which renames what this walks by name): the two
    /// take turns, in the order they were asked for.
    private let queue: DispatchQueue
    static let retryInterval: useconds_t = 200_000
    static let retryLimit = 3000

    init(filesystem: MountFileSystem, engine: Engine, queue: DispatchQueue) {
        self.filesystem = filesystem
        self.engine = engine
        self.queue = queue
    }

    /// Queues the re-protection of `account`'s files (its policy changed); the policy in force
    /// when it runs is the one applied.
    func start(for account: Account) {
        queue.async { self.run(account.id) }
    }


    private func run(_ identity: String) {
        guard let engine, let account = try? engine.account(identity) else { return }
        var pending = files(of: account)
        var total = pending.count
        var done = 0
        var reported = monotonicSeconds()
        // A file renamed since the walk is not found by its old names: the tree is walked again
        // (a few times at most) for what is left, so that a rename does not leave a file behind.
        var walks = 1
        for _ in 0..<Self.retryLimit where !pending.isEmpty {
            var busy: [[FileName]] = []
            var moved = false
            for path in pending {
                switch reprotect(path, account: account) {
                case .done: done += 1
                case .busy: busy.append(path)
                case .moved: moved = true
                case .failed: continue
                }
                // Progress about five times a second on big trees.
                if monotonicSeconds() - reported > 0.2 {
                    reported = monotonicSeconds()
                    engine.events.emit(.reprotectProgress, identity: account.upn, "re-protecting \(account.upn)'s files",
                                       details: ["done": "\(done)", "total": "\(total)", "waiting": "\(busy.count)"])
                }
            }
            engine.events.emit(.reprotectProgress, identity: account.upn, "re-protecting \(account.upn)'s files",
                               details: ["done": "\(done)", "total": "\(total)", "waiting": "\(busy.count)"])
            pending = busy
            if moved, walks < 3 {
                walks += 1
                let again = files(of: account).filter { path in !busy.contains(path) }
                total += again.count
                pending += again
            }
            if !busy.isEmpty { usleep(Self.retryInterval) }
        }
        if pending.isEmpty { try? engine.reprotectFinished(account.id) }
        engine.events.emit(.reprotectFinished, identity: account.upn,
                           pending.isEmpty ? "re-protected \(account.upn)'s files" : "re-protection of \(account.upn) left \(pending.count) open files",
                           details: ["done": "\(done)", "total": "\(total)", "left": "\(pending.count)"])
    }

    enum Outcome { case done, busy, moved, failed }

    /// The regular files `account` owns, each as the names leading to it from the root (bytes:
    /// a name need not be UTF-8).
    private func files(of account: Account) -> [[FileName]] {
        guard let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return [] }
        var found: [[FileName]] = []
        func walk(_ fd: Int32, _ prefix: [FileName]) {
            for name in (try? Syscall.directoryNames(in: fd)) ?? [] {
                if name.hasPrefix(MountFileSystem.stagingPrefix) { continue }
                guard let attributes = try? Syscall.fstatat(fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
                if attributes.st_mode & S_IFMT == S_IFDIR,
                   let child = try? Syscall.openat(fd, name.cString, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) {
                    walk(child, prefix + [name])
                    Syscall.close(child)
                } else if attributes.st_mode & S_IFMT == S_IFREG,
                          let record = try? OwnerRecord.load(in: fd, name: name.cString),
                          filesystem.record(record, isOf: account) {
                    found.append(prefix + [name])
                }
            }
        }
        walk(root.fd, [])
        return found
    }

    /// Brings one file to its owner's current policy.
    private func reprotect(_ path: [FileName], account: Account) -> Outcome {
        // Name by name, following no link: the tree may have changed since the walk.
        guard let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return .failed }
        guard let pathFD = try? Syscall.openBeneath(root.fd, path, Linux.O_PATH | O_CLOEXEC) else { return .moved }
        guard let attributes = try? Syscall.stat(of: pathFD) else {
            Syscall.close(pathFD)
            return .failed
        }
        let known = filesystem.inodes.known(attributes)
        let inode: Inode
        if let known {
            Syscall.close(pathFD)
            inode = known.inode
        } else {
            inode = Inode(fd: pathFD, device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino), fileType: S_IFREG)
        }
        do throws(Errno) {
            let (wanted, classKey) = try filesystem.plan(for: account.upn)
            let current = filesystem.protection(of: inode)
            if case .encrypted(_, let from) = current, case .encrypted(_, let to) = wanted, from != to, let classKey {
                try filesystem.rewrap(inode, to: to, classKey: classKey)
            } else {
                try filesystem.reprotect(id: known?.id, inode, to: wanted, classKey: classKey)
            }
            return .done
        } catch where error == .resourceBusy {
            return .busy
        } catch {
            filesystem.log("re-protection of \(path.map(\.description).joined(separator: "/")) failed: \(error)")
            return .failed
        }
    }
}

extension MountFileSystem {
    /// A new protection level for an encrypted file: the same file key, wrapped for the new class,
    /// written over the 512-byte header in place (one sector: it cannot tear). The content stays.
    func rewrap(_ inode: Inode, to protectionClass: ProtectionClass, classKey: ClassKey) throws(Errno) {
        guard let engine else { throw Errno.notSupported }
        let fd = try Syscall.open(inode.procPath, O_RDWR | O_CLOEXEC)
        defer { Syscall.close(fd) }
        let storage = DescriptorStorage(fd: fd)
        do throws(FormatError) {
            let header = try ProtectedFile.readHeader(from: storage)
            let lease: FileKeyLease
            do throws(EngineError) { lease = try engine.openFileKey(header) } catch { throw FormatError.unsupported("\(error)") }
            defer { engine.closeFileKey(lease) }
            let moved = try header.rewrapped(fileKey: lease.fileKey, to: protectionClass, classKey: classKey)
            try storage.writeBytes(moved.encoded(), at: 0)
            try storage.sync()
            guard let owner = protection(of: inode).owner else { throw FormatError.unsupported("no owner") }
            try ownerRecord(for: .encrypted(owner, protectionClass))?.store(at: inode.procPath)
            inode.protectionState.withLock { $0.protection = .encrypted(owner, protectionClass) }
        } catch .unsupported {
            throw Errno.accessDenied
        } catch {
            throw error.errnoValue
        }
    }
}
