import CustodySystem

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
}
