import CSodium

/// libsodium's sealed box (X25519 + XSalsa20-Poly1305, an ephemeral sender key): anyone may seal
/// to a public key, only the holder of its secret key opens. Used to escrow recovery keys to an
/// administrator.
public enum SealedBox {
    public static let publicKeySize = Int(crypto_box_PUBLICKEYBYTES)
    public static let secretKeySize = Int(crypto_box_SECRETKEYBYTES)
    public static let overhead = Int(crypto_box_sealbytes())

    /// A new key pair: the public key, and the secret key in secure memory.
    public static func keyPair() throws(CryptoError) -> (publicKey: [UInt8], secretKey: SecretBytes) {
        var publicKey = [UInt8](repeating: 0, count: publicKeySize)
        let secretKey = try SecretBytes(count: secretKeySize)
        guard crypto_box_keypair(&publicKey, secretKey.pointer.assumingMemoryBound(to: UInt8.self)) == 0 else {
            throw .library("crypto_box_keypair failed")
        }
        return (publicKey, secretKey)
    }

    public static func seal(_ message: SecretBytes, to publicKey: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard publicKey.count == publicKeySize else { throw .invalidLength(what: "sealed box public key", expected: publicKeySize, actual: publicKey.count) }
        var sealed = [UInt8](repeating: 0, count: message.count + overhead)
        let result = crypto_box_seal(&sealed, message.pointer.assumingMemoryBound(to: UInt8.self), UInt64(message.count), publicKey)
        guard result == 0 else { throw .invalidPublicKey }
        return sealed
    }

    /// Opens a sealed box; `authenticationFailed` when it was not sealed to this key or was changed.
    public static func open(_ sealed: [UInt8], publicKey: [UInt8], secretKey: SecretBytes) throws(CryptoError) -> SecretBytes {
        guard publicKey.count == publicKeySize else { throw .invalidLength(what: "sealed box public key", expected: publicKeySize, actual: publicKey.count) }
        guard secretKey.count == secretKeySize else { throw .invalidLength(what: "sealed box secret key", expected: secretKeySize, actual: secretKey.count) }
        guard sealed.count > overhead else { throw .invalidLength(what: "sealed box", expected: overhead + 1, actual: sealed.count) }
        let message = try SecretBytes(count: sealed.count - overhead)
        let result = crypto_box_seal_open(message.pointer.assumingMemoryBound(to: UInt8.self), sealed, UInt64(sealed.count), publicKey,
                                          secretKey.pointer.assumingMemoryBound(to: UInt8.self))
        guard result == 0 else { throw .authenticationFailed }
        return message
    }
}
