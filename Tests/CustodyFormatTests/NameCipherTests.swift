import CustodyCrypto
@testable import CustodySystem
@testable import CustodyFormat
import Dispatch
import Synchronization
import Glibc
import XCTest

/// Encrypted names and symlink targets: vectors computed independently (Python's `cryptography`
/// AES-GCM and an RFC 5869 HKDF over `hmac`), round trips, long names, and what must not open.
final class NameCipherTests: XCTestCase {
    let tweak = Array(UInt8(0xa0)...UInt8(0xaf))

    func key(_ first: UInt8 = 0) throws -> NameKey {
        try NameKey(deriving: SecretBytes(copying: Array(first..<first &+ 32).withUnsafeBytes { $0 }))
    }

    func testVectors() throws {
        let key = try self.key()
        XCTAssertEqual(key.tag, "PnpDo-")
        XCTAssertEqual(try NameCipher.encrypt(Array("acquisition-plan.txt".utf8), tweak: tweak, key: key),
                       .short("~c3PnpDo-.zqlFxekKklraZCXRHYhr64TFZSmJjqJjDDUBUk2IjwvLDRlV2PYsLb7UhDFRTL2b"))
        XCTAssertEqual(try NameCipher.encrypt(Array("Übersicht 2027 – Entlassungen.xlsx".utf8), tweak: tweak, key: key),
                       .short("~c3PnpDo-.tnCovjEd-TLZ45jq9ZabvNmeKKPgIQIVeisWTpSD6DPdeeNJnd7Re7cWj-3492XI90_QCjlFThiM6F5b11egQqw"))
        guard case .long(let name, let full) = try NameCipher.encrypt([UInt8](repeating: UInt8(ascii: "x"), count: 255), tweak: tweak, key: key) else {
            return XCTFail("a 255-byte name is long when encrypted")
        }
        XCTAssertEqual(name, "~c3PnpDo--yadM391clJydP93EMmzndqvORXEkM03gP63SbJrBXqk")
        XCTAssertEqual(full.utf8.count, 388)
        XCTAssertTrue(full.hasPrefix("~c3PnpDo-.qLoec7OE2o5ViWiSin2b9sgovdSxcI"))
    }

