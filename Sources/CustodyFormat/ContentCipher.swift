import CustodyCrypto

/// Encryption of one file's content blocks: AES-256-GCM with a key derived from the file key,
/// and associated data `file ID (16) ‖ block index (8, LE) ‖ final flag (1)`.
final class ContentCipher: @unchecked Sendable {
    static let aadSize = 25
    static let info = Array("custody/v1/content".utf8)

    let key: AESGCMKey
    let fileID: [UInt8]

    init(fileKey: SecretBytes, fileID: [UInt8]) throws(FormatError) {
        do {
            key = try AESGCMKey(try HKDF.derive(.sha256, key: fileKey, salt: fileID, info: Self.info, count: 32))
        } catch {
            throw .crypto(error)
        }
        self.fileID = fileID
    }

    /// Writes the associated data of a block into `aad` (25 bytes).
    func fillAAD(_ aad: UnsafeMutableRawPointer, index: UInt64, final: Bool) {
        fileID.withUnsafeBytes { aad.copyMemory(from: $0.baseAddress!, byteCount: 16) }
        for byte in 0..<8 { aad.storeBytes(of: UInt8(truncatingIfNeeded: index >> (8 * byte)), toByteOffset: 16 + byte, as: UInt8.self) }
        aad.storeBytes(of: final ? 1 : 0, toByteOffset: 24, as: UInt8.self)
    }

    /// Seals `plaintext` as block `index` into `stored` (`plaintext.count + 28` bytes) with `nonce`:
    /// fresh random bytes for every block write (fixed only in test vectors).
    func seal(_ context: AESGCMContext, aad: UnsafeMutableRawPointer, index: UInt64, final: Bool,
              plaintext: UnsafeRawBufferPointer, into stored: UnsafeMutableRawPointer, nonce source: UnsafeRawBufferPointer) throws(CryptoError) {
        guard source.count == AESGCMKey.nonceSize else {
            throw .invalidLength(what: "GCM nonce", expected: AESGCMKey.nonceSize, actual: source.count)
        }
        let nonce = UnsafeMutableRawBufferPointer(start: stored, count: AESGCMKey.nonceSize)
        nonce.copyMemory(from: source)
        fillAAD(aad, index: index, final: final)
        try context.seal(nonce: UnsafeRawBufferPointer(nonce), aad: UnsafeRawBufferPointer(start: aad, count: Self.aadSize),
                         plaintext: plaintext, ciphertext: stored + AESGCMKey.nonceSize,
                         tag: stored + AESGCMKey.nonceSize + plaintext.count)
    }

    /// Opens stored block `index` (`nonce ‖ ciphertext ‖ tag`) into `plaintext`.
    func open(_ context: AESGCMContext, aad: UnsafeMutableRawPointer, index: UInt64, final: Bool,
              stored: UnsafeRawBufferPointer, into plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        let length = stored.count - BlockLayout.overhead
        guard length > 0, let base = stored.baseAddress else { throw .invalidLength(what: "stored block", expected: BlockLayout.overhead + 1, actual: stored.count) }
        fillAAD(aad, index: index, final: final)
        try Self.open(context, aad: aad, stored: base, length: length, into: plaintext)
    }

    /// Opens the stored block at `stored` (`nonce ‖ ciphertext ‖ tag`, `length` bytes of
    /// ciphertext) with associated data already in `aad`. Holds no references and allocates
    /// nothing, so work under `FileMapping.guarded` may call it.
    static func open(_ context: AESGCMContext, aad: UnsafeRawPointer, stored: UnsafeRawPointer, length: Int,
                     into plaintext: UnsafeMutableRawPointer) throws(CryptoError) {
        try context.open(nonce: UnsafeRawBufferPointer(start: stored, count: AESGCMKey.nonceSize),
                         aad: UnsafeRawBufferPointer(start: aad, count: aadSize),
                         ciphertext: UnsafeRawBufferPointer(start: stored + AESGCMKey.nonceSize, count: length),
                         tag: stored + AESGCMKey.nonceSize + length, plaintext: plaintext)
    }
}
