import CustodySystem

/// Failures of the crypto core. None of them carries key material.
public enum CryptoError: Error, Equatable, Sendable, CustomStringConvertible {
    /// An AEAD tag did not verify: wrong key, or the data or its associated data changed.
    case authenticationFailed
    /// A key, nonce or buffer of the wrong size.
    case invalidLength(what: String, expected: Int, actual: Int)
    /// A public key that yields no shared secret (a low-order point).
    case invalidPublicKey
    /// Argon2id could not run with these parameters (usually: not enough memory).
    case keyDerivationFailed
    /// libsodium or OpenSSL could not be initialised or refused a call.
    case library(String)

    public var description: String {
        switch self {
        case .authenticationFailed: return "authentication failed (wrong key or modified data)"
        case .invalidLength(let what, let expected, let actual): return "\(what) must be \(expected) bytes, not \(actual)"
        case .invalidPublicKey: return "invalid public key"
        case .keyDerivationFailed: return "key derivation failed"
        case .library(let detail): return "crypto library error: \(detail)"
        }
    }
}

extension CryptoError: ErrnoConvertible {
    /// A file system caller sees EIO: whatever failed, the data cannot be served as it is.
    public var errnoValue: Errno { .ioError }
}