    func testRoundTripsOfEveryKindOfName() throws {
        let key = try self.key()
        var names: [[UInt8]] = [Array("a".utf8), Array("..a".utf8), Array(".git".utf8), Array("日本語のファイル名.txt".utf8),
                                [0xff, 0xfe, 0x41], [UInt8](repeating: 0x7a, count: 255), Array("e\u{301}".utf8)]
        names.append(Array(String(repeating: "é", count: 127).utf8))
        for name in names {
            let stored = try NameCipher.encrypt(name, tweak: tweak, key: key)
            XCTAssertLessThanOrEqual(stored.entryName.count, NameCipher.maxStoredLength)
            XCTAssertFalse(stored.entryName.contains(UInt8(ascii: "/")))
            switch stored {
            case .short(let text): XCTAssertEqual(try NameCipher.decrypt(text, tweak: tweak, key: key), name)
            case .long(let entry, let full): XCTAssertEqual(try NameCipher.decrypt(entry, full: full, tweak: tweak, key: key), name)
            case .plain: XCTFail("encrypted names are never plain")
            }
            XCTAssertEqual(try NameCipher.encrypt(name, tweak: tweak, key: key), stored, "deterministic within a directory")
            // As a listing reads it: split in place, decrypted on the stack.
            if case .short(let text) = stored {
                let listed = try Array(text.utf8).withUnsafeBytes { (bytes) throws -> [UInt8] in
                    let parts = try XCTUnwrap(NameCipher.parts(of: bytes))
                    XCTAssertEqual(Array(parts.tag), Array(key.tag.utf8))
                    XCTAssertTrue(key.hasTag(parts.tag))
                    XCTAssertFalse(try self.key(1).hasTag(parts.tag), "another key's tag")
                    XCTAssertFalse(key.hasTag(UnsafeRawBufferPointer(rebasing: parts.tag.dropLast())), "five bytes")
                    XCTAssertEqual(parts.separator, UInt8(ascii: "."))
                    let asName = try NameCipher.decryptShortName(body: parts.body, associatedData: NameCipher.associatedData(tweak: tweak), key: key)
                    XCTAssertEqual(asName, FileName(bytes: name))
                    XCTAssertEqual(asName.count, name.count)
                    return try NameCipher.decryptShort(body: parts.body, associatedData: NameCipher.associatedData(tweak: tweak), key: key)
                }
                XCTAssertEqual(listed, name)
            }
            // As the mount names an entry: the same name, built as a C string.
            let entry = try name.withUnsafeBytes { bytes in try tweak.withUnsafeBytes { try NameCipher.entryName(of: bytes, tweak: $0, key: key) } }
            XCTAssertEqual(entry.entry.bytes, stored.entryName)
            XCTAssertEqual(entry.entry.cString.last, 0)
            if case .long(_, let full) = stored { XCTAssertEqual(entry.full, full) } else { XCTAssertNil(entry.full) }
        }
        // What must not open read in place is refused too: another directory, a changed byte.
        guard case .short(let text) = try NameCipher.encrypt(Array("report.txt".utf8), tweak: tweak, key: key) else { return XCTFail("short") }
        var changed = Array(text.utf8)
        changed[changed.count - 3] = changed[changed.count - 3] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        for (stored, data) in [(Array(text.utf8), NameCipher.associatedData(tweak: [UInt8](repeating: 3, count: 16))),
                               (changed, NameCipher.associatedData(tweak: tweak)),
                               (Array(text.utf8.dropLast()), NameCipher.associatedData(tweak: tweak))] {
            try stored.withUnsafeBytes { bytes in
                guard let parts = NameCipher.parts(of: bytes) else { return XCTFail("parts") }
                XCTAssertThrowsError(try NameCipher.decryptShort(body: parts.body, associatedData: data, key: key))
            }
        }
        XCTAssertNil(Array("plain.txt".utf8).withUnsafeBytes { NameCipher.parts(of: $0) })
        XCTAssertNil(Array("~c3ab".utf8).withUnsafeBytes { NameCipher.parts(of: $0) })
    }

    func testWhatMustNotOpen() throws {
        let key = try self.key(), other = try self.key(100)
        guard case .short(let stored) = try NameCipher.encrypt(Array("plan.txt".utf8), tweak: tweak, key: key) else { return XCTFail() }
        XCTAssertNotEqual(try NameCipher.encrypt(Array("plan.txt".utf8), tweak: [UInt8](repeating: 1, count: 16), key: key), .short(stored),
                          "another directory: another name")
        XCTAssertThrowsError(try NameCipher.decrypt(stored, tweak: [UInt8](repeating: 1, count: 16), key: key), "moved from another directory")
        XCTAssertThrowsError(try NameCipher.decrypt(stored, tweak: tweak, key: other), "another identity's key")
        var bytes = Array(stored.utf8)
        bytes[20] = bytes[20] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        XCTAssertThrowsError(try NameCipher.decrypt(String(decoding: bytes, as: UTF8.self), tweak: tweak, key: key), "changed")
        XCTAssertThrowsError(try NameCipher.decrypt("plan.txt", tweak: tweak, key: key), "a plain name")
        guard case .long(let entry, let full) = try NameCipher.encrypt([UInt8](repeating: 0x61, count: 200), tweak: tweak, key: key) else { return XCTFail() }
        XCTAssertThrowsError(try NameCipher.decrypt(entry, tweak: tweak, key: key), "the long form is needed")
        guard case .long(_, let otherFull) = try NameCipher.encrypt([UInt8](repeating: 0x62, count: 200), tweak: tweak, key: key) else { return XCTFail() }
        XCTAssertThrowsError(try NameCipher.decrypt(entry, full: otherFull, tweak: tweak, key: key), "another entry's long form")
        XCTAssertEqual(try NameCipher.decrypt(entry, full: full, tweak: tweak, key: key), [UInt8](repeating: 0x61, count: 200))
        for bad in [[UInt8](), Array("a/b".utf8), [0x61, 0], Array(".".utf8), Array("..".utf8), [UInt8](repeating: 0x61, count: 256)] {
            XCTAssertThrowsError(try NameCipher.encrypt(bad, tweak: tweak, key: key), "\(bad)")
        }
        XCTAssertTrue(NameCipher.isReserved(Array("~c3anything".utf8)))
        XCTAssertFalse(NameCipher.isReserved(Array("~c2".utf8)))
        XCTAssertEqual(NameCipher.keyTag(of: stored), key.tag)
        XCTAssertNil(NameCipher.keyTag(of: "plan.txt"))
    }

