@testable import CustodyCrypto
@testable import CustodyFormat
import Foundation
import XCTest

/// The test vectors in docs/format.md: each `vector` block lists inputs and expected outputs; this
/// test recomputes every output from the inputs. `GENERATE_VECTORS=1` prints the blocks instead.
final class FormatVectorTests: XCTestCase {
    static let docPath = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../../docs/format.md").standardized.path

    func testVectorsInFormatDoc() throws {
        if ProcessInfo.processInfo.environment["GENERATE_VECTORS"] == "1" {
            for vector in try Self.generate() { print(vector.rendered) }
            return
        }
        let text = try String(contentsOfFile: Self.docPath, encoding: .utf8)
        let documented = Self.parse(text)
        XCTAssertEqual(Set(documented.map(\.name)), Set(try Self.generate().map(\.name)), "every vector is documented")
        for vector in documented {
            let computed = try Self.compute(vector)
            for (key, value) in computed {
                XCTAssertEqual(vector.fields[key], value, "vector \(vector.name): \(key)")
            }
        }
        // The other direction: decode the documented header bytes and unwrap them with the documented keys.
        let classA = try XCTUnwrap(documented.first { $0.name == "header-class-A" })
        let header = try hex(classA.fields["header"]!).withUnsafeBytes { try FileHeader.decode($0) }
        XCTAssertEqual(header.owner?.display, classA.fields["owner"])
        let key = try header.unwrapFileKey(with: .symmetric(id: hex(classA.fields["class-key-id"]!),
                                                            key: try AESGCMKey(try secretBytes(hex(classA.fields["class-key"]!)))))
        XCTAssertEqual(key.withUnsafeBytes { Array($0) }, hex(classA.fields["file-key"]!))
    }

    struct Vector {
        var name: String
        var fields: [String: String]
        var order: [String]
        var rendered: String {
            var lines = ["```vector", "name \(name)"]
            for key in order {
                let value = fields[key]!
                if value.count <= 64 {
                    lines.append(key.padding(toLength: 22, withPad: " ", startingAt: 0) + value)
                } else {
                    lines.append(key)
                    var rest = Substring(value)
                    while !rest.isEmpty { lines.append("  " + rest.prefix(64)); rest = rest.dropFirst(64) }
                }
            }
            return (lines + ["```", ""]).joined(separator: "\n")
        }
    }

