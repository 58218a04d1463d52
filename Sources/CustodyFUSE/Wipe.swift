import CFuse3
import CustodyCore
import CustodyFormat
import CustodySystem
import Glibc

/// Selective wipe in the mount: deletes every file an identity owns, anywhere under the backing
/// root, every symlink and other object named with its name key, and every directory it owns or
/// named that is left empty. Files of other identities, unmanaged ones and no identity are
/// untouched, also inside the identity's directories (which then stay, with names nobody can read
/// any more). The engine has destroyed the identity's keys before this runs: its names are found
/// by their key tag (`Account.nameTag`).
///
/// The same walk, deleting nothing, lists what the identity owns (`listOwnedObjects`): what
/// `custodyctl files --owner` shows and `custodyctl wipe --dry-run` previews, so the preview is
/// exactly what the wipe does.
final class MountWipe: WipeHandler, OwnedObjectLister, @unchecked Sendable {
    private let filesystem: MountFileSystem
    private let session: OpaquePointer?
    private let mountPoint: String

    init(filesystem: MountFileSystem, session: OpaquePointer?, mountPoint: String) {
        self.filesystem = filesystem
        self.session = session
        self.mountPoint = mountPoint
    }

    struct Counts {
        var scanned = 0
        var deleted = 0
        var bytesFreed: UInt64 = 0
    }

    /// What one walk does with what the identity owns: deletes it (a wipe) or shows it.
    private struct Walk {
        let account: Account
        /// `NameCipher.prefix` and each of the identity's name key tags (of every generation).
        let tagged: [String]
        let deleting: Bool
        var counts = Counts()
        /// Files with more than one name already shown (device, inode).
        var shownFiles = Set<[UInt64]>()
        /// False once the listing's reader stopped it.
        var going = true
    }

    func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws(Errno) {
        var walk = Walk(account: account, tagged: account.nameTags.map { NameCipher.prefix + $0 }, deleting: true)
        let root = try filesystem.inodes.inode(InodeTable.rootID)
        try self.walk(directory: root.fd, directoryID: InodeTable.rootID, shown: nil, tweak: nil, &walk, progress: progress, visit: { _ in true })
        progress(walk.counts.scanned, walk.counts.deleted, walk.counts.bytesFreed)
    }

    func listOwnedObjects(of account: Account, visit: (OwnedObject) -> Bool) throws(Errno) {
        var walk = Walk(account: account, tagged: account.nameTags.map { NameCipher.prefix + $0 }, deleting: false)
        let root = try filesystem.inodes.inode(InodeTable.rootID)
        // The root's descriptor is an O_PATH one, whose attributes are read by path.
        let tweak = try? filesystem.tweak(of: root)
        try self.walk(directory: root.fd, directoryID: InodeTable.rootID, shown: mountPoint, tweak: tweak ?? nil, &walk,
                      progress: { _, _, _ in }, visit: visit)
    }

