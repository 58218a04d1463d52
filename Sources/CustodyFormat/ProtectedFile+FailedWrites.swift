import CustodyCrypto
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// What a write that failed part-way (a full disk, an I/O error) leaves: space reserved before
/// a large write, torn blocks made holes again, the stored prefix kept authentic.
extension ProtectedFile {
    /// After an in-place write failed part-way: every block of the range that no longer opens was
    /// a hole the write began to fill (writing over stored blocks needs no new space), so it is
    /// made a hole again. The final block is never a hole and is left as it is.
    func repairTornBlocks(_ range: ClosedRange<UInt64>) {
        let size = plaintextSize
        guard size > 0 else { return }
        let final = (size - 1) / layout.blockSize
        guard range.lowerBound < final else { return }
        let blocks = range.lowerBound...min(range.upperBound, final - 1)
        try? BlockWorker.with(self) { (worker) throws(FormatError) in
            for index in blocks where (try? readStoredBlock(index, length: layout.blockSize, final: false, worker: worker)) == nil {
                try? storage.punchHole(at: layout.storedOffset(ofBlock: index), length: layout.storedBlockSize)
            }
        }
    }

    /// Growing writes of at least this many bytes reserve their space first.
    static let reserveThreshold: UInt64 = 256 * 1024

    /// Reserves the stored bytes of `blocks` in a file of `size` bytes.
    func reserve(_ blocks: ClosedRange<UInt64>, size: UInt64) throws(FormatError) {
        let start = layout.storedOffset(ofBlock: blocks.lowerBound)
        let end = layout.storedOffset(ofBlock: blocks.upperBound) + layout.plaintextLength(ofBlock: blocks.upperBound, fileSize: size)
            + UInt64(BlockLayout.overhead)
        try storage.reserve(at: start, length: end - start)
    }

    /// After a growing write failed part-way (storage that cannot reserve space), makes the file end at the last whole block on disk
    /// (re-sealed as the final block, so the truncation check passes) and cuts the torn rest, or,
    /// when no new block survived whole, goes back to the size it had. Re-sealing overwrites a
    /// block in place, which needs no new space. Called with the size lock held exclusively.
    func keepStoredPrefix(oldSize: UInt64, attemptedSize: UInt64) {
        let blockSize = layout.blockSize
        guard let stored = try? storage.size() else { return }
        let whole = stored > layout.headerLength ? (stored - layout.headerLength) / layout.storedBlockSize : 0
        /// Re-seals block `count - 1` (as the write that failed stored it, under `storedUnder`)
        /// as the final block of a file of `count` blocks, and cuts the storage there.
        func keep(blocks count: UInt64, storedUnder: UInt64) -> Bool {
            let size = count * blockSize
            guard (try? storeBlocks((count - 1)...(count - 1), oldSize: storedUnder, newSize: size, data: nil, dataOffset: 0)) != nil,
                  (try? storage.truncate(to: layout.storedSize(plaintextSize: size))) != nil else { return false }
            plaintextSize = size
            cutHoles(toSize: size)
            filledHoles((count - 1)...(count - 1))
            return true
        }
        var count = min(whole, attemptedSize / blockSize)
        while count > 0, count * blockSize >= oldSize {
            if keep(blocks: count, storedUnder: attemptedSize) { return }
            count -= 1
        }
        guard oldSize > 0 else {
            if (try? storage.truncate(to: layout.headerLength)) != nil { plaintextSize = 0 }
            cutHoles(toSize: 0)
            return
        }
        // The old final block, if the failed write did not reach it, is whole: keep the old size.
        let oldFinal = (oldSize - 1) / blockSize
        if (try? storeBlocks(oldFinal...oldFinal, oldSize: oldSize, newSize: oldSize, data: nil, dataOffset: 0)) != nil,
           (try? storage.truncate(to: layout.storedSize(plaintextSize: oldSize))) != nil {
            plaintextSize = oldSize
            cutHoles(toSize: oldSize)
            return
        }
        count = oldFinal
        while count > 0 {
            if keep(blocks: count, storedUnder: oldSize) { return }
            count -= 1
        }
        if (try? storage.truncate(to: layout.headerLength)) != nil { plaintextSize = 0 }
        cutHoles(toSize: 0)
    }

    /// After a write failed (the disk filled up): other writes may have stored data past the
    /// failed range (the kernel writes back pages in any order), so the file is cut where it
    /// stopped being whole, and from then on writes that would leave a gap fail with the same
    /// error. The file reads as a clean prefix of what was written; `truncate` ends this state.
    /// True when the file was cut.
    @discardableResult
    public func settleAfterFailedWrite(_ error: FormatError) -> Bool {
        pthread_rwlock_wrlock(sizeLock)
        defer { pthread_rwlock_unlock(sizeLock) }
        refusingGaps = error
        guard let point = failedAt.withLock({ point in defer { point = nil }; return point }) else { return false }
        guard point < plaintextSize else { return false }
        // The new final block is re-sealed in place, which needs no space unless it is a hole
        // (the gap may begin below the failed write): step back over holes, and over blocks that
        // cannot be re-sealed, to the end of what is whole.
        let blockSize = layout.blockSize
        var cut = point / blockSize * blockSize
        var stored = [UInt8](repeating: 0, count: Int(layout.storedBlockSize))
        for _ in 0..<4096 where cut > 0 {
            let last = cut / blockSize - 1
            let got = (try? stored.withUnsafeMutableBytes { try storage.read(into: $0, at: layout.storedOffset(ofBlock: last)) }) ?? 0
            let hole = got == stored.count && stored.allSatisfy { $0 == 0 }
            if !hole, (try? resize(to: cut)) != nil { return true }
            cut -= blockSize
        }
        return cut == 0 && (try? resize(to: 0)) != nil
    }
}
