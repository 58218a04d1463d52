import COpenSSL
import CustodySystem
import Glibc
import Synchronization

/// Non-secret randomness: GCM nonces, key-wrap nonces, salts, file IDs. (Secret keys use
/// `SecretBytes.random`.)
///
/// Drawn from OpenSSL's generator a batch at a time. One call to a generator costs a fixed price
/// whatever its length (`RAND_bytes` took 0.6–0.8 µs in a loop on the project's machine, and
/// 4–8 µs inside the daemon, where its code and locks are cold): as much as
/// encrypting a 4 KiB block, or a tenth of creating a file. Each thread keeps 4 KiB of its output
/// and hands it out in order, so a request of up to 1 KiB pays a copy; larger ones go to the
/// generator. Every byte is handed out once. What comes from here is public (stored next to each
/// block, in headers, next to wrapped keys), so keeping the next bytes in memory reveals nothing
/// that the files will not show; what matters is that they do not repeat, and a forked child
/// discards its parent's batch.
public enum Random {
    static let batchSize = 4096

    final class Batch {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: Random.batchSize, alignment: 16)
        /// Bytes already handed out; a batch starts empty.
        var used = Random.batchSize
        var generation: UInt64 = 0
        deinit { bytes.deallocate() }
    }

    static let batches = PerThread { Batch() }
    /// Bumped in a forked child, so that no batch is used on both sides of a fork.
    static let forkGeneration: Atomic<UInt64> = {
        pthread_atfork(nil, nil) { Random.forkGeneration.wrappingAdd(1, ordering: .relaxed) }
        return Atomic<UInt64>(1)
    }()

    /// Fills `buffer` with fresh random bytes.
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        guard let target = buffer.baseAddress, buffer.count > 0 else { return }
        guard buffer.count <= batchSize / 4 else {
            try generate(buffer)
            return
        }
        let batch = batches.value
        let generation = forkGeneration.load(ordering: .relaxed)
        if batch.used + buffer.count > batchSize || batch.generation != generation {
            try generate(batch.bytes)
            batch.used = 0
            batch.generation = generation
        }
        target.copyMemory(from: batch.bytes.baseAddress! + batch.used, byteCount: buffer.count)
        batch.used += buffer.count
    }

    public static func bytes(_ count: Int) throws(CryptoError) -> [UInt8] {
        guard count > 0 else { return [] }
        var result = [UInt8](repeating: 0, count: count)
        try result.withMutableBytes { (buffer) throws(CryptoError) in try fill(buffer) }
        return result
    }

    /// Straight from OpenSSL's generator (its per-thread DRBGs, seeded from the kernel's
    /// `getrandom` and reseeded after a fork; with the FIPS provider, its approved DRBG).
    private static func generate(_ buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        guard let base = buffer.baseAddress, let count = Int32(exactly: buffer.count) else { return }
        guard RAND_bytes(base.assumingMemoryBound(to: UInt8.self), count) == 1 else {
            ERR_clear_error()
            throw .library("RAND_bytes failed")
        }
    }
}

extension Random {
    /// Bytes of the calling thread's batch handed out so far (for tests).
    static var batchUsedForTests: Int { batches.value.used }
}

/// Constant-time comparison of two byte buffers (false when the lengths differ).
public func constantTimeEquals(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    guard a.count == b.count else { return false }
    guard a.count > 0 else { return true }
    return CRYPTO_memcmp(a.baseAddress, b.baseAddress, a.count) == 0
}

/// SHA-256 of a buffer (OpenSSL's, with the calling thread's digest context).
public func sha256(_ data: UnsafeRawBufferPointer) -> [UInt8] {
    var digest = [UInt8](repeating: 0, count: 32)
    let done = digest.withUnsafeMutableBufferPointer { out in custody_sha256(data.baseAddress, data.count, out.baseAddress) }
    // Only an OpenSSL without SHA-256 in its providers fails: what is returned then matches
    // nothing a digest was compared with.
    if done != 1, let noise = try? Random.bytes(32) { return noise }
    return digest
}
