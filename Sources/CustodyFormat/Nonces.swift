import CustodyCrypto
import CustodySystem
import Glibc
import Synchronization

/// Random GCM nonces for block writes (and new files' IDs), drawn from OpenSSL's generator a batch
/// at a time.
///
/// One RAND_bytes call costs 0.6–0.8 µs on the project's machine whatever its length (the DRBG's
/// locking, fork check and parameter handling), as much as a third of encrypting a 4 KiB block.
/// Each thread keeps 4 KiB of its output and hands it out in order, so a block write pays a copy.
/// Every byte is handed out once. Nonces and file IDs are public (stored next to each block, and in
/// the header), so keeping the next ones in memory reveals nothing that the file will not show;
/// what matters is that they do not repeat, and a forked child discards its parent's batch.
enum Nonces {
    static let batchSize = 4096

    final class Batch {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: Nonces.batchSize, alignment: 16)
        /// Bytes already handed out; a batch starts empty.
        var used = Nonces.batchSize
        var generation: UInt64 = 0
        deinit { bytes.deallocate() }
    }

    fileprivate static let batches = PerThread { Batch() }
    /// Bumped in a forked child, so that no batch is used on both sides of a fork.
    static let forkGeneration: Atomic<UInt64> = {
        pthread_atfork(nil, nil) { Nonces.forkGeneration.wrappingAdd(1, ordering: .relaxed) }
        return Atomic<UInt64>(1)
    }()

    /// Fills `buffer` with fresh random bytes.
    static func fill(_ buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        guard let target = buffer.baseAddress, buffer.count > 0 else { return }
        guard buffer.count <= batchSize / 4 else {
            try Random.fill(buffer)
            return
        }
        let batch = batches.value
        let generation = forkGeneration.load(ordering: .relaxed)
        if batch.used + buffer.count > batchSize || batch.generation != generation {
            try Random.fill(batch.bytes)
            batch.used = 0
            batch.generation = generation
        }
        target.copyMemory(from: batch.bytes.baseAddress! + batch.used, byteCount: buffer.count)
        batch.used += buffer.count
    }
}

extension Nonces {
    /// Bytes of the calling thread's batch handed out so far (for tests).
    static var batchUsedForTests: Int? { batches.value.used }
}
