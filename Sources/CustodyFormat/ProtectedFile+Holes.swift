import CustodyCrypto
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// The holes a version 2 file records (`HoleSet`), kept as writes fill them and truncation cuts them.
extension ProtectedFile {
    /// The file's holes, read from its record the first time. A record that is missing or does
    /// not verify lists none, so zero blocks then read as errors (the safe side).
    func holeSet() -> HoleSet {
        holes.withLock { state in
            if !state.loaded {
                if let record = try? storage.readHoleRecord(), let set = HoleSet.decode(record, cipher: cipher) { state.set = set }
                state.loaded = true
            }
            return state.set
        }
    }

    /// Changes the hole set and stores its record; false (nothing changed) when it cannot be
    /// stored or would grow past `HoleSet.maxRanges`.
    @discardableResult
    func updateHoles(_ change: (inout HoleSet) -> Void) -> Bool {
        _ = holeSet()
        return holes.withLock { state in
            var set = state.set
            change(&set)
            guard set != state.set else { return true }
            guard set.ranges.count <= HoleSet.maxRanges,
                  let record = set.isEmpty ? [] : try? set.record(cipher: cipher),
                  (try? storage.writeHoleRecord(set.isEmpty ? nil : record)) != nil else { return false }
            state.set = set
            return true
        }
    }

    /// Before blocks `gap` are left unwritten below a new end: lists them as holes, or, where no
    /// record can be kept, writes them as encrypted zeros (the file is then not sparse there).
    func leaveHoles(_ gap: Range<UInt64>, oldSize: UInt64, newSize: UInt64) throws(FormatError) {
        guard tracksHoles, !gap.isEmpty else { return }
        if updateHoles({ $0.insert(gap) }) { return }
        try storeBlocks(gap.lowerBound...(gap.upperBound - 1), oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0)
    }

    /// After blocks `written` were stored: they are no holes any more.
    func filledHoles(_ written: ClosedRange<UInt64>) {
        guard tracksHoles else { return }
        let range = written.lowerBound..<(written.upperBound + 1)
        if holeSet().intersects(range) { updateHoles { $0.remove(range) } }
    }

    /// After the file was cut to `size` bytes: holes past its blocks go.
    func cutHoles(toSize size: UInt64) {
        guard tracksHoles else { return }
        let blocks = (size + layout.blockSize - 1) / layout.blockSize
        if holeSet().ranges.last.map({ $0.upperBound > blocks }) ?? false { updateHoles { $0.trim(toBlocks: blocks) } }
    }
}
