import CustodySystem
import Glibc

/// A plain file's write that fails for want of space (the disk filled up, a quota) leaves it a clean
/// prefix of what was written, as an encrypted file's does (`ProtectedFile.settleAfterFailedWrite`).
///
/// The kernel writes a file's cached pages back in any order, so when one range fails, later
/// ranges may already be stored past it: the file would read as a run of zeros (the hole the
/// failed range left) followed by data. So after a failed write into a hole below the stored end,
/// the file is cut where the hole begins, and from then on, until it is truncated or opened anew
/// with O_TRUNC, or its last handle closes, writes that would leave a gap past its end fail with
/// the same error. A failed overwrite of data that is there, or a failed append, leaves the file
/// as it is: it is whole.
extension MountFileSystem {
    /// After a plain write at `offset` failed with `code`.
    func settleAfterFailedPlainWrite(_ file: OpenFile, at offset: off_t, code: Int32) {
        guard let inode = file.inode, [ENOSPC, EDQUOT, EFBIG].contains(code) else { return }
        if let cut = Self.gapStart(file.fd, containing: offset) {
            if Glibc.ftruncate(file.fd, cut) != 0 { log("after a failed write, \(mountRelativePath(of: inode)) could not be cut at \(cut): \(Errno.current)") }
        }
        inode.protectionState.withLock { $0.refusingGaps = code }
    }

    /// The error a write that would leave a gap past the file's end fails with, after a failed write
    /// (nil: none, or the write does not leave one).
    func refusedGap(_ file: OpenFile, at offset: off_t) -> Int32? {
        guard let inode = file.inode, let code = inode.protectionState.withLock({ $0.refusingGaps }),
              let attributes = try? Syscall.fstat(file.fd), offset > attributes.st_size else { return nil }
        return code
    }

    /// Where the hole that holds `offset` begins, when data is stored past it (or the file's size
    /// runs past it): the file is whole up to there. nil when `offset` is in data, or at or past
    /// the end.
    static func gapStart(_ fd: Int32, containing offset: off_t) -> off_t? {
        guard let attributes = try? Syscall.fstat(fd), offset < attributes.st_size else { return nil }
        var position: off_t = 0, holeStart: off_t = 0
        while position <= offset {
            let data = Glibc.lseek(fd, position, Linux.SEEK_DATA)
            // No data from `position` on (ENXIO), or the next data begins past `offset`: the hole
            // that holds `offset` begins at `holeStart`.
            if data < 0 || data > offset { return data < 0 && errno != ENXIO ? nil : holeStart }
            let hole = Glibc.lseek(fd, data, Linux.SEEK_HOLE)
            guard hole >= 0 else { return nil }
            if hole > offset { return nil }   // `offset` is in data
            holeStart = hole
            position = hole
        }
        return holeStart
    }
}
