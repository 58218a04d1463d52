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
///
/// After the identity's keys were rotated (`Engine.rotateKeys`) the same pass brings what it
/// stored under its earlier generations to the current one: each such file is written anew (a
/// new file key under the current class key, its owner record by the current class D's ID),
/// each such directory's owner record is written again, and every entry named with an earlier
/// name key (a symlink's target with it) is renamed into the current key's form, deepest first.
/// An owner record by an earlier key ID is what marks a file or directory as not brought over yet.
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
        var found = walk(account)
        var pending = found.files
        var total = pending.count + found.directories.count + found.names.count
        var done = 0, failed = 0
        var reported = monotonicSeconds()
        // A file renamed since the walk is not found by its old names: the tree is walked again
        // (a few times at most) for what is left, so that a rename does not leave a file behind.
        var walks = 1
        for _ in 0..<Self.retryLimit where !pending.isEmpty {
            var busy: [[FileName]] = []
            var moved = false
            for path in pending {
                switch reprotect(path, account: account, rewriting: found.rewrite.contains(path)) {
                case .done: done += 1
                case .busy: busy.append(path)
                case .moved: moved = true
                case .failed: failed += 1
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
                let walked = walk(account)
                let again = walked.files.filter { path in !busy.contains(path) }
                found.rewrite.formUnion(walked.rewrite)
                total += again.count
                pending += again
            }
            if !busy.isEmpty { usleep(Self.retryInterval) }
        }
        // After the files (whose paths name their directories as stored now): directories' own
        // records, then names, the deepest first, so that no path walked later has changed.
        for path in found.directories { if rerecord(path) { done += 1 } }
        for path in found.names.sorted(by: { $0.count > $1.count }) { if rename(path, for: account) { done += 1 } }
        // A file that could not be brought over (its class key locked away, say) keeps the account
        // marked: the next pass (at an unlock, a start of the mount, a change) tries it again.
        if pending.isEmpty, failed == 0 { try? engine.reprotectFinished(account.id) }
        let message = failed > 0 ? "re-protection of \(account.upn) could not bring \(failed) files over yet"
            : pending.isEmpty ? "re-protected \(account.upn)'s files" : "re-protection of \(account.upn) left \(pending.count) open files"
        engine.events.emit(.reprotectFinished, identity: account.upn, message,
                           details: ["done": "\(done)", "total": "\(total)", "left": "\(pending.count)", "failed": "\(failed)"])
    }

    enum Outcome { case done, busy, moved, failed }

    /// What a pass has to do for an account, each object as the names leading to it from the
    /// root (bytes: a name need not be UTF-8).
    struct Found {
        /// The regular files it owns.
        var files: [[FileName]] = []
        /// Those of them whose owner record names an earlier generation's key: written anew.
        var rewrite: Set<[FileName]> = []
        /// Its directories whose owner record names an earlier generation's key.
        var directories: [[FileName]] = []
        /// Entries named with one of its earlier name keys.
        var names: [[FileName]] = []
    }

    private func walk(_ account: Account) -> Found {
        guard let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return Found() }
        let current = engine?.ownerKeyID(for: account.upn)
        let earlierNames = (account.earlierNameTags ?? []).map { NameCipher.prefix + $0 }
        var found = Found()
        func earlier(_ record: OwnerRecord) -> Bool {
            if case .keyID(let id) = record.holder, let current { return id != current }
            return false
        }
        func walk(_ fd: Int32, _ prefix: [FileName]) {
            for name in (try? Syscall.directoryNames(in: fd)) ?? [] {
                if name.hasPrefix(MountFileSystem.stagingPrefix) { continue }
                guard let attributes = try? Syscall.fstatat(fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
                let path = prefix + [name]
                if earlierNames.contains(where: { name.hasPrefix($0) }) { found.names.append(path) }
                if attributes.st_mode & S_IFMT == S_IFDIR,
                   let child = try? Syscall.openat(fd, name.cString, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) {
                    if let record = try? OwnerRecord.load(on: child, names: filesystem.storeAttributes), filesystem.record(record, isOf: account), earlier(record) {
                        found.directories.append(path)
                    }
                    walk(child, path)
                    Syscall.close(child)
                } else if attributes.st_mode & S_IFMT == S_IFREG,
                          let record = try? OwnerRecord.load(in: fd, name: name.cString, names: filesystem.storeAttributes),
                          filesystem.record(record, isOf: account) {
                    found.files.append(path)
                    if earlier(record) { found.rewrite.insert(path) }
                }
            }
        }
        walk(root.fd, [])
        return found
    }

    /// The node of the object at `path`, and the node ID the kernel knows it by (nil when it
    /// does not: a node of the moment); nil when the path leads nowhere now.
    private func node(at path: [FileName]) -> (id: UInt64?, inode: Inode)? {
        guard let pathFD = open(path) else { return nil }
        return node(of: pathFD)
    }

    /// An `O_PATH` descriptor on the object at `path`, name by name, following no link (the tree
    /// may have changed since the walk); nil when the path leads nowhere now.
    private func open(_ path: [FileName]) -> Int32? {
        guard let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return nil }
        return try? Syscall.openBeneath(root.fd, path, Linux.O_PATH | O_CLOEXEC)
    }

    /// The node of what `pathFD` (taken) refers to: the one the kernel knows, else one of the
    /// moment; nil when its attributes cannot be read.
    private func node(of pathFD: Int32) -> (id: UInt64?, inode: Inode)? {
        guard let attributes = try? Syscall.stat(of: pathFD) else {
            Syscall.close(pathFD)
            return nil
        }
        if let known = filesystem.inodes.known(attributes) {
            Syscall.close(pathFD)
            return (known.id, known.inode)
        }
        return (nil, Inode(fd: pathFD, attributes: attributes))
    }

    /// Writes a directory's owner record again (by its owner's current key ID).
    private func rerecord(_ path: [FileName]) -> Bool {
        guard let (_, inode) = node(at: path), inode.isDirectory else { return false }
        do throws(Errno) {
            // As its protection says now: a managed owner's record by its current key ID.
            try filesystem.storeRecord(for: filesystem.protection(of: inode), on: inode)
            return true
        } catch {
            filesystem.log("the owner record of \(path.map(\.description).joined(separator: "/")) stays as it was: \(error)")
            return false
        }
    }

    /// Seals the name at `path` (and a symlink's target) again with its owner's current name key.
    private func rename(_ path: [FileName], for account: Account) -> Bool {
        guard let name = path.last else { return false }
        let directory: Inode
        if path.count == 1 {
            guard let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return false }
            directory = root
        } else {
            guard let (_, found) = node(at: Array(path.dropLast())), found.isDirectory else { return false }
            directory = found
        }
        return filesystem.renameForOwner(name, in: directory, owner: account.upn) != name
    }

    /// Brings one file to its owner's current policy (and with `rewriting`, to its current keys).
    private func reprotect(_ path: [FileName], account: Account, rewriting: Bool) -> Outcome {
        guard let pathFD = open(path) else { return .moved }
        guard let (knownID, inode) = node(of: pathFD) else { return .failed }
        do throws(Errno) {
            let (wanted, classKey) = try filesystem.plan(for: account.upn)
            let current = filesystem.protection(of: inode)
            if rewriting {
                try filesystem.reprotect(id: knownID, inode, to: wanted, classKey: classKey, rewriting: true)
            } else if case .encrypted(_, let from) = current, case .encrypted(_, let to) = wanted, from != to, let classKey {
                try filesystem.rewrap(inode, to: to, classKey: classKey)
            } else {
                try filesystem.reprotect(id: knownID, inode, to: wanted, classKey: classKey)
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
        let storage = DescriptorStorage(fd: fd, attributes: storeAttributes)
        do throws(FormatError) {
            let header = try ProtectedFile.readHeader(from: storage)
            let lease: FileKeyLease
            do throws(EngineError) { lease = try engine.openFileKey(header) } catch { throw FormatError.unsupported("\(error)") }
            defer { engine.closeFileKey(lease) }
            let moved = try header.rewrapped(fileKey: lease.fileKey, to: protectionClass, classKey: classKey)
            try storage.writeBytes(moved.encoded(), at: 0)
            try storage.sync()
            guard let owner = protection(of: inode).owner else { throw FormatError.unsupported("no owner") }
            try ownerRecord(for: .encrypted(owner, protectionClass))?.store(at: inode.procPath, names: storeAttributes)
            inode.protectionState.withLock { $0.protection = .encrypted(owner, protectionClass) }
        } catch .unsupported {
            throw Errno.accessDenied
        } catch {
            throw error.errnoValue
        }
    }
}
