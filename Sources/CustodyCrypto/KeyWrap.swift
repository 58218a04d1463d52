/// Wraps 32-byte keys with AES-256-GCM: `nonce (12) ‖ ciphertext (32) ‖ tag (16)`, 60 bytes.
///
/// An AEAD wrap rather than RFC 3394: the associated data binds the wrapped key to its context
/// (for file keys: every header field before the wrap), so moving a wrapped key to another
/// header, owner or class fails to unwrap. The nonce is random (96 bits); a wrapping key wraps at
/// most one key per file or class key, far below the 2^32 limit for random GCM nonces.
public enum KeyWrap {
    public static let keySize = 32
    public static let wrappedSize = AESGCMKey.nonceSize + keySize + AESGCMKey.tagSize

    /// `nonce` is for reproducible test vectors only; leave it nil (random) everywhere else.
    public static func wrap(_ key: SecretBytes, with wrappingKey: AESGCMKey, context: UnsafeRawBufferPointer, nonce fixedNonce: [UInt8]? = nil) throws(CryptoError) -> [UInt8] {
        guard key.count == keySize else { throw .invalidLength(what: "wrapped key", expected: keySize, actual: key.count) }
        let out = UnsafeMutableRawBufferPointer.allocate(byteCount: wrappedSize, alignment: 8)
        defer { out.deallocate() }
        let base = out.baseAddress!
        let nonce = UnsafeMutableRawBufferPointer(start: base, count: AESGCMKey.nonceSize)
        if let fixedNonce {
            guard fixedNonce.count == AESGCMKey.nonceSize else {
                throw .invalidLength(what: "wrap nonce", expected: AESGCMKey.nonceSize, actual: fixedNonce.count)
            }
            nonce.copyBytes(from: fixedNonce)
        } else {
            try Random.fill(nonce)
        }
        try wrappingKey.seal(nonce: UnsafeRawBufferPointer(nonce), aad: context,
                             plaintext: UnsafeRawBufferPointer(start: key.pointer, count: keySize),
                             ciphertext: base + AESGCMKey.nonceSize, tag: base + AESGCMKey.nonceSize + keySize)
        return Array(out.bindMemory(to: UInt8.self))
    }

    /// Unwraps straight into secure memory; `authenticationFailed` for a wrong key or context.
    public static func unwrap(_ wrapped: UnsafeRawBufferPointer, with wrappingKey: AESGCMKey, context: UnsafeRawBufferPointer) throws(CryptoError) -> SecretBytes {
        guard wrapped.count == wrappedSize, let base = wrapped.baseAddress else {
            throw .invalidLength(what: "wrapped key", expected: wrappedSize, actual: wrapped.count)
        }
        let key = try SecretBytes(count: keySize)
        try wrappingKey.open(nonce: UnsafeRawBufferPointer(start: base, count: AESGCMKey.nonceSize), aad: context,
                             ciphertext: UnsafeRawBufferPointer(start: base + AESGCMKey.nonceSize, count: keySize),
                             tag: base + AESGCMKey.nonceSize + keySize, plaintext: key.pointer)
        return key
    }
}
