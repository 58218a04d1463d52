import COpenSSL

/// An AES-256-GCM key, for the system's libcrypto (OpenSSL 3, through EVP).
///
/// The key's bytes live in secure memory; OpenSSL's cipher contexts for it are made per thread on
/// first use and reused for every later message (`custody_gcm` in `COpenSSL`), so a message pays
/// the cipher, not a key schedule, and a context one thread uses is never pulled over to another.
/// Their expanded key schedules are in OpenSSL's memory, which OpenSSL clears when the key goes.
/// Any number of threads may seal and open with a key at once.
public final class AESGCMKey: @unchecked Sendable {
    public static let keySize = 32
    public static let nonceSize = 12
    public static let tagSize = 16

    private let key: SecretBytes
    /// The key bytes (for rewrapping a class key under a new passphrase).
    public var secret: SecretBytes { key }
    /// The keyed contexts, for as long as this key lives.
    public let context: AESGCMContext

    public init(_ key: SecretBytes) throws(CryptoError) {
        guard key.count == Self.keySize else {
            throw .invalidLength(what: "AES-256-GCM key", expected: Self.keySize, actual: key.count)
        }
        guard let contexts = custody_gcm_new(key.pointer.assumingMemoryBound(to: UInt8.self)) else {
            throw .library("OpenSSL offers no AES-256-GCM (EVP_CIPHER_fetch found none in the loaded providers)")
        }
        self.key = key
        context = AESGCMContext(contexts: contexts)
    }

    deinit {
        // Before `key`'s secure memory is zeroed and freed: the contexts read it when made.
        custody_gcm_free(context.contexts)
    }

    /// Seals one message (for one-off uses such as key wrapping).
    public func seal(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                     ciphertext: UnsafeMutableRawPointer, tag: UnsafeMutableRawPointer) throws(CryptoError) {
        try context.seal(nonce: nonce, aad: aad, plaintext: plaintext, ciphertext: ciphertext, tag: tag)
    }

    /// Opens one message; throws `authenticationFailed` when the tag does not verify.
    public func open(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                     tag: UnsafeRawPointer, plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        try context.open(nonce: nonce, aad: aad, ciphertext: ciphertext, tag: tag, plaintext: plaintext)
    }
}

/// The keyed contexts of an `AESGCMKey`: a plain pointer (no reference counting), for loops over
/// blocks and for work that must hold no references (see `ProtectedFile`'s mapped reads). Valid
/// while its key lives; any number of threads may use it at once.
public struct AESGCMContext: @unchecked Sendable {
    let contexts: OpaquePointer

    /// Encrypts `plaintext` into `ciphertext` (same length; the same buffer or a disjoint one) and
    /// writes the 16-byte tag.
    public func seal(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, plaintext: UnsafeRawBufferPointer,
                     ciphertext: UnsafeMutableRawPointer, tag: UnsafeMutableRawPointer) throws(CryptoError) {
        try check(nonce)
        let sealed = custody_gcm_seal(contexts, bytes(nonce), bytes(aad), aad.count, bytes(plaintext), plaintext.count,
                                      ciphertext.assumingMemoryBound(to: UInt8.self), tag.assumingMemoryBound(to: UInt8.self))
        guard sealed == 1 else { throw .library("AES-256-GCM sealing failed in OpenSSL") }
    }

    /// Decrypts `ciphertext` into `plaintext` (same length; the same buffer or a disjoint one) if
    /// `tag` verifies. On failure the plaintext buffer is zeroed, so unauthenticated bytes never
    /// leave this call.
    public func open(nonce: UnsafeRawBufferPointer, aad: UnsafeRawBufferPointer, ciphertext: UnsafeRawBufferPointer,
                     tag: UnsafeRawPointer, plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        try check(nonce)
        let opened = custody_gcm_open(contexts, bytes(nonce), bytes(aad), aad.count, bytes(ciphertext), ciphertext.count,
                                      tag.assumingMemoryBound(to: UInt8.self), plaintext.assumingMemoryBound(to: UInt8.self))
        guard opened == 1 else { throw .authenticationFailed }
    }

    private func check(_ nonce: UnsafeRawBufferPointer) throws(CryptoError) {
        guard nonce.count == AESGCMKey.nonceSize else {
            throw .invalidLength(what: "GCM nonce", expected: AESGCMKey.nonceSize, actual: nonce.count)
        }
    }

    private func bytes(_ buffer: UnsafeRawBufferPointer) -> UnsafePointer<UInt8>? {
        buffer.baseAddress?.assumingMemoryBound(to: UInt8.self)
    }
}
