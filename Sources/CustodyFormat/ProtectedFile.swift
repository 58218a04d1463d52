import CustodyCrypto
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Random-access plaintext over the encrypted format: read, write and truncate at any offset, with
/// read-modify-write of partial blocks, sparse holes, and a final-block flag that makes truncation
/// at a block boundary detectable.
///
/// Concurrency: any number of readers and writers may use one object. A size lock is held shared
/// by reads and by writes inside the current size, exclusively by writes that extend the file and
/// by truncate; 64 striped block locks keep two requests from touching the same block at once.
/// There must be one `ProtectedFile` per stored file at a time (the engine keeps one per inode).
public final class ProtectedFile: @unchecked Sendable {
    public let header: FileHeader
    public let storage: BlockStorage
    public let layout: BlockLayout
    let cipher: ContentCipher

    /// Requests of at least this many blocks are split across cores.
    static let parallelThreshold: UInt64 = 32
    /// One worker per online core.
    public static let defaultParallelism = max(1, sysconf(Int32(_SC_NPROCESSORS_ONLN)))
    /// The most threads one request's blocks are spread over (1: the calling thread only).
    public let parallelism: Int
    static let stripeCount = 64

    var plaintextSize: UInt64
    /// Where the file stops being whole after a write failed (the disk filled up), until
    /// `settleAfterFailedWrite` cuts it there.
    let failedAt = Mutex<UInt64?>(nil)
    /// Set once a failed write was settled: writes that would leave a gap are refused (with the
    /// error that failed the first), so the file stays a clean prefix. Guarded by the size lock.
    var refusingGaps: FormatError?
    /// Version 2: which zero blocks are holes (loaded from the hole record at first need).
    let holes = Mutex<(loaded: Bool, set: HoleSet)>((false, HoleSet()))
    var tracksHoles: Bool { header.version >= 2 }
    // Allocated in init only after every step that can throw: a throwing init skips deinit.
    let sizeLock: UnsafeMutablePointer<pthread_rwlock_t>
    let stripes: UnsafeMutablePointer<pthread_mutex_t>

    // MARK: Opening and creating

    /// A new, empty protected file: writes a fresh header over `storage`, wrapping `fileKey` (a new
    /// random key when nil; the engine passes one so that it can share it with later opens).
    /// `storageIsEmpty`: the caller knows `storage` is empty (a file it has just created), so its
    /// size is not asked before the header goes on. `owner`: nil writes a version 3 header, which
    /// names no owner (what the daemon writes); one given writes a version 2 header naming it.
    public static func create(on storage: BlockStorage, owner: Owner?, protectionClass: ProtectionClass, classKey: ClassKey,
                              fileKey suppliedKey: SecretBytes? = nil, blockSize: UInt32 = FileHeader.defaultBlockSize,
                              parallelism: Int = defaultParallelism, storageIsEmpty: Bool = false) throws(FormatError) -> ProtectedFile {
        let fileKey: SecretBytes
        if let suppliedKey {
            fileKey = suppliedKey
        } else {
            do { fileKey = try SecretBytes.random(count: 32) } catch { throw .crypto(error) }
        }
        let header = try FileHeader.encrypted(owner: owner, protectionClass: protectionClass, classKey: classKey,
                                              fileKey: fileKey, blockSize: blockSize)
        // Only when there is something to cut: on ext4 a truncate to zero marks the file for
        // writeback at close (auto_da_alloc), a disk write per new file.
        if !storageIsEmpty, try storage.size() != 0 { try storage.truncate(to: 0) }
        try storage.writeBytes(header.encoded(), at: 0)
        // The storage now holds the header alone: an empty file, whose size need not be asked.
        let file = try ProtectedFile(storage: storage, header: header, fileKey: fileKey, parallelism: parallelism, plaintextSize: 0)
        // A new file has no holes (a record left by an earlier file at this place goes).
        if !storageIsEmpty { try? storage.writeHoleRecord(nil) }
        file.holes.withLock { $0 = (true, HoleSet()) }
        return file
    }

    /// Opens existing content: reads the header, asks `classKey` for the key it names, unwraps.
    public static func open(_ storage: BlockStorage, parallelism: Int = defaultParallelism,
                            classKey: (FileHeader) throws(FormatError) -> ClassKey) throws(FormatError) -> ProtectedFile {
        let header = try readHeader(from: storage)
        guard header.kind == .encrypted else { throw .unsupported("content of a plain-kind file is not encrypted") }
        let fileKey = try header.unwrapFileKey(with: try classKey(header))
        return try ProtectedFile(storage: storage, header: header, fileKey: fileKey, parallelism: parallelism)
    }