    func testSymlinkTargets() throws {
        let key = try self.key()
        let target = Array("../Project Falcon/acquisition-plan.txt".utf8)
        let sealed = try NameCipher.sealTarget(target, key: key)
        XCTAssertFalse(sealed.contains("Falcon") || sealed.contains("/"))
        XCTAssertNotEqual(try NameCipher.sealTarget(target, key: key), sealed, "a fresh nonce each time")
        XCTAssertEqual(try NameCipher.openTarget(sealed, key: key), target)
        XCTAssertThrowsError(try NameCipher.openTarget(sealed, key: try self.key(7)))
        guard case .short(let name) = try NameCipher.encrypt(target.filter { $0 != UInt8(ascii: "/") }, tweak: [], key: key) else { return XCTFail() }
        XCTAssertThrowsError(try NameCipher.openTarget(name, key: key), "a name is not a target")
    }

    func testBase64URL() {
        for count in 0..<40 {
            let bytes = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            XCTAssertEqual(Base64URL.decode(Base64URL.encode(bytes)), bytes)
        }
        XCTAssertNil(Base64URL.decode("a"), "a length no encoding has")
        XCTAssertNil(Base64URL.decode("ab+c"), "not the URL alphabet")
        XCTAssertNil(Base64URL.decode("AB"), "bits past the last byte")
        XCTAssertNil(Base64URL.decode("QUJ"), "bits past the last two bytes")
        XCTAssertNil(Base64URL.decode("QUJDa"), "a length no encoding has, after a whole group")
        XCTAssertEqual(Base64URL.decode("QUJDRA"), Array("ABCD".utf8))
        XCTAssertEqual(Base64URL.decode("QUJDREU"), Array("ABCDE".utf8))
        XCTAssertEqual(Base64URL.decode("-_-_"), [0xFB, 0xFF, 0xBF])
        // The buffer forms agree with the array forms, and refuse what they refuse.
        for count in 0..<40 {
            let bytes = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 59 &+ 3) }
            var digits = [UInt8](repeating: 0, count: Base64URL.encodedCount(count))
            let written = bytes.withUnsafeBytes { source in digits.withUnsafeMutableBufferPointer { Base64URL.encode(source, into: $0.baseAddress!) } }
            XCTAssertEqual(written, digits.count)
            XCTAssertEqual(String(decoding: digits, as: UTF8.self), Base64URL.encode(bytes))
            var decoded = [UInt8](repeating: 0, count: count + 3)
            let read = digits.withUnsafeBytes { source in decoded.withUnsafeMutableBufferPointer { Base64URL.decode(source, into: $0.baseAddress!, capacity: count + 3) } }
            XCTAssertEqual(read.map { Array(decoded.prefix($0)) }, bytes)
        }
        for bad in ["a", "ab+c", "AB", "QUJ", "QUJDa"] {
            var out = [UInt8](repeating: 0, count: 8)
            XCTAssertNil(Array(bad.utf8).withUnsafeBytes { source in out.withUnsafeMutableBufferPointer { Base64URL.decode(source, into: $0.baseAddress!, capacity: 8) } }, bad)
        }
        var small = [UInt8](repeating: 0, count: 2)
        XCTAssertNil(Array("QUJDRA".utf8).withUnsafeBytes { source in small.withUnsafeMutableBufferPointer { Base64URL.decode(source, into: $0.baseAddress!, capacity: 2) } },
                     "more than the room given")
    }
}

