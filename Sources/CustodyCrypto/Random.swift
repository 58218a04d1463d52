import COpenSSL
import CSodium

/// Non-secret randomness: nonces, salts, file IDs. (Secret keys use `SecretBytes.random`.)
/// OpenSSL's per-thread DRBG, so filling many block nonces costs no syscall each.
public enum Random {
    public static func fill(_ buffer: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        guard buffer.count > 0 else { return }
        guard RAND_bytes(buffer.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(buffer.count)) == 1 else {
            throw .library("RAND_bytes failed")
        }
    }

    public static func bytes(_ count: Int) throws(CryptoError) -> [UInt8] {
        guard count > 0 else { return [] }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count, alignment: 1)
        defer { buffer.deallocate() }
        try fill(buffer)
        return Array(buffer.bindMemory(to: UInt8.self))
    }
}

/// Constant-time comparison of two byte buffers (false when the lengths differ).
public func constantTimeEquals(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
    guard a.count == b.count else { return false }
    guard a.count > 0 else { return true }
    return CRYPTO_memcmp(a.baseAddress, b.baseAddress, a.count) == 0
}

/// SHA-256 of a buffer.
public func sha256(_ data: UnsafeRawBufferPointer) -> [UInt8] {
    var digest = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    _ = EVP_Digest(data.baseAddress, data.count, &digest, &length, EVP_sha256(), nil)
    return digest
}
