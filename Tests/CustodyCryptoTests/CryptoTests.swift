@testable import CustodyCrypto
import Dispatch
import Synchronization
import XCTest

func hex(_ string: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = string.startIndex
    while index < string.endIndex {
        let next = string.index(index, offsetBy: 2)
        bytes.append(UInt8(string[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

func hexString(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

func secret(_ bytes: [UInt8]) throws -> SecretBytes {
    try bytes.withUnsafeBytes { try SecretBytes(copying: $0) }
}

func bytes(of secret: SecretBytes) -> [UInt8] { secret.withUnsafeBytes { Array($0) } }

final class AESGCMTests: XCTestCase {
    // NIST GCM specification, test case 16 (AES-256, 60-byte plaintext, 20-byte AAD).
    let key = hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
    let plaintext = hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39")
    let aad = hex("feedfacedeadbeeffeedfacedeadbeefabaddad2")
    let nonce = hex("cafebabefacedbaddecaf888")
    let expectedCiphertext = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
    let expectedTag = "76fc6ece0f4e1768cddf8853bb2d551b"

    func testKnownAnswer() throws {
        let gcm = try AESGCMKey(try secret(key))
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count)
        var tag = [UInt8](repeating: 0, count: 16)
        try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try plaintext.withUnsafeBytes { p in
            try gcm.seal(nonce: n, aad: a, plaintext: p, ciphertext: &ciphertext, tag: &tag)
        } } }
        XCTAssertEqual(hexString(ciphertext), expectedCiphertext)
        XCTAssertEqual(hexString(tag), expectedTag)

        var opened = [UInt8](repeating: 0, count: plaintext.count)
        try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try ciphertext.withUnsafeBytes { c in
            try gcm.open(nonce: n, aad: a, ciphertext: c, tag: tag, plaintext: &opened)
        } } }
        XCTAssertEqual(opened, plaintext)
    }

    func testEveryTamperIsRejectedAndLeavesNoPlaintext() throws {
        let gcm = try AESGCMKey(try secret(key))
        var ciphertext = [UInt8](repeating: 0, count: plaintext.count)
        var tag = [UInt8](repeating: 0, count: 16)
        try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try plaintext.withUnsafeBytes { p in
            try gcm.seal(nonce: n, aad: a, plaintext: p, ciphertext: &ciphertext, tag: &tag)
        } } }
        func open(_ c: [UInt8], _ t: [UInt8], _ a: [UInt8], _ n: [UInt8]) -> (CryptoError?, [UInt8]) {
            var out = [UInt8](repeating: 0xEE, count: c.count)
            do {
                try n.withUnsafeBytes { n in try a.withUnsafeBytes { a in try c.withUnsafeBytes { c in
                    try gcm.open(nonce: n, aad: a, ciphertext: c, tag: t, plaintext: &out)
                } } }
                return (nil, out)
            } catch { return (error as? CryptoError, out) }
        }
        for index in ciphertext.indices {
            var c = ciphertext
            c[index] ^= 0x01
            let (error, out) = open(c, tag, aad, nonce)
            XCTAssertEqual(error, .authenticationFailed)
            XCTAssertEqual(out, [UInt8](repeating: 0, count: c.count), "no unauthenticated plaintext escapes")
        }
        var t = tag; t[0] ^= 0x80
        XCTAssertEqual(open(ciphertext, t, aad, nonce).0, .authenticationFailed)
        var a = aad; a[3] ^= 0x01
        XCTAssertEqual(open(ciphertext, tag, a, nonce).0, .authenticationFailed)
        var n = nonce; n[11] ^= 0x01
        XCTAssertEqual(open(ciphertext, tag, aad, n).0, .authenticationFailed)
        let wrong = try AESGCMKey(try SecretBytes.random(count: 32))
        var out = [UInt8](repeating: 0, count: ciphertext.count)
        XCTAssertThrowsError(try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try ciphertext.withUnsafeBytes { c in
            try wrong.open(nonce: n, aad: a, ciphertext: c, tag: tag, plaintext: &out)
        } } }) { XCTAssertEqual($0 as? CryptoError, .authenticationFailed) }
    }

    func testRejectsBadSizes() throws {
        XCTAssertThrowsError(try AESGCMKey(try SecretBytes.random(count: 16))) {
            XCTAssertEqual($0 as? CryptoError, .invalidLength(what: "AES-256-GCM key", expected: 32, actual: 16))
        }
        let gcm = try AESGCMKey(try SecretBytes.random(count: 32))
        var out = [UInt8](repeating: 0, count: 4), tag = [UInt8](repeating: 0, count: 16)
        XCTAssertThrowsError(try [UInt8](repeating: 0, count: 8).withUnsafeBytes { n in
            try gcm.seal(nonce: n, aad: UnsafeRawBufferPointer(start: nil, count: 0), plaintext: UnsafeRawBufferPointer(start: nil, count: 0), ciphertext: &out, tag: &tag)
        })
    }

    func testContextsAreSafeAcrossThreads() throws {
        let gcm = try AESGCMKey(try SecretBytes.random(count: 32))
        nonisolated(unsafe) let failures = UnsafeMutablePointer<Int>.allocate(capacity: 16)
        failures.initialize(repeating: 0, count: 16)
        defer { failures.deallocate() }
        DispatchQueue.concurrentPerform(iterations: 16) { worker in
            var message = [UInt8](repeating: UInt8(worker), count: 4096)
            var ciphertext = message, tag = [UInt8](repeating: 0, count: 16), opened = message
            for round in 0..<200 {
                message[0] = UInt8(truncatingIfNeeded: round)
                let nonce = (try? Random.bytes(12)) ?? []
                do {
                    try nonce.withUnsafeBytes { n in try message.withUnsafeBytes { p in
                        try gcm.seal(nonce: n, aad: UnsafeRawBufferPointer(start: nil, count: 0), plaintext: p, ciphertext: &ciphertext, tag: &tag)
                    } }
                    try nonce.withUnsafeBytes { n in try ciphertext.withUnsafeBytes { c in
                        try gcm.open(nonce: n, aad: UnsafeRawBufferPointer(start: nil, count: 0), ciphertext: c, tag: tag, plaintext: &opened)
                    } }
                    if opened != message { failures[worker] += 1 }
                } catch { failures[worker] += 1 }
            }
        }
        XCTAssertEqual((0..<16).map { failures[$0] }.reduce(0, +), 0)
    }
}

