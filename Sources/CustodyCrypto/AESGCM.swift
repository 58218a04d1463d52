import COpenSSL
import Synchronization

/// AES-256-GCM, fetched once from OpenSSL's default provider.
nonisolated(unsafe) private let aes256GCM: OpaquePointer? = EVP_CIPHER_fetch(nil, "AES-256-GCM", nil)

/// An AES-256-GCM key and a pool of OpenSSL contexts already keyed with it.
///
/// EVP contexts are not thread-safe, and keying one costs about as much as sealing a 4 KiB
/// block. So each key keeps contexts keyed once; a thread takes one for a whole request
/// (`withContext`) and only resets the nonce per block. No allocation per block.
public final class AESGCMKey: @unchecked Sendable {
    public static let keySize = 32
    public static let nonceSize = 12
    public static let tagSize = 16

    /// An EVP context owned by the pool; only ever used by the thread that took it.
    fileprivate struct PooledContext: @unchecked Sendable { let pointer: OpaquePointer }

    private let key: SecretBytes
    /// The key bytes (for rewrapping a class key under a new passphrase).
    public var secret: SecretBytes { key }
    private let idle = Mutex<[PooledContext]>([])

    public init(_ key: SecretBytes) throws(CryptoError) {
        guard key.count == Self.keySize else {
            throw .invalidLength(what: "AES-256-GCM key", expected: Self.keySize, actual: key.count)
        }
        guard aes256GCM != nil else { throw .library("OpenSSL has no AES-256-GCM") }
        self.key = key
    }

    deinit {
        // EVP_CIPHER_CTX_free cleanses the context's copy of the key schedule.
        idle.withLock { $0.forEach { EVP_CIPHER_CTX_free($0.pointer) } }
    }

    /// Runs `body` with a context of this key that no other thread uses meanwhile.
    public func withContext<R>(_ body: (AESGCMContext) throws(CryptoError) -> R) throws(CryptoError) -> R {
        let context = try acquire()
        defer { idle.withLock { $0.append(context) } }
        return try body(AESGCMContext(context: context.pointer))
    }

    /// Lends a context until the lease is released (for work that spans many blocks and throws
    /// errors of its own).
    public func lease() throws(CryptoError) -> AESGCMLease {
        AESGCMLease(key: self, pooled: try acquire())
    }

    fileprivate func giveBack(_ context: PooledContext) {
        idle.withLock { $0.append(context) }
    }

    /// Seals one message (for one-off uses such as key wrapping).
    public func seal(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                     ciphertext: UnsafeMutableRawPointer, tag: UnsafeMutableRawPointer) throws(CryptoError) {
        try withContext { (context) throws(CryptoError) in
            try context.seal(nonce: nonce, aad: aad, plaintext: plaintext, ciphertext: ciphertext, tag: tag)
        }
    }

    /// Opens one message; throws `authenticationFailed` when the tag does not verify.
    public func open(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                     tag: UnsafeRawPointer, plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        try withContext { (context) throws(CryptoError) in
            try context.open(nonce: nonce, aad: aad, ciphertext: ciphertext, tag: tag, plaintext: plaintext)
        }
    }

    fileprivate func acquire() throws(CryptoError) -> PooledContext {
        if let context = idle.withLock({ $0.popLast() }) { return context }
        guard let context = EVP_CIPHER_CTX_new() else { throw .library("EVP_CIPHER_CTX_new failed") }
        let keyed = key.withUnsafeBytes {
            EVP_CipherInit_ex2(context, aes256GCM, $0.baseAddress?.assumingMemoryBound(to: UInt8.self), nil, 1, nil)
        }
        guard keyed == 1 else {
            EVP_CIPHER_CTX_free(context)
            throw .library("EVP_CipherInit_ex2 refused the key")
        }
        return PooledContext(pointer: context)
    }
}

/// A keyed AES-256-GCM context lent to one thread for the length of a `withContext` call.
public struct AESGCMContext {
    let context: OpaquePointer

    /// Encrypts `plaintext` into `ciphertext` (same length) and writes the 16-byte tag.
    public func seal(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                     ciphertext: UnsafeMutableRawPointer, tag: UnsafeMutableRawPointer) throws(CryptoError) {
        try start(nonce: nonce, aad: aad, encrypt: true)
        var written: Int32 = 0
        if plaintext.count > 0 {
            guard EVP_EncryptUpdate(context, ciphertext.assumingMemoryBound(to: UInt8.self), &written,
                                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(plaintext.count)) == 1,
                  Int(written) == plaintext.count else {
                throw .library("EVP_EncryptUpdate failed")
            }
        }
        guard EVP_EncryptFinal_ex(context, ciphertext.assumingMemoryBound(to: UInt8.self) + plaintext.count, &written) == 1,
              EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_GET_TAG, Int32(AESGCMKey.tagSize), tag) == 1 else {
            throw .library("EVP_EncryptFinal_ex failed")
        }
    }

    /// Decrypts `ciphertext` into `plaintext` (same length) if `tag` verifies. On failure the
    /// plaintext buffer is zeroed, so unauthenticated bytes never leave this call.
    public func open(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                     tag: UnsafeRawPointer, plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        try start(nonce: nonce, aad: aad, encrypt: false)
        var written: Int32 = 0
        if ciphertext.count > 0 {
            guard EVP_DecryptUpdate(context, plaintext.assumingMemoryBound(to: UInt8.self), &written,
                                    ciphertext.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(ciphertext.count)) == 1 else {
                plaintext.initializeMemory(as: UInt8.self, repeating: 0, count: ciphertext.count)
                throw .library("EVP_DecryptUpdate failed")
            }
        }
        guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_SET_TAG, Int32(AESGCMKey.tagSize), UnsafeMutableRawPointer(mutating: tag)) == 1 else {
            throw .library("cannot set the GCM tag")
        }
        guard EVP_DecryptFinal_ex(context, plaintext.assumingMemoryBound(to: UInt8.self) + ciphertext.count, &written) == 1 else {
            plaintext.initializeMemory(as: UInt8.self, repeating: 0, count: ciphertext.count)
            throw .authenticationFailed
        }
    }

    private func start(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, encrypt: Bool) throws(CryptoError) {
        guard nonce.count == AESGCMKey.nonceSize else {
            throw .invalidLength(what: "GCM nonce", expected: AESGCMKey.nonceSize, actual: nonce.count)
        }
        guard EVP_CipherInit_ex2(context, nil, nil, nonce.baseAddress?.assumingMemoryBound(to: UInt8.self), encrypt ? 1 : 0, nil) == 1 else {
            throw .library("EVP_CipherInit_ex2 refused the nonce")
        }
        if aad.count > 0 {
            var written: Int32 = 0
            guard EVP_CipherUpdate(context, nil, &written, aad.baseAddress?.assumingMemoryBound(to: UInt8.self), Int32(aad.count)) == 1 else {
                throw .library("EVP_CipherUpdate (associated data) failed")
            }
        }
    }
}

/// A context of an `AESGCMKey`, returned to the key's pool when the lease goes away.
public final class AESGCMLease {
    private let key: AESGCMKey
    private let pooled: AESGCMKey.PooledContext
    public let context: AESGCMContext

    fileprivate init(key: AESGCMKey, pooled: AESGCMKey.PooledContext) {
        self.key = key
        self.pooled = pooled
        self.context = AESGCMContext(context: pooled.pointer)
    }

    deinit { key.giveBack(pooled) }
}
