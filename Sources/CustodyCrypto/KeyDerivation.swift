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

extension HKDF {
    /// HKDF-SHA-256 with one key and salt for many short derivations: the extraction is done once
    /// and the HMAC keyed once with its result (its inner and outer states kept in secure memory),
    /// so that each derivation of up to 32 bytes is one HMAC from a copy of that state, about two
    /// SHA-256 compressions for a short `info` rather than eight. The bytes are those of
    /// `derive(.sha256, key:salt:info:count:)`.
    public final class SHA256Expander: Sendable {
        private let keyed: SecretBytes
        static let length = Int(crypto_auth_hmacsha256_BYTES)

        public init(key: SecretBytes, salt: [UInt8]) throws(CryptoError) {
            guard sodiumReady else { throw .library("libsodium could not be initialised") }
            let prk = try HKDF.derivePRK(key: key, salt: salt)
            keyed = try SecretBytes(count: MemoryLayout<crypto_auth_hmacsha256_state>.size)
            _ = crypto_auth_hmacsha256_init(keyed.pointer.assumingMemoryBound(to: crypto_auth_hmacsha256_state.self),
                                            prk.pointer.assumingMemoryBound(to: UInt8.self), prk.count)
        }

        /// T(1) of the expansion for `info` (the concatenation of `parts`), its first
        /// `output.count` bytes (at most 32).
        public func derive(info parts: [UnsafeRawBufferPointer], into output: UnsafeMutableRawBufferPointer) throws(CryptoError) {
            guard output.count <= Self.length, let target = output.baseAddress else {
                throw .invalidLength(what: "HKDF output from one block", expected: Self.length, actual: output.count)
            }
            let stateSize = MemoryLayout<crypto_auth_hmacsha256_state>.size
            // The copied state and the full block are secrets: on the stack, zeroed before returning.
            withUnsafeTemporaryAllocation(byteCount: stateSize + Self.length, alignment: 64) { scratch in
                defer { sodium_memzero(scratch.baseAddress, scratch.count) }
                guard let base = scratch.baseAddress else { return }
                base.copyMemory(from: keyed.pointer, byteCount: stateSize)
                let state = base.assumingMemoryBound(to: crypto_auth_hmacsha256_state.self)
                let block = (base + stateSize).assumingMemoryBound(to: UInt8.self)
                for part in parts {
                    if let bytes = part.baseAddress, part.count > 0 {
                        _ = crypto_auth_hmacsha256_update(state, bytes.assumingMemoryBound(to: UInt8.self), UInt64(part.count))
                    }
                }
                var counter: UInt8 = 1
                _ = crypto_auth_hmacsha256_update(state, &counter, 1)
                _ = crypto_auth_hmacsha256_final(state, block)
                target.copyMemory(from: block, byteCount: output.count)
            }
        }
    }

    /// The extraction step alone: PRK = HMAC-SHA-256(salt, key), a missing salt being 32 zero bytes.
    static func derivePRK(key: SecretBytes, salt: [UInt8]) throws(CryptoError) -> SecretBytes {
        let prk = try SecretBytes(count: Int(crypto_auth_hmacsha256_BYTES))
        let zeros = [UInt8](repeating: 0, count: Int(crypto_auth_hmacsha256_BYTES))
        let saltBytes = salt.isEmpty ? zeros : salt
        saltBytes.withUnsafeBufferPointer { saltBuffer in
            key.withUnsafeBytes { keyBytes in
                withUnsafeTemporaryAllocation(of: crypto_auth_hmacsha256_state.self, capacity: 1) { state in
                    guard let context = state.baseAddress, let salt = saltBuffer.baseAddress else { return }
                    defer { sodium_memzero(context, MemoryLayout<crypto_auth_hmacsha256_state>.size) }
                    _ = crypto_auth_hmacsha256_init(context, salt, saltBuffer.count)
                    if let bytes = keyBytes.baseAddress {
                        _ = crypto_auth_hmacsha256_update(context, bytes.assumingMemoryBound(to: UInt8.self), UInt64(keyBytes.count))
                    }
                    _ = crypto_auth_hmacsha256_final(context, prk.pointer.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        return prk
    }
}