    /// Walks below the directory `fd` (shown as `shown` when listing, its names decrypted with
    /// `tweak` where their key is held); true when it is (or, for a listing, a wipe would leave
    /// it) empty.
    @discardableResult
    private func walk(directory fd: Int32, directoryID: UInt64?, shown: String?, tweak: [UInt8]?, _ walk: inout Walk,
                      progress: (Int, Int, UInt64) -> Void, visit: (OwnedObject) -> Bool) throws(Errno) -> Bool {
        let names = try Syscall.directoryNames(in: fd)
        var remaining = names.count
        for name in names where walk.going {
            let named = walk.tagged.contains { name.hasPrefix($0) }
            guard let attributes = try? Syscall.fstatat(fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
            let kind = attributes.st_mode & S_IFMT
            let childID = filesystem.inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino))
            let path = shown.map { $0 + "/" + filesystem.listedName(name, inDirectory: fd, tweak: tweak).description }
            walk.counts.scanned += 1
            if kind == S_IFDIR {
                let child = try Syscall.openat(fd, name.cString, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                defer { Syscall.close(child) }
                // Names are shown decrypted where the identity's key is held (listing only).
                let childTweak = path == nil ? nil : (try? DirectoryTweak.read(fd: child, names: filesystem.storeAttributes)) ?? nil
                let empty = try self.walk(directory: child, directoryID: childID, shown: path, tweak: childTweak, &walk, progress: progress, visit: visit)
                guard walk.going, named || owns(walk.account, (try? OwnerRecord.load(on: child, names: filesystem.storeAttributes)) ?? nil) else { continue }
                if let path {
                    walk.going = visit(OwnedObject(path: path, kind: .directory, size: 0, bytesOnDisk: UInt64(attributes.st_blocks) * 512,
                                                   encrypted: false, wipeDeletes: empty))
                    if empty { remaining -= 1 }
                } else if empty, (try? Syscall.unlinkat(fd, name.cString, AT_REMOVEDIR)) != nil {
                    forget(name, in: directoryID, child: childID)
                    remaining -= 1
                }
            } else if kind == S_IFREG {
                let record = (try? OwnerRecord.load(in: fd, name: name.cString, names: filesystem.storeAttributes)) ?? nil
                guard let record, owns(walk.account, record) else { continue }
                remaining -= 1
                if let path {
                    let key = [UInt64(attributes.st_dev), UInt64(attributes.st_ino)]
                    let otherLink = attributes.st_nlink > 1 && !walk.shownFiles.insert(key).inserted
                    let size = record.encryptedClass == nil ? UInt64(attributes.st_size)
                        : (try? BlockLayout().plaintextSize(storedSize: UInt64(attributes.st_size))) ?? 0
                    walk.going = visit(OwnedObject(path: path, kind: .file, size: size, bytesOnDisk: UInt64(attributes.st_blocks) * 512,
                                                   encrypted: record.encryptedClass != nil, wipeDeletes: true, otherLink: otherLink))
                    continue
                }
                try Syscall.unlinkat(fd, name.cString, 0)
                walk.counts.deleted += 1
                // A file with other names is freed with its last one.
                if attributes.st_nlink <= 1 { walk.counts.bytesFreed += UInt64(attributes.st_blocks) * 512 }
                forget(name, in: directoryID, child: childID)
                if walk.counts.deleted % 500 == 0 { progress(walk.counts.scanned, walk.counts.deleted, walk.counts.bytesFreed) }
            } else if named {
                remaining -= 1
                if let path {
                    walk.going = visit(OwnedObject(path: path, kind: kind == S_IFLNK ? .symlink : .other, size: 0,
                                                   bytesOnDisk: UInt64(attributes.st_blocks) * 512, encrypted: kind == S_IFLNK, wipeDeletes: true))
                    continue
                }
                try Syscall.unlinkat(fd, name.cString, 0)
                walk.counts.deleted += 1
                forget(name, in: directoryID, child: childID)
            }
        }
        return remaining == 0
    }

    private func owns(_ account: Account, _ record: OwnerRecord?) -> Bool {
        guard let record else { return false }
        return filesystem.record(record, isOf: account)
    }

    /// Drops the names the kernel holds decrypted with the key tagged `tag` (its key went).
    func hideNames(tagged tag: String) {
        guard let session else { return }
        let prefix = NameCipher.prefix + tag
        for entry in filesystem.inodes.entryNames() where entry.stored?.hasPrefix(prefix) == true {
            _ = fuse_lowlevel_notify_inval_entry(session, fuse_ino_t(entry.parent), entry.name.cString, entry.name.count)
        }
    }

    /// Drops the listings the kernel caches of directories that may hold encrypted names (all
    /// but those known to have no tweak): a key that appeared shows some of them decrypted now.
    /// (A name looked up in vain before stays "not there" for the negative timeout.)
    func revealNames() {
        guard let session else { return }
        for (id, inode) in filesystem.inodes.snapshot() where inode.isDirectory {
            if case .none = inode.tweak.withLock({ $0 }) { continue }
            _ = fuse_lowlevel_notify_inval_inode(session, fuse_ino_t(id), 0, 0)
        }
    }

    /// Tells the kernel that a name it may have cached is gone.
    private func forget(_ stored: FileName, in parent: UInt64?, child: UInt64?) {
        guard let session, let parent else { return }
        // The kernel knows an encrypted name by what it was shown.
        var name = stored
        if let child, let known = filesystem.inodes.name(of: child), known.parent == parent, known.storedName == stored { name = known.name }
        if let child {
            _ = fuse_lowlevel_notify_delete(session, fuse_ino_t(parent), fuse_ino_t(child), name.cString, name.count)
        } else {
            _ = fuse_lowlevel_notify_inval_entry(session, fuse_ino_t(parent), name.cString, name.count)
        }
    }
}