    /// The header at the start of `storage`.
    public static func readHeader(from storage: BlockStorage) throws(FormatError) -> FileHeader {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: FileHeader.length, alignment: 8)
        defer { buffer.deallocate() }
        let count = try storage.read(into: buffer, at: 0)
        return try FileHeader.decode(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
    }

    /// Content whose file key the caller already holds (the engine caches unwrapped keys).
    public convenience init(storage: BlockStorage, header: FileHeader, fileKey: SecretBytes, parallelism: Int = defaultParallelism) throws(FormatError) {
        try self.init(storage: storage, header: header, fileKey: fileKey, parallelism: parallelism, plaintextSize: nil)
    }

    /// `plaintextSize`: known to the caller (a file just created), or nil to derive from the
    /// stored size.
    init(storage: BlockStorage, header: FileHeader, fileKey: SecretBytes, parallelism: Int, plaintextSize: UInt64?) throws(FormatError) {
        guard header.kind == .encrypted else { throw .unsupported("content of a plain-kind file is not encrypted") }
        let layout = BlockLayout(blockSize: header.blockSize)
        if let plaintextSize {
            self.plaintextSize = plaintextSize
        } else {
            self.plaintextSize = try layout.plaintextSize(storedSize: storage.size())
        }
        self.cipher = try ContentCipher(fileKey: fileKey, fileID: header.fileID)
        self.storage = storage
        self.header = header
        self.layout = layout
        self.parallelism = max(1, parallelism)
        sizeLock = .allocate(capacity: 1)
        stripes = .allocate(capacity: Self.stripeCount)
        pthread_rwlock_init(sizeLock, nil)
        for index in 0..<Self.stripeCount { pthread_mutex_init(stripes + index, nil) }
    }

    deinit {
        pthread_rwlock_destroy(sizeLock)
        sizeLock.deallocate()
        for index in 0..<Self.stripeCount { pthread_mutex_destroy(stripes + index) }
        stripes.deallocate()
    }

    /// The plaintext size (kept in memory; derived from the stored size when opened).
    public var size: UInt64 {
        pthread_rwlock_rdlock(sizeLock)
        defer { pthread_rwlock_unlock(sizeLock) }
        return plaintextSize
    }

    // MARK: Reading

    /// A read at least this large is taken for part of a stream: the next stretch of the same size
    /// is asked of the disk while this one is served (the mount's plain reads take the same size
    /// for a stream's, and ask for more only after one waited for the disk).
    public static let prefetchThreshold = 256 * 1024
    /// Small reads of files of at least this many bytes go through a mapping (see `readMapped`).
    static let mappingThreshold: UInt64 = 1 << 20
    struct MappingState {
        var mapping: FileMapping?
        /// The storage could not be mapped: not tried again.
        var unavailable = false
    }
    let mapping = Mutex(MappingState())
    /// Stored (encrypted) bytes of one request: a 1 MiB request at any offset fits. Kept for reuse,
    /// so large requests do not fault fresh memory in every time (see `BufferPool`).
    static let storedBuffers = BufferPool(capacity: (1 << 20) + (64 << 10), keep: 2, zeroesOnReturn: false, smallLimit: 64 << 10)

    /// Reads up to `buffer.count` plaintext bytes at `offset`; fewer only at the end of the file.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int {
        guard buffer.count > 0, let out = buffer.baseAddress else { return 0 }
        pthread_rwlock_rdlock(sizeLock)
        defer { pthread_rwlock_unlock(sizeLock) }
        let size = plaintextSize
        guard offset < size else { return 0 }
        let end = min(offset + UInt64(buffer.count), size)
        let blockSize = layout.blockSize
        let first = offset / blockSize, last = (end - 1) / blockSize, finalBlock = (size - 1) / blockSize
        let locked = lockStripes(first...last)
        defer { unlockStripes(locked) }

