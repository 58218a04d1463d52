import COpenSSL
import CSodium

/// HKDF (RFC 5869) over HMAC-SHA-256 and HMAC-SHA-512 from the system's libcrypto
/// (`custody_hmac`: RFC 2104 on a SHA context kept per thread).
///
/// Not OpenSSL's `EVP_KDF` or `EVP_MAC`: in the daemon those cost 12 µs and 9 µs per derivation
/// (the digest looked up by name, allocations and locks on every use), once for every file created
/// or opened. Two hashes on a context the thread keeps cost about 0.4 µs per HMAC here, nothing
/// allocated, nothing shared between threads.
public enum HKDF {
    public enum Digest: String, Sendable {
        case sha256 = "SHA256"
        case sha512 = "SHA512"

        /// Bytes of one HMAC output.
        var length: Int { self == .sha256 ? 32 : 64 }
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
        // The pseudorandom key and each expansion block are secrets: on the stack, zeroed before
        // returning.
        var failed = false
        withUnsafeTemporaryAllocation(byteCount: 2 * length, alignment: 64) { scratch in
            defer { sodium_memzero(scratch.baseAddress, scratch.count) }
            guard let prk = scratch.baseAddress, let target = output.baseAddress else { return }
            let block = prk + length
            salt.withUnsafeBytes { saltBytes in
                info.withUnsafeBytes { infoBytes in
                    failed = !extract(digest, key: key, salt: saltBytes, into: prk)
                    // Expand: T(i) = HMAC(PRK, T(i-1) | info | i).
                    var offset = 0
                    var index: UInt8 = 1
                    while !failed, offset < output.count {
                        let previous = UnsafeRawBufferPointer(start: block, count: index > 1 ? length : 0)
                        var counter = index
                        failed = !withUnsafeBytes(of: &counter) {
                            hmac(digest, key: UnsafeRawBufferPointer(start: prk, count: length), [previous, infoBytes, $0], into: block)
                        }
                        let take = min(length, output.count - offset)
                        (target + offset).copyMemory(from: block, byteCount: take)
                        offset += take
                        index &+= 1
                    }
                }
            }
        }
        if failed {
            output.initializeMemory(as: UInt8.self, repeating: 0)
            throw .library("libcrypto could not compute an HMAC")
        }
    }

    /// Extract: PRK = HMAC(salt, key) into `prk` (the digest's length); a missing salt is a block
    /// of zeros (RFC 5869 2.2). False when libcrypto failed.
    static func extract(_ digest: Digest, key: UnsafeRawBufferPointer, salt: UnsafeRawBufferPointer, into prk: UnsafeMutableRawPointer) -> Bool {
        guard salt.isEmpty else { return hmac(digest, key: salt, [key], into: prk) }
        return withUnsafeTemporaryAllocation(byteCount: digest.length, alignment: 8) { zeros in
            zeros.initializeMemory(as: UInt8.self, repeating: 0)
            return hmac(digest, key: UnsafeRawBufferPointer(zeros), [key], into: prk)
        }
    }

    /// HMAC(key, parts…) into `out` (the digest's length). False when libcrypto failed (`out` is
    /// then zeroed).
    static func hmac(_ digest: Digest, key: UnsafeRawBufferPointer, _ parts: [UnsafeRawBufferPointer], into out: UnsafeMutableRawPointer) -> Bool {
        withUnsafeTemporaryAllocation(of: custody_bytes.self, capacity: parts.count) { list in
            guard let listBase = list.baseAddress else { return false }
            for (index, part) in parts.enumerated() {
                (listBase + index).initialize(to: custody_bytes(bytes: part.baseAddress, length: part.count))
            }
            return custody_hmac(digest == .sha512 ? 1 : 0, key.baseAddress?.assumingMemoryBound(to: UInt8.self), key.count,
                                listBase, parts.count, out.assumingMemoryBound(to: UInt8.self)) == 1
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
    /// (its result kept in secure memory), so that each derivation of up to 32 bytes is one HMAC.
    /// The bytes are those of `derive(.sha256, key:salt:info:count:)`.
    public final class SHA256Expander: Sendable {
        private let prk: SecretBytes
        static let length = 32

        public init(key: SecretBytes, salt: [UInt8]) throws(CryptoError) {
            prk = try SecretBytes(count: Self.length)
            let extracted = try key.withUnsafeBytes { (ikm) throws(CryptoError) -> Bool in
                try prk.withUnsafeMutableBytes { (out) throws(CryptoError) -> Bool in
                    guard let target = out.baseAddress else { throw .library("no memory for a key") }
                    return salt.withUnsafeBytes { saltBytes in extract(.sha256, key: ikm, salt: saltBytes, into: target) }
                }
            }
            guard extracted else { throw .library("libcrypto could not compute an HMAC") }
        }

        /// T(1) of the expansion for `info` (the concatenation of `parts`), its first
        /// `output.count` bytes (at most 32).
        public func derive(info parts: [UnsafeRawBufferPointer], into output: UnsafeMutableRawBufferPointer) throws(CryptoError) {
            guard output.count <= Self.length, let target = output.baseAddress else {
                throw .invalidLength(what: "HKDF output from one block", expected: Self.length, actual: output.count)
            }
            // The full block is a secret: on the stack, zeroed before returning.
            let done = withUnsafeTemporaryAllocation(byteCount: Self.length, alignment: 64) { block -> Bool in
                defer { sodium_memzero(block.baseAddress, block.count) }
                guard let blockBase = block.baseAddress else { return false }
                var counter: UInt8 = 1
                let ok = withUnsafeBytes(of: &counter) { counterBytes in
                    prk.withUnsafeBytes { key in hmac(.sha256, key: key, parts + [counterBytes], into: blockBase) }
                }
                if ok { target.copyMemory(from: blockBase, byteCount: output.count) }
                return ok
            }
            guard done else { throw .library("libcrypto could not compute an HMAC") }
        }
    }
}
