import COpenSSL
import CSodium

nonisolated(unsafe) private let hkdfAlgorithm: OpaquePointer? = EVP_KDF_fetch(nil, "HKDF", nil)

/// OSSL_PARAM keeps the pointer to its key name, so names must outlive the call: static literals.
private func parameterName(_ name: StaticString) -> UnsafePointer<CChar> {
    UnsafeRawPointer(name.utf8Start).assumingMemoryBound(to: CChar.self)
}

/// HKDF (RFC 5869) through OpenSSL's EVP_KDF.
public enum HKDF {
    public enum Digest: String, Sendable {
        case sha256 = "SHA256"
        case sha512 = "SHA512"
    }

    /// Derives `count` secret bytes from `key`, bound to `salt` and `info`.
    public static func derive(_ digest: Digest = .sha256, key: SecretBytes, salt: [UInt8], info: [UInt8], count: Int) throws(CryptoError) -> SecretBytes {
        let output = try SecretBytes(count: count)
        try key.withUnsafeBytes { (ikm) throws(CryptoError) in
            try output.withUnsafeMutableBytes { (out) throws(CryptoError) in
                try derive(digest, key: ikm, salt: salt, info: info, into: out)
            }
        }
        return output
    }

    /// The same, from non-secret or caller-held key bytes into a caller's buffer.
    public static func derive(_ digest: Digest, key: UnsafeRawBufferPointer, salt: [UInt8], info: [UInt8], into output: UnsafeMutableRawBufferPointer) throws(CryptoError) {
        guard let hkdfAlgorithm, let context = EVP_KDF_CTX_new(hkdfAlgorithm) else { throw .library("OpenSSL has no HKDF") }
        defer { EVP_KDF_CTX_free(context) }
        var digestName = Array(digest.rawValue.utf8CString)
        var salt = salt
        var info = info
        let result: Int32 = digestName.withUnsafeMutableBufferPointer { name in
            salt.withUnsafeMutableBytes { saltBytes in
                info.withUnsafeMutableBytes { infoBytes in
                    // An empty salt or info is left out: RFC 5869 treats a missing salt as zeros.
                    var params = [
                        OSSL_PARAM_construct_utf8_string(parameterName("digest"), name.baseAddress, 0),
                        OSSL_PARAM_construct_octet_string(parameterName("key"), UnsafeMutableRawPointer(mutating: key.baseAddress), key.count),
                    ]
                    if saltBytes.count > 0 {
                        params.append(OSSL_PARAM_construct_octet_string(parameterName("salt"), saltBytes.baseAddress, saltBytes.count))
                    }
                    if infoBytes.count > 0 {
                        params.append(OSSL_PARAM_construct_octet_string(parameterName("info"), infoBytes.baseAddress, infoBytes.count))
                    }
                    params.append(OSSL_PARAM_construct_end())
                    return EVP_KDF_derive(context, output.baseAddress?.assumingMemoryBound(to: UInt8.self), output.count, &params)
                }
            }
        }
        guard result == 1 else { throw .library("HKDF derivation failed") }
    }
}

/// Argon2id cost parameters and salt; stored next to what they protect, so the derivation can be
/// repeated and the cost raised later.
public struct Argon2Parameters: Codable, Equatable, Sendable {
    public var opsLimit: UInt64
    public var memLimit: UInt64
    public var salt: [UInt8]

    public static let saltSize = Int(crypto_pwhash_saltbytes())

    /// libsodium's "interactive" limits (about 50 ms here), with a fresh salt.
    public static func interactive() throws(CryptoError) -> Argon2Parameters {
        Argon2Parameters(opsLimit: UInt64(crypto_pwhash_opslimit_interactive()), memLimit: UInt64(crypto_pwhash_memlimit_interactive()), salt: try Random.bytes(saltSize))
    }

    /// libsodium's "moderate" limits (about 0.5 s here), with a fresh salt.
    public static func moderate() throws(CryptoError) -> Argon2Parameters {
        Argon2Parameters(opsLimit: UInt64(crypto_pwhash_opslimit_moderate()), memLimit: UInt64(crypto_pwhash_memlimit_moderate()), salt: try Random.bytes(saltSize))
    }

    public init(opsLimit: UInt64, memLimit: UInt64, salt: [UInt8]) {
        self.opsLimit = opsLimit
        self.memLimit = memLimit
        self.salt = salt
    }
}

/// Argon2id (libsodium `crypto_pwhash`, ARGON2ID13).
public enum Argon2id {
    public static func derive(passphrase: SecretBytes, parameters: Argon2Parameters, count: Int = 32) throws(CryptoError) -> SecretBytes {
        guard sodiumReady else { throw .library("libsodium could not be initialised") }
        guard parameters.salt.count == Argon2Parameters.saltSize else {
            throw .invalidLength(what: "Argon2id salt", expected: Argon2Parameters.saltSize, actual: parameters.salt.count)
        }
        let output = try SecretBytes(count: count)
        let result = crypto_pwhash(output.pointer.assumingMemoryBound(to: UInt8.self), UInt64(count),
                                   passphrase.pointer.assumingMemoryBound(to: CChar.self), UInt64(passphrase.count),
                                   parameters.salt, parameters.opsLimit, Int(parameters.memLimit), crypto_pwhash_ALG_ARGON2ID13)
        guard result == 0 else { throw .keyDerivationFailed }
        return output
    }
}
