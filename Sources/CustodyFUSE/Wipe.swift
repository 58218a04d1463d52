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
final class MountWipe: WipeHandler, @unchecked Sendable {
    private let filesystem: MountFileSystem
    private let session: OpaquePointer?

    init(filesystem: MountFileSystem, session: OpaquePointer?) {
        self.filesystem = filesystem
        self.session = session
    }

    struct Counts {
        var scanned = 0
        var deleted = 0
        var bytesFreed: UInt64 = 0
    }

    func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws(Errno) {
        var counts = Counts()
        let root = try filesystem.inodes.inode(InodeTable.rootID)
        try wipe(directory: root.fd, directoryID: InodeTable.rootID, account: account, counts: &counts, progress: progress)
        progress(counts.scanned, counts.deleted, counts.bytesFreed)
    }

    /// Wipes below the directory `fd`; true when it is left empty.
    @discardableResult
    private func wipe(directory fd: Int32, directoryID: UInt64?, account: Account, counts: inout Counts,
                      progress: (Int, Int, UInt64) -> Void) throws(Errno) -> Bool {
        let names = try Syscall.directoryNames(in: fd)
        var remaining = names.count
        let tagged = account.nameTag.map { NameCipher.prefix + $0 }
        for name in names {
            let named = tagged.map { name.hasPrefix($0) } ?? false
            guard let attributes = try? Syscall.fstatat(fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
            let kind = attributes.st_mode & S_IFMT
            counts.scanned += 1
            if kind == S_IFDIR {
                let child = try Syscall.openat(fd, name.cString, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                let childID = filesystem.inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino))
                let empty = try wipe(directory: child, directoryID: childID, account: account, counts: &counts, progress: progress)
                let owned = owns(account, (try? OwnerRecord.load(on: child)) ?? nil)
                Syscall.close(child)
                if empty, owned || named, (try? Syscall.unlinkat(fd, name.cString, AT_REMOVEDIR)) != nil {
                    forget(name, in: directoryID, child: childID)
                    remaining -= 1
                }
            } else if kind == S_IFREG {
                guard owns(account, (try? OwnerRecord.load(in: fd, name: name.cString)) ?? nil) else { continue }
                try Syscall.unlinkat(fd, name.cString, 0)
                counts.deleted += 1
                counts.bytesFreed += UInt64(attributes.st_blocks) * 512
                forget(name, in: directoryID, child: filesystem.inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)))
                remaining -= 1
                if counts.deleted % 500 == 0 { progress(counts.scanned, counts.deleted, counts.bytesFreed) }
            } else if named {
                try Syscall.unlinkat(fd, name.cString, 0)
                counts.deleted += 1
                forget(name, in: directoryID, child: filesystem.inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)))
                remaining -= 1
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
