import CSodium

/// HKDF (RFC 5869) over libsodium's HMAC-SHA-256 and HMAC-SHA-512.
///
/// Not OpenSSL's `EVP_KDF`: in the daemon that cost 12 µs per derivation (the digest looked up by
/// name in OpenSSL's registry, and a handful of allocations), once for every file created or
/// opened; a copied, pre-configured `EVP_MAC` context still cost 9 µs there (allocations and
/// locks). libsodium's HMAC keeps its state in a caller's buffer: 1.6–1.8 µs in a loop, nothing
/// allocated, nothing shared between threads.
public enum HKDF {
    public enum Digest: String, Sendable {
        case sha256 = "SHA256"
        case sha512 = "SHA512"

        /// Bytes of one HMAC output.
        var length: Int { self == .sha256 ? Int(crypto_auth_hmacsha256_BYTES) : Int(crypto_auth_hmacsha512_BYTES) }
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
        let stateSize = max(MemoryLayout<crypto_auth_hmacsha256_state>.size, MemoryLayout<crypto_auth_hmacsha512_state>.size)
        // The HMAC state, the pseudorandom key and each expansion block are secrets: on the
        // stack, zeroed before returning.
        withUnsafeTemporaryAllocation(byteCount: stateSize + 2 * length, alignment: 64) { scratch in
            defer { sodium_memzero(scratch.baseAddress, scratch.count) }
            let state = scratch.baseAddress!, prk = state + stateSize, block = prk + length
            /// One HMAC with libsodium's functions for `State`.
            func run<State>(_: State.Type, key: UnsafePointer<UInt8>, _ keyCount: Int, _ parts: [UnsafeRawBufferPointer], into out: UnsafeMutablePointer<UInt8>,
                            _ initialize: (UnsafeMutablePointer<State>, UnsafePointer<UInt8>, Int) -> Int32,
                            _ update: (UnsafeMutablePointer<State>, UnsafePointer<UInt8>, UInt64) -> Int32,
                            _ finish: (UnsafeMutablePointer<State>, UnsafeMutablePointer<UInt8>) -> Int32) {
                let context = state.assumingMemoryBound(to: State.self)
                _ = initialize(context, key, keyCount)
                for part in parts where part.count > 0 {
                    _ = update(context, part.baseAddress!.assumingMemoryBound(to: UInt8.self), UInt64(part.count))
                }
                _ = finish(context, out)
            }
            /// HMAC(key, parts…) into `out` (`length` bytes).
            func hmac(key: UnsafeRawPointer, _ keyCount: Int, _ parts: [UnsafeRawBufferPointer], into out: UnsafeMutableRawPointer) {
                let keyBytes = key.assumingMemoryBound(to: UInt8.self), outBytes = out.assumingMemoryBound(to: UInt8.self)
                switch digest {
                case .sha256:
                    run(crypto_auth_hmacsha256_state.self, key: keyBytes, keyCount, parts, into: outBytes,
                        crypto_auth_hmacsha256_init, crypto_auth_hmacsha256_update, crypto_auth_hmacsha256_final)
                case .sha512:
                    run(crypto_auth_hmacsha512_state.self, key: keyBytes, keyCount, parts, into: outBytes,
                        crypto_auth_hmacsha512_init, crypto_auth_hmacsha512_update, crypto_auth_hmacsha512_final)
                }
            }
            salt.withUnsafeBytes { saltBytes in
                info.withUnsafeBytes { infoBytes in
                    // Extract: PRK = HMAC(salt, key); a missing salt is a block of zeros (RFC 5869 2.2).
                    if saltBytes.count == 0 {
                        block.initializeMemory(as: UInt8.self, repeating: 0, count: length)
                        hmac(key: block, length, [key], into: prk)
                    } else {
                        hmac(key: saltBytes.baseAddress!, saltBytes.count, [key], into: prk)
                    }
                    // Expand: T(i) = HMAC(PRK, T(i-1) | info | i).
                    var offset = 0
                    var index: UInt8 = 1
                    while offset < output.count {
                        let previous = UnsafeRawBufferPointer(start: block, count: index > 1 ? length : 0)
                        var counter = index
                        withUnsafeBytes(of: &counter) { hmac(key: prk, length, [previous, infoBytes, $0], into: block) }
                        let take = min(length, output.count - offset)
                        (output.baseAddress! + offset).copyMemory(from: block, byteCount: take)
                        offset += take
                        index &+= 1
                    }
                }
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