        let storedStart = layout.storedOffset(ofBlock: first)
        let storedEnd = layout.storedOffset(ofBlock: last) + layout.plaintextLength(ofBlock: last, fileSize: size) + UInt64(BlockLayout.overhead)
        if storedEnd - storedStart >= UInt64(Self.prefetchThreshold), storedEnd < layout.storedSize(plaintextSize: size) {
            // A large read is a stream: have the disk fetch the next stretch while this one is
            // decrypted (the reads wait on the disk one after the other otherwise).
            storage.willRead(at: storedEnd, length: storedEnd - storedStart)
        }
        if storedEnd - storedStart < UInt64(Self.prefetchThreshold),
           try readMapped(first...last, into: out, from: offset, to: end, fileSize: size, storedEnd: storedEnd) {
            return Int(end - offset)
        }
        return try Self.storedBuffers.withBuffer(byteCount: Int(storedEnd - storedStart)) { (stored) throws(FormatError) -> Int in
            // One read for the whole range, then the parts decrypt in parallel. (Parts reading their own
            // blocks looked to the kernel like two readers at unrelated offsets: its read-ahead of the
            // stored file stopped working and cold sequential reads waited on the disk.)
            let got = try storage.read(into: stored, at: storedStart)
            guard got == stored.count else { throw .corruptLength(storedStart + UInt64(got)) }
            try processBlocks(first...last) { (blocks, worker) throws(FormatError) in
                for index in blocks {
                    let source = UnsafeRawBufferPointer(start: stored.baseAddress! + Int((index - first) * layout.storedBlockSize),
                                                        count: Int(layout.plaintextLength(ofBlock: index, fileSize: size)) + BlockLayout.overhead)
                    try deliver(index, of: worker, from: offset, to: end, into: out, fileSize: size) { (plaintext) throws(FormatError) in
                        try openBlock(worker, index, final: index == finalBlock, source, into: plaintext)
                    }
                }
            }
            return Int(end - offset)
        }
    }

    /// Opens block `index` with `open` straight into the caller's buffer when the request covers
    /// the whole block, else into the worker's scratch, and copies the requested part.
    func deliver(_ index: UInt64, of worker: BlockWorker, from offset: UInt64, to end: UInt64, into out: UnsafeMutableRawPointer,
                 fileSize size: UInt64, _ open: (UnsafeMutableRawPointer) throws(FormatError) -> Void) throws(FormatError) {
        let blockStart = index * layout.blockSize
        let length = layout.plaintextLength(ofBlock: index, fileSize: size)
        let wantStart = max(offset, blockStart), wantEnd = min(end, blockStart + length)
        let destination = out + Int(wantStart - offset)
        if wantStart == blockStart, wantEnd == blockStart + length {
            try open(destination)
        } else {
            try open(worker.plaintext)
            destination.copyMemory(from: worker.plaintext + Int(wantStart - blockStart), byteCount: Int(wantEnd - wantStart))
        }
    }

    /// Opens one stored block, telling a hole, a truncation and tampering apart (only once the tag
    /// has failed, so the normal path pays nothing for it).
    func openBlock(_ worker: BlockWorker, _ index: UInt64, final: Bool, _ stored: UnsafeRawBufferPointer, into plaintext: UnsafeMutableRawPointer) throws(FormatError) {
        do {
            try cipher.open(worker.context, aad: worker.aad, index: index, final: final, stored: stored, into: plaintext)
            return
        } catch where error == .authenticationFailed {
        } catch {
            throw .crypto(error)
        }
        let length = stored.count - BlockLayout.overhead
        if !final, UInt64(length) == layout.blockSize, stored.allSatisfy({ $0 == 0 }), !tracksHoles || holeSet().contains(index) {
            // A hole: never written, reads as zeros. (Only non-final blocks can be holes; in a
            // version 2 file only the listed ones: other zeros are damage.)
            plaintext.initializeMemory(as: UInt8.self, repeating: 0, count: length)
            return
        }
        if final, (try? cipher.open(worker.context, aad: worker.aad, index: index, final: false, stored: stored, into: plaintext)) != nil {
            plaintext.initializeMemory(as: UInt8.self, repeating: 0, count: length)
            throw .truncated(lastBlock: index)
        }
        throw .blockAuthenticationFailed(index: index)
    }

    // MARK: Writing

    /// Writes all of `data` at plaintext `offset`, extending the file (with holes) if needed.
    public func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) {
        guard data.count > 0 else { return }
        let (end, overflow) = offset.addingReportingOverflow(UInt64(data.count))
        guard !overflow, end <= UInt64(Int64.max) / 2 else { throw .unsupported("a write past \(UInt64(Int64.max) / 2) bytes") }
        pthread_rwlock_rdlock(sizeLock)
        var exclusive = false
        if end > plaintextSize {
            pthread_rwlock_unlock(sizeLock)
            pthread_rwlock_wrlock(sizeLock)
            exclusive = true
        }
        defer { pthread_rwlock_unlock(sizeLock) }

        let oldSize = plaintextSize, newSize = max(oldSize, end)
        if let refusingGaps, offset > oldSize { throw refusingGaps }
        let blockSize = layout.blockSize
        let first = offset / blockSize, last = (end - 1) / blockSize
        let locked = exclusive ? 0 : lockStripes(first...last)
        defer { unlockStripes(locked) }

        var rangeStart = first
        do throws(FormatError) {
            var apart: UInt64?
            if oldSize > 0 {
                let oldFinal = (oldSize - 1) / blockSize
                if oldFinal < first {
                    // The old final block stays below the write: it becomes a full, non-final block.
                    // Next to the write it goes in the same pwrite; otherwise on its own, first.
                    if oldFinal + 1 == first { rangeStart = oldFinal } else { apart = oldFinal }
                }
            }
            if newSize > oldSize, UInt64(data.count) >= Self.reserveThreshold {
                // A large growing write gets its space first, so a full disk fails it before any
                // byte is written (no torn block); the blocks of a gap stay holes. Small ones skip
                // the call (about 8 µs on ext4, a file per call in an untar): if they fail
                // part-way, `keepStoredPrefix` below repairs them.
                if let apart { try reserve(apart...apart, size: newSize) }
                try reserve(rangeStart...last, size: newSize)
            }
            // Blocks between the old end and the write stay unwritten: holes, listed first.
            let oldBlocks = (oldSize + blockSize - 1) / blockSize
            if first > oldBlocks { try leaveHoles(oldBlocks..<first, oldSize: oldSize, newSize: newSize) }
            if let apart { try storeBlocks(apart...apart, oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0) }
            try storeBlocks(rangeStart...last, oldSize: oldSize, newSize: newSize, data: data, dataOffset: offset)
            filledHoles(first...last)
        } catch {
            // A write that fails part-way (the disk is full) may have stored some blocks and part
            // of one more: keep a file that reads cleanly. Growing: up to its new end; in place
            // (the kernel writes back pages in any order, so into holes too): holes stay holes.
            if case .io = error {
                if newSize > oldSize { keepStoredPrefix(oldSize: oldSize, attemptedSize: newSize) } else { repairTornBlocks(first...last) }
                let point = newSize > oldSize ? plaintextSize : first * blockSize
                failedAt.withLock { $0 = min($0 ?? point, point) }
            }
            throw error
        }
        plaintextSize = newSize
    }

    /// Sets the plaintext size. Growing leaves a hole (reads as zeros); the new final block is
    /// written so that the size stays authenticated.
    public func truncate(to newSize: UInt64) throws(FormatError) {
        guard newSize <= UInt64(Int64.max) / 2 else { throw .unsupported("a size past \(UInt64(Int64.max) / 2) bytes") }
        pthread_rwlock_wrlock(sizeLock)
        defer { pthread_rwlock_unlock(sizeLock) }
        refusingGaps = nil
        try resize(to: newSize)
    }

    /// `truncate` with the size lock held exclusively.
    func resize(to newSize: UInt64) throws(FormatError) {
        let oldSize = plaintextSize
        guard newSize != oldSize else { return }
        let blockSize = layout.blockSize
        if newSize == 0 {
            try storage.truncate(to: layout.headerLength)
            cutHoles(toSize: 0)
        } else if newSize < oldSize {
            let last = (newSize - 1) / blockSize
            try storeBlocks(last...last, oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0)
            try storage.truncate(to: layout.storedSize(plaintextSize: newSize))
            cutHoles(toSize: newSize)
            filledHoles(last...last)
        } else {
            let newFinal = (newSize - 1) / blockSize
            // Blocks between the old end and the new final block: holes.
            let oldBlocks = (oldSize + blockSize - 1) / blockSize
            if newFinal > oldBlocks { try leaveHoles(oldBlocks..<newFinal, oldSize: oldSize, newSize: newSize) }
            defer { filledHoles(newFinal...newFinal) }
            if oldSize == 0 {
                try storeBlocks(newFinal...newFinal, oldSize: 0, newSize: newSize, data: nil, dataOffset: 0)
            } else {
                let oldFinal = (oldSize - 1) / blockSize
                if newFinal <= oldFinal + 1 {
                    try storeBlocks(oldFinal...newFinal, oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0)
                } else {
                    try storeBlocks(oldFinal...oldFinal, oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0)
                    try storeBlocks(newFinal...newFinal, oldSize: oldSize, newSize: newSize, data: nil, dataOffset: 0)
                }
            }
        }
        plaintextSize = newSize
    }

    public func sync() throws(FormatError) { try storage.sync() }

    /// Encrypts blocks `range` of a file going from `oldSize` to `newSize` bytes (split across
    /// cores when the range is large), and stores them with one write. A block's plaintext is its old content (zero-extended to its new length)
    /// overlaid with the part of `data` (at `dataOffset`) that falls in it; blocks that `data`
    /// covers entirely are encrypted straight from it.
    func storeBlocks(_ range: ClosedRange<UInt64>, oldSize: UInt64, newSize: UInt64,
                     data: UnsafeRawBufferPointer?, dataOffset: UInt64) throws(FormatError) {
        let blockSize = layout.blockSize
        let newFinal = (newSize - 1) / blockSize
        let oldFinal: UInt64? = oldSize > 0 ? (oldSize - 1) / blockSize : nil
        let dataEnd = dataOffset + UInt64(data?.count ?? 0)
        let storedStart = layout.storedOffset(ofBlock: range.lowerBound)
        let storedCount = (range.upperBound - range.lowerBound) * layout.storedBlockSize
            + layout.plaintextLength(ofBlock: range.upperBound, fileSize: newSize) + UInt64(BlockLayout.overhead)
        try Self.storedBuffers.withBuffer(byteCount: Int(storedCount)) { (stored) throws(FormatError) in
            try processBlocks(range) { (blocks, worker) throws(FormatError) in
                // The nonces of all these blocks at once (see `Random`).
                let nonces = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(blocks.upperBound - blocks.lowerBound + 1) * AESGCMKey.nonceSize, alignment: 8)
                defer { nonces.deallocate() }
                do throws(CryptoError) { try Random.fill(nonces) } catch { throw .crypto(error) }
                for index in blocks {
                    let blockStart = index * blockSize
                    let newLength = layout.plaintextLength(ofBlock: index, fileSize: newSize)
                    let nonce = UnsafeRawBufferPointer(rebasing: nonces[(Int(index - blocks.lowerBound) * AESGCMKey.nonceSize)...].prefix(AESGCMKey.nonceSize))
                    let target = stored.baseAddress! + Int((index - range.lowerBound) * layout.storedBlockSize)
                    let coverStart = max(dataOffset, blockStart), coverEnd = min(dataEnd, blockStart + newLength)
                    let plaintext: UnsafeRawBufferPointer
                    if let data, coverStart == blockStart, coverEnd == blockStart + newLength {
                        plaintext = UnsafeRawBufferPointer(start: data.baseAddress! + Int(blockStart - dataOffset), count: Int(newLength))
                    } else {
                        var oldLength: UInt64 = 0
                        if let oldFinal, index <= oldFinal {
                            oldLength = index < oldFinal ? blockSize : oldSize - blockStart
                            try readStoredBlock(index, length: oldLength, final: index == oldFinal, worker: worker)
                        }
                        if newLength > oldLength {
                            (worker.plaintext + Int(oldLength)).initializeMemory(as: UInt8.self, repeating: 0, count: Int(newLength - oldLength))
                        }
                        if let data, coverStart < coverEnd {
                            (worker.plaintext + Int(coverStart - blockStart)).copyMemory(
                                from: data.baseAddress! + Int(coverStart - dataOffset), byteCount: Int(coverEnd - coverStart))
                        }
                        plaintext = UnsafeRawBufferPointer(start: worker.plaintext, count: Int(newLength))
                    }
                    do throws(CryptoError) {
                        try cipher.seal(worker.context, aad: worker.aad, index: index, final: index == newFinal,
                                        plaintext: plaintext, into: target, nonce: nonce)
                    } catch {
                        throw .crypto(error)
                    }
                }
            }
            // One write for the whole range: a buffered write holds the file's lock, so writes from
            // several parts would only wait for each other (measured: the parts spun on the lock).
            try storage.write(UnsafeRawBufferPointer(stored), at: storedStart)
        }
    }

    /// Reads and opens stored block `index` (its old plaintext is `length` bytes) into the worker's plaintext buffer.
    func readStoredBlock(_ index: UInt64, length: UInt64, final: Bool, worker: BlockWorker) throws(FormatError) {
        let count = Int(length) + BlockLayout.overhead
        let buffer = UnsafeMutableRawBufferPointer(start: worker.stored, count: count)
        let got = try storage.read(into: buffer, at: layout.storedOffset(ofBlock: index))
        guard got == count else { throw .corruptLength(layout.storedOffset(ofBlock: index) + UInt64(got)) }
        try openBlock(worker, index, final: final, UnsafeRawBufferPointer(buffer), into: worker.plaintext)
    }
}