final class KeyDerivationTests: XCTestCase {
    func testHKDFRFC5869Case1() throws {
        let okm = try HKDF.derive(.sha256, key: try secret([UInt8](repeating: 0x0b, count: 22)),
                                  salt: hex("000102030405060708090a0b0c"), info: hex("f0f1f2f3f4f5f6f7f8f9"), count: 42)
        XCTAssertEqual(hexString(bytes(of: okm)), "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")
        let sha512 = try HKDF.derive(.sha512, key: try secret([UInt8](repeating: 0x0b, count: 22)), salt: [], info: [], count: 32)
        XCTAssertNotEqual(bytes(of: sha512), Array(bytes(of: okm).prefix(32)))
    }

    /// RFC 5869 case 3 (no salt, no info), and SHA-512 outputs of one and of two blocks, as
    /// OpenSSL's own HKDF (`openssl kdf ... HKDF`) gives them.
    func testHKDFWithoutSaltAndWithSHA512() throws {
        let key = try secret([UInt8](repeating: 0x0b, count: 22))
        XCTAssertEqual(hexString(bytes(of: try HKDF.derive(.sha256, key: key, salt: [], info: [], count: 42))),
                       "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8")
        XCTAssertEqual(hexString(bytes(of: try HKDF.derive(.sha512, key: key, salt: [], info: [], count: 32))),
                       "f5fa02b18298a72a8c23898a8703472c6eb179dc204c03425c970e3b164bf90f")
        XCTAssertEqual(hexString(bytes(of: try HKDF.derive(.sha512, key: key, salt: hex("000102030405060708090a0b0c"),
                                                            info: hex("f0f1f2f3f4f5f6f7f8f9"), count: 100))),
                       "832390086cda71fb47625bb5ceb168e4c8e26a1a16ed34d9fc7fe92c1481579338da362cb8d9f925d7cbcce0dff7098769cf15959867d571c1715450cb530137be3fb62f3cf32b84feba8f1eb1b563e20d9749b8640b8264c4b69b14ad5199115e1d609c")
        // RFC 5869 allows at most 255 blocks.
        XCTAssertThrowsError(try HKDF.derive(.sha256, key: key, salt: [], info: [], count: 255 * 32 + 1))
        // Derivations from many threads at once agree (each keeps its HMAC state on its own stack).
        let expected = bytes(of: try HKDF.derive(.sha256, key: key, salt: [1, 2, 3], info: [4, 5], count: 32))
        let mismatches = Atomic<Int>(0)
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            for _ in 0..<500 {
                let derived = try? HKDF.derive(.sha256, key: key, salt: [1, 2, 3], info: [4, 5], count: 32)
                if derived.map({ bytes(of: $0) }) != expected { mismatches.wrappingAdd(1, ordering: .relaxed) }
            }
        }
        XCTAssertEqual(mismatches.load(ordering: .relaxed), 0)
    }

    /// The expander keyed once gives the bytes of a whole HKDF, for every info length (one and
    /// several parts, across SHA-256's block) and output length up to one block; it refuses more.
    func testExpanderMatchesHKDF() throws {
        let key = try secret((0..<32).map { UInt8($0 &* 7) })
        for salt in [[], [UInt8](repeating: 9, count: 13), [UInt8](repeating: 1, count: 80)] as [[UInt8]] {
            let expander = try HKDF.SHA256Expander(key: key, salt: salt)
            for infoLength in [0, 1, 17, 55, 56, 64, 120, 300] {
                let info = (0..<infoLength).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
                for count in [1, 12, 32] {
                    let expected = bytes(of: try HKDF.derive(.sha256, key: key, salt: salt, info: info, count: count))
                    var out = [UInt8](repeating: 0, count: count)
                    let split = infoLength / 3
                    try info.withUnsafeBytes { all in
                        try out.withUnsafeMutableBytes { target in
                            try expander.derive(info: [UnsafeRawBufferPointer(rebasing: all[..<split]), UnsafeRawBufferPointer(rebasing: all[split...])],
                                                into: target)
                        }
                    }
                    XCTAssertEqual(out, expected, "salt \(salt.count), info \(infoLength), count \(count)")
                }
            }
            var tooLong = [UInt8](repeating: 0, count: 33)
            XCTAssertThrowsError(try tooLong.withUnsafeMutableBytes { try expander.derive(info: [], into: $0) })
        }
    }

    func testArgon2idIsDeterministicAndSaltSensitive() throws {
        // Small limits keep the test fast; the parameters are stored with the output in real use.
        let parameters = Argon2Parameters(opsLimit: 1, memLimit: 8192 * 1024, salt: [UInt8](repeating: 7, count: 16))
        let passphrase = try secret(Array("correct horse battery staple".utf8))
        let first = try Argon2id.derive(passphrase: passphrase, parameters: parameters)
        let second = try Argon2id.derive(passphrase: passphrase, parameters: parameters)
        XCTAssertTrue(first.constantTimeEquals(second))
        var salted = parameters
        salted.salt[0] = 8
        XCTAssertFalse(first.constantTimeEquals(try Argon2id.derive(passphrase: passphrase, parameters: salted)))
        let other = try Argon2id.derive(passphrase: try secret(Array("correct horse battery stapler".utf8)), parameters: parameters)
        XCTAssertFalse(first.constantTimeEquals(other))
        var badSalt = parameters
        badSalt.salt = [1, 2, 3]
        XCTAssertThrowsError(try Argon2id.derive(passphrase: passphrase, parameters: badSalt))
        let interactive = try Argon2Parameters.interactive()
        XCTAssertEqual(interactive.salt.count, 16)
        XCTAssertNotEqual(interactive.salt, try Argon2Parameters.interactive().salt, "salts are fresh")
        XCTAssertGreaterThan(try Argon2Parameters.moderate().memLimit, interactive.memLimit)
    }

    func testX25519RFC7748() throws {
        let alice = try secret(hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
        let bob = try secret(hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"))
        let alicePublic = try X25519.publicKey(for: alice)
        let bobPublic = try X25519.publicKey(for: bob)
        XCTAssertEqual(hexString(alicePublic), "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        XCTAssertEqual(hexString(bobPublic), "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        let shared = try X25519.sharedSecret(privateKey: alice, publicKey: bobPublic)
        XCTAssertEqual(hexString(bytes(of: shared)), "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
        XCTAssertTrue(shared.constantTimeEquals(try X25519.sharedSecret(privateKey: bob, publicKey: alicePublic)))
        XCTAssertThrowsError(try X25519.sharedSecret(privateKey: alice, publicKey: [UInt8](repeating: 0, count: 32))) {
            XCTAssertEqual($0 as? CryptoError, .invalidPublicKey, "a low-order point gives no shared secret")
        }
        XCTAssertThrowsError(try X25519.sharedSecret(privateKey: alice, publicKey: [1, 2, 3]))
    }
}

final class KeyWrapAndSecretTests: XCTestCase {
    func testWrapUnwrapAndContextBinding() throws {
        let kek = try AESGCMKey(try SecretBytes.random(count: 32))
        let key = try SecretBytes.random(count: 32)
        let context = Array("owner=alice class=A".utf8)
        let wrapped = try context.withUnsafeBytes { try KeyWrap.wrap(key, with: kek, context: $0) }
        XCTAssertEqual(wrapped.count, 60)
        let again = try context.withUnsafeBytes { try KeyWrap.wrap(key, with: kek, context: $0) }
        XCTAssertNotEqual(wrapped, again, "every wrap has a fresh nonce")
        let unwrapped = try wrapped.withUnsafeBytes { w in try context.withUnsafeBytes { try KeyWrap.unwrap(w, with: kek, context: $0) } }
        XCTAssertTrue(unwrapped.constantTimeEquals(key))
        let otherContext = Array("owner=mallory class=A".utf8)
        XCTAssertThrowsError(try wrapped.withUnsafeBytes { w in try otherContext.withUnsafeBytes { try KeyWrap.unwrap(w, with: kek, context: $0) } }) {
            XCTAssertEqual($0 as? CryptoError, .authenticationFailed)
        }
        XCTAssertThrowsError(try wrapped.withUnsafeBytes { w in try context.withUnsafeBytes {
            try KeyWrap.unwrap(w, with: try AESGCMKey(try SecretBytes.random(count: 32)), context: $0)
        } })
        XCTAssertThrowsError(try [UInt8](wrapped.prefix(59)).withUnsafeBytes { w in try context.withUnsafeBytes { try KeyWrap.unwrap(w, with: kek, context: $0) } })
    }

    func testSecretsAreRedactedAndZeroedOnRelease() throws {
        let key = try secret([UInt8](repeating: 0x41, count: 32))
        XCTAssertEqual(String(describing: key), "SecretBytes(32 bytes, redacted)")
        XCTAssertEqual("\(key)", "SecretBytes(32 bytes, redacted)")
        XCTAssertFalse(String(reflecting: key).contains("65"))
        XCTAssertTrue(Mirror(reflecting: key).children.isEmpty)
        // A released slot is zeroed: the next allocation from the pool reads as zeros.
        var pointer: UnsafeMutableRawPointer?
        do {
            let temporary = try secret([UInt8](repeating: 0x5A, count: 32))
            pointer = temporary.pointer
        }
        let reused = try SecretBytes(count: 32)
        if reused.pointer == pointer {
            XCTAssertEqual(bytes(of: reused), [UInt8](repeating: 0, count: 32))
        }
        XCTAssertEqual(UnsafeRawBufferPointer(start: pointer, count: 32).allSatisfy { $0 == 0 }, true, "zeroed at release")
    }

    func testManySmallSecretsShareSlabs() throws {
        let before = SecurePool.shared.slabCount
        let keys = try (0..<1000).map { _ in try SecretBytes.random(count: 32) }
        XCTAssertLessThanOrEqual(SecurePool.shared.slabCount - before, 1000 / (SecurePool.slabSize / SecurePool.slotSizes[0]) + 1)
        XCTAssertEqual(Set(keys.map { bytes(of: $0) }).count, 1000, "random keys are distinct")
        let big = try SecretBytes.random(count: 2000)
        XCTAssertEqual(big.count, 2000)
        XCTAssertThrowsError(try SecretBytes(count: 0))
    }

    /// A key's contexts are per thread: threads that seal and open with the same keys at once, more
    /// of them alive together than there are slots (the rest get a context per message), all get
    /// what one thread alone gets, and every message opens on every thread.
    func testKeysSealAndOpenOnManyThreadsAtOnce() throws {
        let keys = try (0..<6).map { _ in try AESGCMKey(try SecretBytes.random(count: 32)) }
        let nonce = [UInt8](repeating: 9, count: 12), aad = [UInt8]("aad".utf8)
        let message = (0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        @Sendable func seal(_ key: AESGCMKey) throws -> [UInt8] {
            var out = [UInt8](repeating: 0, count: message.count + 16)
            try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try message.withUnsafeBytes { p in
                try out.withUnsafeMutableBytes { o in
                    try key.seal(nonce: n, aad: a, plaintext: p, ciphertext: o.baseAddress!, tag: o.baseAddress! + message.count)
                }
            } } }
            return out
        }
        @Sendable func open(_ sealed: [UInt8], _ key: AESGCMKey) throws -> [UInt8] {
            var out = [UInt8](repeating: 0, count: message.count)
            try nonce.withUnsafeBytes { n in try aad.withUnsafeBytes { a in try sealed.withUnsafeBytes { s in
                try out.withUnsafeMutableBytes { o in
                    try key.open(nonce: n, aad: a, ciphertext: UnsafeRawBufferPointer(rebasing: s.prefix(message.count)),
                                 tag: s.baseAddress! + message.count, plaintext: o.baseAddress!)
                }
            } } }
            return out
        }
        let expected = try keys.map(seal)
        let threads = 80
        let started = DispatchGroup(), done = DispatchGroup(), go = DispatchSemaphore(value: 0)
        let failures = Mutex<[String]>([])
        for index in 0..<threads {
            started.enter()
            done.enter()
            Thread {
                started.leave()
                go.wait()
                do {
                    for round in 0..<20 {
                        let k = (index + round) % keys.count
                        let sealed = try seal(keys[k])
                        if sealed != expected[k] { failures.withLock { $0.append("thread \(index): key \(k) sealed differently") } }
                        if try open(sealed, keys[(k + 1) % keys.count]) == message {
                            failures.withLock { $0.append("thread \(index): opened with the wrong key") }
                        }
                    }
                    if try open(expected[index % keys.count], keys[index % keys.count]) != message {
                        failures.withLock { $0.append("thread \(index): did not open") }
                    }
                } catch let error as CryptoError where error == .authenticationFailed {
                    // The wrong key's open: expected; anything else is not.
                } catch {
                    failures.withLock { $0.append("thread \(index): \(error)") }
                }
                done.leave()
            }.start()
        }
        started.wait()
        for _ in 0..<threads { go.signal() }
        done.wait()
        XCTAssertEqual(failures.withLock { $0 }, [])
        // Every thread above has gone and given its slot back: a thread now still opens all.
        for (key, sealed) in zip(keys, expected) { XCTAssertEqual(try open(sealed, key), message) }
    }

    func testConstantTimeEqualsAndSHA256() {
        let a: [UInt8] = [1, 2, 3], b: [UInt8] = [1, 2, 3], c: [UInt8] = [1, 2, 4]
        a.withUnsafeBytes { a in
            b.withUnsafeBytes { XCTAssertTrue(constantTimeEquals(a, $0)) }
            c.withUnsafeBytes { XCTAssertFalse(constantTimeEquals(a, $0)) }
            [UInt8]([1, 2]).withUnsafeBytes { XCTAssertFalse(constantTimeEquals(a, $0)) }
        }
        XCTAssertEqual(hexString(Array("abc".utf8).withUnsafeBytes { sha256($0) }),
                       "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }
}
