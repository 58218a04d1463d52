import COpenSSL
import CSodium

/// OSSL_PARAM keeps the pointer to its key name, so names must outlive the call: static literals.
private func parameterName(_ name: StaticString) -> UnsafePointer<CChar> {
    UnsafeRawPointer(name.utf8Start).assumingMemoryBound(to: CChar.self)
}

/// An HMAC context with its digest set and no key, copied for each derivation. Setting a digest by
/// name looks it up in OpenSSL's registry, which was most of what an HKDF through `EVP_KDF` cost
/// (2–2.5 µs a derivation in a loop, 12 µs in the daemon, once for every file created or opened;
/// a copy of this template and four HMAC steps: 0.9 µs). Only ever read after it is made.
private struct HMACTemplate: @unchecked Sendable {
    let context: OpaquePointer?

    init(digest: StaticString) {
        guard let mac = EVP_MAC_fetch(nil, "HMAC", nil) else {
            context = nil
            return
        }
        defer { EVP_MAC_free(mac) }
        var made = EVP_MAC_CTX_new(mac)
        var params = [
            OSSL_PARAM_construct_utf8_string(parameterName("digest"), UnsafeMutableRawPointer(mutating: digest.utf8Start).assumingMemoryBound(to: CChar.self), 0),
            OSSL_PARAM_construct_end(),
        ]
        if let candidate = made, EVP_MAC_CTX_set_params(candidate, &params) != 1 {
            EVP_MAC_CTX_free(candidate)
            made = nil
        }
        context = made
    }
}

private let hmacSHA256 = HMACTemplate(digest: "SHA256")
private let hmacSHA512 = HMACTemplate(digest: "SHA512")

/// HKDF (RFC 5869) over OpenSSL's HMAC.
public enum HKDF {
    public enum Digest: String, Sendable {
        case sha256 = "SHA256"
        case sha512 = "SHA512"

        /// Bytes of one HMAC output.
        var length: Int { self == .sha256 ? 32 : 64 }
        fileprivate var template: HMACTemplate { self == .sha256 ? hmacSHA256 : hmacSHA512 }
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
        let length = digest.length
        guard output.count <= 255 * length else {
            throw .invalidLength(what: "HKDF output", expected: 255 * length, actual: output.count)
        }
        guard let template = digest.template.context, let mac = EVP_MAC_CTX_dup(template) else { throw .library("OpenSSL has no HMAC-\(digest.rawValue)") }
        defer { EVP_MAC_CTX_free(mac) }
        // The pseudorandom key and each expansion block are secrets: on the stack, zeroed on the way out.
        try withUnsafeTemporaryAllocation(byteCount: 2 * length, alignment: 16) { (scratch) throws(CryptoError) in
            defer { sodium_memzero(scratch.baseAddress, scratch.count) }
            let prk = scratch.baseAddress!, block = scratch.baseAddress! + length
            var produced = 0
            func step(_ body: () -> Int32) throws(CryptoError) {
                guard body() == 1 else { throw .library("HMAC-\(digest.rawValue) failed") }
            }
            // Extract: PRK = HMAC(salt, key); a missing salt is a block of zeros (RFC 5869 2.2).
            if salt.isEmpty {
                block.initializeMemory(as: UInt8.self, repeating: 0, count: length)
                try step { EVP_MAC_init(mac, block.assumingMemoryBound(to: UInt8.self), length, nil) }
            } else {
                try step { salt.withUnsafeBufferPointer { EVP_MAC_init(mac, $0.baseAddress, $0.count, nil) } }
            }
            try step { EVP_MAC_update(mac, key.baseAddress?.assumingMemoryBound(to: UInt8.self), key.count) }
            try step { EVP_MAC_final(mac, prk.assumingMemoryBound(to: UInt8.self), &produced, length) }
            // Expand: T(i) = HMAC(PRK, T(i-1) | info | i).
            var offset = 0
            var index: UInt8 = 1
            while offset < output.count {
                try step { EVP_MAC_init(mac, prk.assumingMemoryBound(to: UInt8.self), length, nil) }
                if index > 1 { try step { EVP_MAC_update(mac, block.assumingMemoryBound(to: UInt8.self), length) } }
                try step { info.withUnsafeBufferPointer { EVP_MAC_update(mac, $0.baseAddress, $0.count) } }
                try step { EVP_MAC_update(mac, &index, 1) }
                try step { EVP_MAC_final(mac, block.assumingMemoryBound(to: UInt8.self), &produced, length) }
                let take = min(length, output.count - offset)
                (output.baseAddress! + offset).copyMemory(from: block, byteCount: take)
                offset += take
                index &+= 1
            }
        }
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