/// A directory's tweak: made once, kept, the same for two callers at once, and refused when it is
/// not the size a tweak is.
final class DirectoryTweakTests: XCTestCase {
    func testATweakIsMadeOnceAndKept() throws {
        let directory = "/tmp/custody-tweak-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        XCTAssertEqual(mkdir(directory, 0o700), 0)
        defer { rmdir(directory) }
        XCTAssertNil(try DirectoryTweak.read(directory))
        // Two threads racing to make it agree on one.
        let results = Mutex<[[UInt8]]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            let tweak = (try? DirectoryTweak.ensure(directory)) ?? []
            results.withLock { $0.append(tweak) }
        }
        let made = try DirectoryTweak.read(directory)
        XCTAssertEqual(made?.count, NameCipher.tweakSize)
        let seen = results.withLock { $0 }
        XCTAssertEqual(seen.count, 8)
        XCTAssertTrue(seen.allSatisfy { $0 == made }, "\(seen)")
        XCTAssertEqual(try DirectoryTweak.ensure(directory), made)
        // Through an O_PATH descriptor's /proc path, as the mount holds directories.
        let fd = open(directory, Linux.O_PATH | O_DIRECTORY)
        defer { close(fd) }
        XCTAssertEqual(try DirectoryTweak.read("/proc/self/fd/\(fd)"), made)
        // By a descriptor open for reading: the tweak it has is kept; a directory without one gets one.
        let readable = open(directory, O_RDONLY | O_DIRECTORY)
        XCTAssertEqual(try DirectoryTweak.ensure(fd: readable), made)
        close(readable)
        let fresh = directory + "-new"
        XCTAssertEqual(mkdir(fresh, 0o700), 0)
        defer { rmdir(fresh) }
        let freshFD = open(fresh, O_RDONLY | O_DIRECTORY)
        defer { close(freshFD) }
        let madeByFD = try DirectoryTweak.ensure(fd: freshFD)
        XCTAssertEqual(madeByFD.count, NameCipher.tweakSize)
        XCTAssertEqual(try DirectoryTweak.read(fresh), madeByFD)
        XCTAssertEqual(try DirectoryTweak.ensure(fd: freshFD), madeByFD)
        XCTAssertNotEqual(madeByFD, made)
        // A directory just made, by name: in one call where the kernel can, else through a
        // descriptor; either way a tweak that is there is kept.
        let parent = open(directory, O_RDONLY | O_DIRECTORY)
        defer { close(parent) }
        defer { Syscall.noSetxattrat.store(false, ordering: .relaxed) }
        for (index, byDescriptor) in [false, true].enumerated() {
            Syscall.noSetxattrat.store(byDescriptor, ordering: .relaxed)
            let name = "made-\(index)"
            XCTAssertEqual(mkdirat(parent, name, 0o700), 0)
            defer { unlinkat(parent, name, AT_REMOVEDIR) }
            let madeByName = try DirectoryTweak.make(in: parent, named: name)
            XCTAssertEqual(madeByName.count, NameCipher.tweakSize)
            XCTAssertEqual(try DirectoryTweak.read(directory + "/" + name), madeByName, "by descriptor: \(byDescriptor)")
            XCTAssertEqual(try DirectoryTweak.make(in: parent, named: name), madeByName, "kept")
            XCTAssertNotEqual(madeByName, made)
        }
        XCTAssertThrowsError(try DirectoryTweak.make(in: parent, named: "missing"))
        XCTAssertNoThrow(try Syscall.setxattr(directory, DirectoryTweak.attributeName, "short", 5, 0))
        XCTAssertThrowsError(try DirectoryTweak.read(directory), "not a tweak's size")
    }
}