    static func parse(_ text: String) -> [Vector] {
        var vectors: [Vector] = []
        var current: Vector?
        var lastKey = ""
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "```vector" { current = Vector(name: "", fields: [:], order: []); continue }
            guard var vector = current else { continue }
            if line == "```" { vectors.append(vector); current = nil; continue }
            if line.hasPrefix("  ") {
                vector.fields[lastKey, default: ""] += line.trimmingCharacters(in: .whitespaces)
            } else {
                let parts = line.split(separator: " ", maxSplits: 1)
                guard let key = parts.first else { continue }
                lastKey = String(key)
                let value = parts.count > 1 ? parts[1].trimmingCharacters(in: .whitespaces) : ""
                if lastKey == "name" { vector.name = value } else { vector.fields[lastKey] = value; vector.order.append(lastKey) }
            }
            current = vector
        }
        return vectors
    }

    static let fileID = "000102030405060708090a0b0c0d0e0f"
    static func repeated(_ byte: String, _ count: Int) -> String { String(repeating: byte, count: count) }

    /// The inputs of each vector; `compute` fills in the outputs.
    static func inputs() -> [Vector] {
        [
            Vector(name: "header-class-A", fields: [
                "owner": "Alice@Contoso.com", "class": "3", "file-id": fileID, "block-size": "4096",
                "class-key-id": "0102030405060708", "class-key": repeated("11", 32), "file-key": repeated("22", 32),
                "wrap-nonce": repeated("33", 12),
            ], order: ["owner", "class", "file-id", "block-size", "class-key-id", "class-key", "file-key", "wrap-nonce", "header"]),
            Vector(name: "header-class-B", fields: [
                "owner": "Alice@Contoso.com", "class": "2", "file-id": fileID, "block-size": "4096",
                "class-key-id": "0909090909090909", "class-private-key": repeated("77", 32),
                "ephemeral-private-key": repeated("88", 32), "file-key": repeated("22", 32), "wrap-nonce": repeated("99", 12),
            ], order: ["owner", "class", "file-id", "block-size", "class-key-id", "class-private-key", "class-public-key",
                       "ephemeral-private-key", "file-key", "wrap-nonce", "header"]),
            Vector(name: "header-plain", fields: ["owner": "Bob@Personal.example", "file-id": repeated("f0", 16)],
                   order: ["owner", "file-id", "header"]),
            Vector(name: "block-final", fields: [
                "file-key": repeated("22", 32), "file-id": fileID, "index": "0", "final": "1",
                "nonce": repeated("44", 12), "plaintext": Array("hello, custody\n".utf8).map { String(format: "%02x", $0) }.joined(),
            ], order: ["file-key", "file-id", "content-key", "index", "final", "nonce", "plaintext", "aad", "stored"]),
            Vector(name: "block-not-final", fields: [
                "file-key": repeated("22", 32), "file-id": fileID, "index": "1", "final": "0",
                "nonce": repeated("55", 12), "plaintext-byte": "61", "plaintext-length": "4096",
            ], order: ["file-key", "file-id", "index", "final", "nonce", "plaintext-byte", "plaintext-length", "aad",
                       "stored-sha256", "stored-tag"]),
            Vector(name: "owner-record", fields: ["owner": "Bob@Personal.example"], order: ["owner", "record"]),
            Vector(name: "owner-record-encrypted", fields: ["owner": "Alice@Contoso.com", "class": "3"], order: ["owner", "class", "record"]),
            Vector(name: "header-class-A-v2", fields: [
                "version": "2", "owner": "Alice@Contoso.com", "class": "3", "file-id": fileID, "block-size": "4096",
                "class-key-id": "0102030405060708", "class-key": repeated("11", 32), "file-key": repeated("22", 32),
                "wrap-nonce": repeated("33", 12),
            ], order: ["version", "owner", "class", "file-id", "block-size", "class-key-id", "class-key", "file-key", "wrap-nonce", "header"]),
            Vector(name: "hole-record", fields: [
                "file-key": repeated("22", 32), "file-id": fileID, "holes": "1+9,11+9", "nonce": repeated("66", 12),
            ], order: ["file-key", "file-id", "holes", "nonce", "record"]),
            Vector(name: "header-class-A-v3", fields: [
                "version": "3", "class": "3", "file-id": fileID, "block-size": "4096",
                "class-key-id": "0102030405060708", "class-key": repeated("11", 32), "file-key": repeated("22", 32),
                "wrap-nonce": repeated("33", 12),
            ], order: ["version", "class", "file-id", "block-size", "class-key-id", "class-key", "file-key", "wrap-nonce", "header"]),
            Vector(name: "owner-record-key-id", fields: ["key-id": "0d0e0f1011121314", "class": "3"], order: ["key-id", "class", "record"]),
            Vector(name: "name-short", fields: [
                "name-secret": (0..<32).map { String(format: "%02x", $0) }.joined(), "tweak": (0xa0...0xaf).map { String(format: "%02x", $0) }.joined(),
                "plain-name": "acquisition-plan.txt",
            ], order: ["name-secret", "tweak", "plain-name", "key-tag", "nonce", "stored"]),
            Vector(name: "name-long", fields: [
                "name-secret": (0..<32).map { String(format: "%02x", $0) }.joined(), "tweak": (0xa0...0xaf).map { String(format: "%02x", $0) }.joined(),
                "plain-name": String(repeating: "x", count: 255),
            ], order: ["name-secret", "tweak", "plain-name", "key-tag", "stored", "full"]),
        ]
    }

    static func generate() throws -> [Vector] {
        try inputs().map { vector in
            var filled = vector
            for (key, value) in try compute(vector) { filled.fields[key] = value }
            return filled
        }
    }

    /// The outputs each vector's inputs give.
    static func compute(_ v: Vector) throws -> [String: String] {
        let f = { (key: String) -> String in v.fields[key] ?? "" }
        switch v.name {
        case "header-class-A":
            let header = try FileHeader.encrypted(
                owner: try Owner(f("owner")), protectionClass: ProtectionClass(rawValue: UInt8(f("class"))!)!,
                classKey: .symmetric(id: hex(f("class-key-id")), key: try AESGCMKey(try secretBytes(hex(f("class-key"))))),
                fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")), blockSize: UInt32(f("block-size"))!,
                wrapNonce: hex(f("wrap-nonce")), version: UInt16(f("version")) ?? 1)
            return ["header": hexString(header.encoded())]
        case "header-class-A-v2":
            let header = try FileHeader.encrypted(
                owner: try Owner(f("owner")), protectionClass: ProtectionClass(rawValue: UInt8(f("class"))!)!,
                classKey: .symmetric(id: hex(f("class-key-id")), key: try AESGCMKey(try secretBytes(hex(f("class-key"))))),
                fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")), blockSize: UInt32(f("block-size"))!,
                wrapNonce: hex(f("wrap-nonce")), version: UInt16(f("version"))!)
            return ["header": hexString(header.encoded())]
        case "header-class-A-v3":
            let header = try FileHeader.encrypted(
                owner: nil, protectionClass: ProtectionClass(rawValue: UInt8(f("class"))!)!,
                classKey: .symmetric(id: hex(f("class-key-id")), key: try AESGCMKey(try secretBytes(hex(f("class-key"))))),
                fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")), blockSize: UInt32(f("block-size"))!,
                wrapNonce: hex(f("wrap-nonce")), version: UInt16(f("version"))!)
            return ["header": hexString(header.encoded())]
        case "owner-record-key-id":
            return ["record": hexString(OwnerRecord(ownerKeyID: hex(f("key-id")), encryptedClass: ProtectionClass(rawValue: UInt8(f("class"))!)).encoded())]
        case "hole-record":
            let cipher = try ContentCipher(fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")))
            var set = HoleSet()
            for range in f("holes").split(separator: ",") {
                let parts = range.split(separator: "+").compactMap { UInt64($0) }
                set.insert(parts[0]..<(parts[0] + parts[1]))
            }
            let record = try set.record(cipher: cipher, nonce: hex(f("nonce")))
            guard HoleSet.decode(record, cipher: cipher) == set else { throw FormatError.unsupported("the record does not decode") }
            return ["record": hexString(record)]
        case "header-class-B":
            let classPrivate = try secretBytes(hex(f("class-private-key")))
            let classPublic = try X25519.publicKey(for: classPrivate)
            let header = try FileHeader.encrypted(
                owner: try Owner(f("owner")), protectionClass: ProtectionClass(rawValue: UInt8(f("class"))!)!,
                classKey: .agreement(id: hex(f("class-key-id")), publicKey: classPublic, privateKey: nil),
                fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")), blockSize: UInt32(f("block-size"))!,
                wrapNonce: hex(f("wrap-nonce")), ephemeralPrivateKey: try secretBytes(hex(f("ephemeral-private-key"))),
                version: UInt16(f("version")) ?? 1)
            // And it unwraps with the private key.
            let unwrapped = try header.unwrapFileKey(with: .agreement(id: hex(f("class-key-id")), publicKey: classPublic, privateKey: classPrivate))
            guard unwrapped.withUnsafeBytes({ Array($0) }) == hex(f("file-key")) else { throw FormatError.headerAuthenticationFailed }
            return ["class-public-key": hexString(classPublic), "header": hexString(header.encoded())]
        case "header-plain":
            return ["header": hexString(try FileHeader.plain(owner: try Owner(f("owner")), fileID: hex(f("file-id"))).encoded())]
        case "block-final", "block-not-final":
            let cipher = try ContentCipher(fileKey: try secretBytes(hex(f("file-key"))), fileID: hex(f("file-id")))
            let plaintext = v.name == "block-final" ? hex(f("plaintext"))
                : [UInt8](repeating: hex(f("plaintext-byte"))[0], count: Int(f("plaintext-length"))!)
            let index = UInt64(f("index"))!, final = f("final") == "1"
            var stored = [UInt8](repeating: 0, count: plaintext.count + 28)
            let aad = UnsafeMutableRawPointer.allocate(byteCount: 32, alignment: 8)
            defer { aad.deallocate() }
            try hex(f("nonce")).withUnsafeBytes { nonce in
                try plaintext.withUnsafeBytes { p in
                    try stored.withUnsafeMutableBytes { s in
                        try cipher.seal(cipher.key.context, aad: aad, index: index, final: final, plaintext: p, into: s.baseAddress!, nonce: nonce)
                    }
                }
            }
            cipher.fillAAD(aad, index: index, final: final)
            let aadHex = hexString(Array(UnsafeRawBufferPointer(start: aad, count: ContentCipher.aadSize)))
            if v.name == "block-final" {
                let contentKey = try HKDF.derive(.sha256, key: try secretBytes(hex(f("file-key"))), salt: hex(f("file-id")),
                                                 info: ContentCipher.info, count: 32)
                return ["content-key": hexString(contentKey.withUnsafeBytes { Array($0) }), "aad": aadHex, "stored": hexString(stored)]
            }
            return ["aad": aadHex, "stored-sha256": hexString(stored.withUnsafeBytes { sha256($0) }), "stored-tag": hexString(Array(stored.suffix(16)))]
        case "owner-record":
            return ["record": hexString(OwnerRecord(owner: try Owner(f("owner"))).encoded())]
        case "name-short", "name-long":
            let key = try NameKey(deriving: try secretBytes(hex(f("name-secret"))))
            let plain = Array(f("plain-name").utf8)
            switch try NameCipher.encrypt(plain, tweak: hex(f("tweak")), key: key) {
            case .short(let stored):
                let nonce = try key.nonce(for: plain, tweak: hex(f("tweak")))
                return ["key-tag": key.tag, "nonce": hexString(nonce), "stored": stored]
            case .long(let stored, let full): return ["key-tag": key.tag, "stored": stored, "full": full]
            case .plain: throw FormatError.unsupported("a name stored plain")
            }
        case "owner-record-encrypted":
            return ["record": hexString(OwnerRecord(owner: try Owner(f("owner")), encryptedClass: ProtectionClass(rawValue: UInt8(f("class"))!)).encoded())]
        default:
            throw FormatError.unsupported("unknown vector \(v.name)")
        }
    }
}

func hex(_ string: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = string.startIndex
    while index < string.endIndex, let next = string.index(index, offsetBy: 2, limitedBy: string.endIndex) {
        bytes.append(UInt8(string[index..<next], radix: 16) ?? 0)
        index = next
    }
    return bytes
}

func hexString(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
