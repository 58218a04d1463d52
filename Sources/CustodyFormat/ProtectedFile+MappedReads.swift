import CustodyCrypto
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Reads through a mapping of the stored file, each block opened under a SIGBUS guard: the
/// pieces a reviewer reads together (see `FileMapping.guarded`).
extension ProtectedFile {
    /// Decrypts blocks `range` straight out of a mapping of the storage (no `pread`, no copy into a
    /// buffer first), for requests under 256 KiB of files of at least `mappingThreshold` bytes:
    /// random access (a database, a disk image). Large requests keep `pread`: measured right after a
    /// large write, a 512 MiB sequential read through the mapping took 1.0–1.6 s against 0.64 s
    /// with `pread` and the read-ahead hint (its page faults waited on the disk one by one).
    /// False when the storage cannot be mapped, or when a block does not open from the mapping —
    /// stored bytes that are not there (the file was cut underneath: the guard caught the SIGBUS),
    /// a hole, a truncation, tampering — and the caller then reads with `pread`, which tells those
    /// apart.
    func readMapped(_ range: ClosedRange<UInt64>, into out: UnsafeMutableRawPointer, from offset: UInt64, to end: UInt64,
                    fileSize size: UInt64, storedEnd: UInt64) throws(FormatError) -> Bool {
        guard size >= Self.mappingThreshold, let mapped = mapping(covering: storedEnd, fileSize: size) else { return false }
        let finalBlock = (size - 1) / layout.blockSize
        let failed = FailureFlag()
        try processBlocks(range) { (blocks, worker) throws(FormatError) in
            for index in blocks {
                let stored = mapped.base + Int(layout.storedOffset(ofBlock: index))
                let count = Int(layout.plaintextLength(ofBlock: index, fileSize: size))
                cipher.fillAAD(worker.aad, index: index, final: index == finalBlock)
                var opened = false
                try deliver(index, of: worker, from: offset, to: end, into: out, fileSize: size) { (plaintext) throws(FormatError) in
                    var job = MappedBlock(context: worker.context, aad: worker.aad, stored: stored, count: count, plaintext: plaintext)
                    opened = FileMapping.guarded(openMappedBlock, &job) && job.opened
                    // Nothing decrypted from a block that did not verify leaves this call.
                    if !opened { plaintext.initializeMemory(as: UInt8.self, repeating: 0, count: count) }
                }
                if !opened {
                    failed.raise()
                    return
                }
            }
        }
        return !failed.raised
    }

    /// The storage's mapping if it covers `storedEnd` bytes: made at the first mapped read, twice
    /// the stored size so that the file can grow into it, replaced when a read needs more (readers
    /// hold their own reference, so a replaced mapping stays valid for them).
    func mapping(covering storedEnd: UInt64, fileSize: UInt64) -> FileMapping? {
        mapping.withLock { state in
            if let mapped = state.mapping, mapped.contains(offset: 0, count: Int(storedEnd)) { return mapped }
            guard !state.unavailable else { return nil }
            let stored = layout.storedSize(plaintextSize: fileSize)
            guard stored <= UInt64(Int.max) / 4, let fresh = storage.map(length: Int(max(stored, storedEnd) * 2)) else {
                state.unavailable = true
                return nil
            }
            state.mapping = fresh
            return fresh
        }
    }
}

/// One block for `openMappedBlock`: trivial values only (see `FileMapping.guarded`).
struct MappedBlock {
    let context: AESGCMContext
    let aad: UnsafeMutableRawPointer
    let stored: UnsafeRawPointer
    let count: Int
    let plaintext: UnsafeMutableRawPointer
    var opened = false
}

/// Opens a block that lies in a mapping. Runs under the SIGBUS guard, which may abandon it while
/// BoringSSL reads the mapped nonce, ciphertext or tag: it holds no references and allocates
/// nothing until the decryption is over, and the cipher context is only ever read (each call
/// keeps its state on its own stack), so abandoning a call leaves nothing to repair.
private let openMappedBlock: @convention(c) (UnsafeMutableRawPointer?) -> Void = { raw in
    guard let job = raw?.assumingMemoryBound(to: MappedBlock.self) else { return }
    do throws(CryptoError) {
        try ContentCipher.open(job.pointee.context, aad: job.pointee.aad, stored: job.pointee.stored, length: job.pointee.count,
                               into: job.pointee.plaintext)
        job.pointee.opened = true
    } catch {
        job.pointee.opened = false
    }
}

/// Raised by any part of a request that met a block it could not open from the mapping.
final class FailureFlag: Sendable {
    let value = Atomic<Bool>(false)
    func raise() { value.store(true, ordering: .relaxed) }
    var raised: Bool { value.load(ordering: .relaxed) }
}
