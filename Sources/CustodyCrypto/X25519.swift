import CSodium

/// X25519 key agreement (libsodium `crypto_scalarmult_curve25519`).
public enum X25519 {
    public static let keySize = 32

    /// A new private key (random; clamped by the scalar multiplication).
    public static func generatePrivateKey() throws(CryptoError) -> SecretBytes {
        try SecretBytes.random(count: keySize)
    }

    public static func publicKey(for privateKey: SecretBytes) throws(CryptoError) -> [UInt8] {
        guard privateKey.count == keySize else { throw .invalidLength(what: "X25519 private key", expected: keySize, actual: privateKey.count) }
        var publicKey = [UInt8](repeating: 0, count: keySize)
        let result = crypto_scalarmult_curve25519_base(&publicKey, privateKey.pointer.assumingMemoryBound(to: UInt8.self))
        guard result == 0 else { throw .library("crypto_scalarmult_curve25519_base failed") }
        return publicKey
    }

    /// The shared secret; `invalidPublicKey` for a low-order point (an all-zero result).
    public static func sharedSecret(privateKey: SecretBytes, publicKey: [UInt8]) throws(CryptoError) -> SecretBytes {
        guard publicKey.count == keySize else { throw .invalidLength(what: "X25519 public key", expected: keySize, actual: publicKey.count) }
        guard privateKey.count == keySize else { throw .invalidLength(what: "X25519 private key", expected: keySize, actual: privateKey.count) }
        let shared = try SecretBytes(count: keySize)
        let result = crypto_scalarmult_curve25519(shared.pointer.assumingMemoryBound(to: UInt8.self),
                                                  privateKey.pointer.assumingMemoryBound(to: UInt8.self), publicKey)
        guard result == 0 else { throw .invalidPublicKey }
        return shared
    }
}
