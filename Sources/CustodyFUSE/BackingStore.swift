import CustodyFormat
import CustodySystem
import Glibc

/// What the file system under a mount's backing directory implies for the mount.
enum BackingStore {
    /// File systems whose `close` does nothing a caller could see: a write error there surfaces at
    /// the write or at `fsync`, never only at close (`statfs` magic numbers: ext2/3/4, XFS, Btrfs,
    /// tmpfs, F2FS, ZFS, bcachefs, overlayfs).
    static let localTypes: Set<Int> = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0xF2F5_2010, 0x2FC1_2FC1, 0xCA45_1A4E, 0x794C_7630]

    /// Whether closing a file of the backing store can report an error (a network file system
    /// flushes at close, as NFS does): then each close is passed on as a FLUSH. Unknown file
    /// systems are treated as network ones.
    static func reportsErrorsAtClose(_ fd: Int32) -> Bool {
        guard let type = try? Syscall.fileSystemType(fd) else { return true }
        return !localTypes.contains(type)
    }

    /// The namespace of the extended attributes the store's records are in (`StoreAttributes`):
    /// the one the marker on its root names; for a store with no marker, `wanted`, else
    /// `trusted` where the store keeps it and `user` where it keeps only that (NFS), and the
    /// marker is set. Refused: a store that keeps neither, one whose marker names another
    /// namespace than `wanted`, and (asked for `user`) one whose root holds `trusted` records.
    static func attributes(of path: String, wanted: StoreAttributes.Namespace?) throws(MountError) -> StoreAttributes {
        let fd: Int32
        do { fd = try Syscall.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) } catch { throw .backingUnreadable(path, error) }
        defer { Syscall.close(fd) }
        let marked = StoreAttributes.Namespace.allCases.filter { hasAttribute(fd, StoreAttributes($0).namespaceMarker) }
        if marked.count > 1 { throw .storeAttributes(path, "its root is marked for both trusted.* and user.* records; remove the wrong marker") }
        if let found = marked.first {
            if let wanted, wanted != found {
                throw .storeAttributes(path, "its records are in \(found).* attributes, not \(wanted).* (store_attributes = \"\(found)\", or leave it out)")
            }
            return StoreAttributes(found)
        }
        if wanted == .user, hasAttribute(withPrefix: StoreAttributes.trusted.prefix, fd) {
            throw .storeAttributes(path, "it holds trusted.* records of an earlier mount; they would be lost with user.* ones")
        }
        var refusals: [String] = []
        for namespace in wanted.map({ [$0] }) ?? StoreAttributes.Namespace.allCases {
            let candidate = StoreAttributes(namespace)
            do {
                try Array("1".utf8).withBytes { (bytes) throws(Errno) in
                    try Syscall.fsetxattr(fd, candidate.namespaceMarker, bytes.baseAddress, bytes.count, Linux.XATTR_CREATE)
                }
                return candidate
            } catch where error == .exists {
                return candidate
            } catch where error == .readOnlyFileSystem {
                // Nothing will be written: read what is there.
                return hasAttribute(withPrefix: StoreAttributes.user.prefix, fd) ? .user : StoreAttributes(wanted ?? .trusted)
            } catch {
                refusals.append("\(namespace).*: \(error)")
            }
        }
        throw .storeAttributes(path, "it keeps no extended attributes this daemon may set for its records (\(refusals.joined(separator: "; ")))")
    }

    private static func hasAttribute(_ fd: Int32, _ name: String) -> Bool {
        (try? Syscall.fgetxattr(fd, name, nil, 0)) != nil
    }

    /// Whether the directory `fd` has an attribute whose name starts with `prefix`.
    private static func hasAttribute(withPrefix prefix: String, _ fd: Int32) -> Bool {
        ((try? Syscall.attributeNames(Syscall.procPath(fd))) ?? []).contains { $0.hasPrefix(prefix) }
    }
}
