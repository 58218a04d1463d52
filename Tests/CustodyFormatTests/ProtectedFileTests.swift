@testable import CustodyCrypto
@testable import CustodyFormat
import CustodySystem
import Glibc
import Synchronization
import XCTest
import CustodyTestSupport

final class BlockLayoutTests: XCTestCase {
    func testStoredAndPlaintextSizesAgreeForEverySize() throws {
        for blockSize: UInt32 in [16, 64, 4096] {
            let layout = BlockLayout(blockSize: blockSize)
            let b = UInt64(blockSize)
            for size in UInt64(0)...(3 * b + 5) {
                let stored = layout.storedSize(plaintextSize: size)
                XCTAssertEqual(try layout.plaintextSize(storedSize: stored), size)
            }
            // A body cut inside a block's overhead is impossible.
            XCTAssertThrowsError(try layout.plaintextSize(storedSize: 512 + 10)) { XCTAssertEqual($0 as? FormatError, .corruptLength(522)) }
            XCTAssertThrowsError(try layout.plaintextSize(storedSize: 100))
            XCTAssertEqual(layout.plaintextLength(ofBlock: 1, fileSize: b + 3), 3)
            XCTAssertEqual(layout.plaintextLength(ofBlock: 2, fileSize: b + 3), 0)
        }
    }
}

final class ProtectedFileTests: XCTestCase {
    let owner = try! Owner("Alice@Contoso.com")

    func makeFile(_ content: [UInt8], blockSize: UInt32 = 4096, storage: BlockStorage = MemoryStorage(), classKey: ClassKey? = nil) throws -> ProtectedFile {
        let file = try ProtectedFile.create(on: storage, owner: owner, protectionClass: .complete,
                                            classKey: try classKey ?? symmetricClassKey(), blockSize: blockSize)
        if !content.isEmpty { try file.write(content, at: 0) }
        return file
    }

    func reopen(_ bytes: [UInt8], classKey: ClassKey? = nil) throws -> ProtectedFile {
        let key = try classKey ?? symmetricClassKey()
        return try ProtectedFile.open(MemoryStorage(bytes)) { _ in key }
    }

    /// A fresh open of a copy of `storage`, its hole record included.
    func reopen(_ storage: MemoryStorage, classKey: ClassKey? = nil) throws -> ProtectedFile {
        let key = try classKey ?? symmetricClassKey()
        return try ProtectedFile.open(storage.copy()) { _ in key }
    }

    func testRoundTripAndPlaintextSizeFromStoredSize() throws {
        let content = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 * 31) }
        let storage = MemoryStorage()
        let file = try makeFile(content, storage: storage)
        XCTAssertEqual(file.size, 10_000)
        let stored = storage.bytes
        XCTAssertEqual(stored.count, 512 + 2 * 4124 + (10_000 - 8192) + 28)
        XCTAssertEqual(try BlockLayout().plaintextSize(storedSize: UInt64(stored.count)), 10_000)
        XCTAssertNil(stored.firstRange(of: Array(content[100..<132])), "no plaintext run is stored")
        let again = try reopen(stored)
        XCTAssertEqual(try again.readAll(), content)
        XCTAssertEqual(try again.read(10, at: 4090), Array(content[4090..<4100]))
        XCTAssertEqual(try again.read(100, at: 9_950), Array(content[9_950...]))
        XCTAssertEqual(try again.read(100, at: 10_000), [])
        XCTAssertEqual(again.header.owner, owner)
        // Same plaintext, fresh nonces: the ciphertext differs.
        XCTAssertNotEqual(try makeFile(content).storage.size(), 0)
        XCTAssertNotEqual((try makeFile(content).storage as! MemoryStorage).bytes, stored)
    }

    /// A new file starts empty, whether it replaces stored bytes (which are cut, and whose hole
    /// record goes) or is made on storage the caller knows to be empty.
    func testCreateStartsEmptyOverOldContentAndOnEmptyStorage() throws {
        let old = MemoryStorage([UInt8](repeating: 0xAB, count: 9_000), holeRecord: [1, 2, 3])
        let replaced = try ProtectedFile.create(on: old, owner: owner, protectionClass: .complete, classKey: try symmetricClassKey())
        XCTAssertEqual(replaced.size, 0)
        XCTAssertEqual(old.bytes.count, 512, "the header alone")
        XCTAssertNil(try old.readHoleRecord())
        let empty = MemoryStorage()
        let fresh = try ProtectedFile.create(on: empty, owner: owner, protectionClass: .complete, classKey: try symmetricClassKey(),
                                             storageIsEmpty: true)
        XCTAssertEqual(fresh.size, 0)
        for (file, storage) in [(replaced, old), (fresh, empty)] {
            try file.write(Array("hello".utf8), at: 0)
            XCTAssertEqual(file.size, 5)
            XCTAssertEqual(storage.bytes.count, 512 + 5 + 28)
            XCTAssertEqual(try reopen(storage.bytes).readAll(), Array("hello".utf8))
        }
    }

    /// Flip every byte of a small encrypted file, one at a time: each read fails with the error
    /// that names the damaged part, and never returns plaintext.
    func testEveryFlippedByteIsDetected() throws {
        let content = (0..<200).map { UInt8(truncatingIfNeeded: $0) }
        let storage = MemoryStorage()
        _ = try makeFile(content, blockSize: 64, storage: storage)
        let stored = storage.bytes
        XCTAssertEqual(stored.count, 512 + 3 * 92 + 8 + 28)
        let key = try symmetricClassKey()
        for index in stored.indices {
            var damaged = stored
            damaged[index] ^= 0x01
            var result: Result<[UInt8], FormatError>
            do {
                let file = try ProtectedFile.open(MemoryStorage(damaged)) { _ in key }
                result = .success(try file.readAll())
            } catch let error as FormatError {
                result = .failure(error)
            }
            guard case .failure(let error) = result else {
                XCTFail("flipping byte \(index) went unnoticed")
                continue
            }
            switch index {
            case 0..<8: XCTAssertEqual(error, .notProtected, "byte \(index)")
            case 8:
                // Version 3, which must not name its owner.
                if case .corruptHeader = error {} else { XCTFail("byte 8: \(error)") }
            case 9: XCTAssertEqual(error, .unsupportedVersion(258), "byte \(index)")
            case 40..<48: XCTAssertEqual(error, .wrongKey(keyID: { var id = [UInt8]([1, 2, 3, 4, 5, 6, 7, 8]); id[index - 40] ^= 1; return id }()), "byte \(index)")
            case 440..<500: XCTAssertEqual(error, .headerAuthenticationFailed, "byte \(index)")
            case 10..<512:
                let headerLevel: Bool
                switch error {
                case .headerAuthenticationFailed, .corruptHeader, .unsupported: headerLevel = true
                default: headerLevel = false
                }
                XCTAssertTrue(headerLevel, "byte \(index): \(error)")
            default:
                let block = UInt64((index - 512) / 92)
                XCTAssertEqual(error, .blockAuthenticationFailed(index: block), "byte \(index)")
            }
        }
    }

    func testSwappedMovedAndGraftedBlocksAreDetected() throws {
        let a = (0..<400).map { UInt8(truncatingIfNeeded: $0) }
        let storageA = MemoryStorage(), storageB = MemoryStorage()
        _ = try makeFile(a, blockSize: 64, storage: storageA)
        _ = try makeFile(a, blockSize: 64, storage: storageB)
        let x = storageA.bytes, y = storageB.bytes
        let blockRange = { (i: Int) in (512 + i * 92)..<(512 + (i + 1) * 92) }

        var swapped = x
        swapped.replaceSubrange(blockRange(1), with: x[blockRange(2)])
        swapped.replaceSubrange(blockRange(2), with: x[blockRange(1)])
        XCTAssertThrowsError(try reopen(swapped).readAll()) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 1)) }

        var foreign = x
        foreign.replaceSubrange(blockRange(3), with: y[blockRange(3)])
        XCTAssertThrowsError(try reopen(foreign).readAll()) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 3)) }

        let grafted = Array(x[0..<512]) + Array(y[512...])
        XCTAssertThrowsError(try reopen(grafted).readAll()) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 0)) }

        // Cut at a block boundary: the last block left was not written as final.
        let cut = Array(x[0..<(512 + 3 * 92)])
        let shortened = try reopen(cut)
        XCTAssertEqual(shortened.size, 192)
        XCTAssertThrowsError(try shortened.readAll()) { XCTAssertEqual($0 as? FormatError, .truncated(lastBlock: 2)) }
        XCTAssertEqual(try shortened.read(64, at: 0), Array(a[0..<64]), "blocks before the cut still read")
        // Cut inside a block's overhead: the length itself is impossible.
        XCTAssertThrowsError(try reopen(Array(x[0..<(512 + 92 + 20)]))) {
            XCTAssertEqual($0 as? FormatError, .corruptLength(UInt64(512 + 92 + 20)))
        }
        // A final block cut short (but still longer than the overhead) fails to authenticate.
        XCTAssertThrowsError(try reopen(Array(x.dropLast(3))).readAll()) {
            XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 6))
        }
    }

    func testWrongKeyAndLockedClassB() throws {
        let stored = (try makeFile([1, 2, 3]).storage as! MemoryStorage).bytes
        XCTAssertThrowsError(try reopen(stored, classKey: try symmetricClassKey(0x12))) {
            XCTAssertEqual($0 as? FormatError, .headerAuthenticationFailed)
        }
        let (locked, _, _) = try classBKey(unlocked: false)
        let (unlocked, _, _) = try classBKey(unlocked: true)
        let storage = MemoryStorage()
        let created = try ProtectedFile.create(on: storage, owner: owner, protectionClass: .completeUnlessOpen, classKey: locked)
        try created.write(Array("written while locked".utf8), at: 0)
        XCTAssertEqual(try created.readAll(), Array("written while locked".utf8), "the creating handle keeps working")
        XCTAssertThrowsError(try ProtectedFile.open(MemoryStorage(storage.bytes)) { _ in locked })
        XCTAssertEqual(try ProtectedFile.open(MemoryStorage(storage.bytes)) { _ in unlocked }.readAll(), Array("written while locked".utf8))
    }

    func testHolesReadAsZerosAndStaySparse() throws {
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        let file = try makeFile([], storage: DescriptorStorage(fd: fd))
        try file.write(Array("head".utf8), at: 0)
        try file.write(Array("tail".utf8), at: 64 << 20)
        XCTAssertEqual(file.size, (64 << 20) + 4)
        let st = try Syscall.fstat(fd)
        XCTAssertLessThan(st.st_blocks, 256, "64 MiB of hole are not stored")
        XCTAssertEqual(try file.read(8, at: 0), Array("head".utf8) + [0, 0, 0, 0])
        XCTAssertEqual(try file.read(16, at: 32 << 20), [UInt8](repeating: 0, count: 16))
        XCTAssertEqual(try file.read(8, at: (64 << 20) - 4), [0, 0, 0, 0] + Array("tail".utf8))
        // Growing by truncate leaves a hole too, and the new size is authenticated.
        try file.truncate(to: 128 << 20)
        XCTAssertEqual(try file.read(4, at: (128 << 20) - 4), [0, 0, 0, 0])
        let reopened = try ProtectedFile.open(DescriptorStorage(fd: fd)) { _ in try! symmetricClassKey() }
        XCTAssertEqual(reopened.size, 128 << 20)
        XCTAssertEqual(try reopened.read(4, at: 64 << 20), Array("tail".utf8))
        // A zeroed final block is not a hole: it is tampering. Nor, in a version 2 file, is a
        // zeroed non-final block that its hole record does not list; version 1 reads it as zeros.
        let storage = MemoryStorage()
        _ = try makeFile([UInt8](repeating: 7, count: 100), blockSize: 64, storage: storage)
        var bytes = storage.bytes
        bytes.replaceSubrange(512..<(512 + 92), with: [UInt8](repeating: 0, count: 92))
        XCTAssertThrowsError(try reopen(bytes).read(64, at: 0), "a zeroed non-final block is reported") {
            XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 0))
        }
        bytes.replaceSubrange((512 + 92)..., with: [UInt8](repeating: 0, count: 36 + 28))
        XCTAssertThrowsError(try reopen(bytes).read(10, at: 64)) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 1)) }
        let version1 = MemoryStorage()
        let key = try symmetricClassKey()
        let header = try FileHeader.encrypted(owner: owner, protectionClass: .complete, classKey: key, fileKey: try secretBytes([UInt8](repeating: 3, count: 32)),
                                              blockSize: 64, version: 1)
        try version1.writeBytes(header.encoded(), at: 0)
        let old = try ProtectedFile(storage: version1, header: header, fileKey: try secretBytes([UInt8](repeating: 3, count: 32)))
        try old.write([UInt8](repeating: 7, count: 100), at: 0)
        var oldBytes = version1.bytes
        oldBytes.replaceSubrange(512..<(512 + 92), with: [UInt8](repeating: 0, count: 92))
        XCTAssertEqual(try ProtectedFile.open(MemoryStorage(oldBytes)) { _ in key }.read(64, at: 0), [UInt8](repeating: 0, count: 64),
                       "version 1: a zeroed non-final block reads as a hole (documented)")
    }

    /// Version 2: holes are listed in the file's hole record, which is authenticated; zeros
    /// anywhere else, a missing or altered record, all read as errors, and the backing file stays
    /// sparse. Filling a hole takes it off the list; cutting the file drops the holes past its end.
    func testHolesAreListedAndZeroedBlocksAreDamage() throws {
        let storage = MemoryStorage()
        let file = try makeFile([], blockSize: 64, storage: storage)
        try file.write([UInt8](repeating: 1, count: 64), at: 0)
        try file.write([UInt8](repeating: 2, count: 64), at: 64 * 10)     // blocks 1..<10 are holes
        try file.truncate(to: 64 * 20 + 5)                                  // blocks 11..<20 too
        XCTAssertNotNil(try storage.readHoleRecord())
        let key = try symmetricClassKey()
        func reopened(_ storage: MemoryStorage) throws -> ProtectedFile { try ProtectedFile.open(storage) { _ in key } }
        XCTAssertEqual(try reopened(storage.copy()).read(64 * 9, at: 64), [UInt8](repeating: 0, count: 64 * 9))
        XCTAssertEqual(try reopened(storage.copy()).read(64, at: 64 * 15), [UInt8](repeating: 0, count: 64))
        // Zeroing a data block: an error, the holes around it still read.
        var damaged = storage.copy()
        try damaged.writeBytes([UInt8](repeating: 0, count: 92), at: 512)
        XCTAssertThrowsError(try reopened(damaged).read(64, at: 0))
        XCTAssertEqual(try reopened(damaged).read(64, at: 64 * 5), [UInt8](repeating: 0, count: 64))
        // No record, or an altered one: no holes at all.
        damaged = MemoryStorage(storage.bytes)
        XCTAssertThrowsError(try reopened(damaged).read(64, at: 64 * 5))
        var record = try XCTUnwrap(try storage.readHoleRecord())
        record[6] ^= 1
        damaged = MemoryStorage(storage.bytes, holeRecord: record)
        XCTAssertThrowsError(try reopened(damaged).read(64, at: 64 * 5))
        // Filling a hole: listed no more, so zeroing it later is noticed.
        try file.write([UInt8](repeating: 3, count: 64), at: 64 * 5)
        damaged = storage.copy()
        try damaged.writeBytes([UInt8](repeating: 0, count: 92), at: 512 + 5 * 92)
        XCTAssertThrowsError(try reopened(damaged).read(64, at: 64 * 5))
        XCTAssertEqual(try reopened(storage.copy()).read(64, at: 64 * 4), [UInt8](repeating: 0, count: 64))
        // Cutting: no holes past the end; a file with none has no record.
        try file.truncate(to: 64 * 2)
        try file.truncate(to: 64)
        XCTAssertNil(try storage.readHoleRecord())
        XCTAssertEqual(try reopened(storage.copy()).readAll(), [UInt8](repeating: 1, count: 64))
    }

    func testTruncateShrinkAndGrowKeepContent() throws {
        let content = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let storage = MemoryStorage()
        let file = try makeFile(content, blockSize: 64, storage: storage)
        try file.truncate(to: 130)
        XCTAssertEqual(try file.readAll(), Array(content[0..<130]))
        XCTAssertEqual(try storage.size(), BlockLayout(blockSize: 64).storedSize(plaintextSize: 130))
        try file.truncate(to: 128)
        XCTAssertEqual(try reopen(storage).readAll(), Array(content[0..<128]))
        try file.truncate(to: 300)
        XCTAssertEqual(try reopen(storage).readAll(), Array(content[0..<128]) + [UInt8](repeating: 0, count: 172))
        try file.truncate(to: 0)
        XCTAssertEqual(try storage.size(), 512)
        XCTAssertEqual(try reopen(storage).readAll(), [])
        try file.truncate(to: 5)
        XCTAssertEqual(try reopen(storage).readAll(), [0, 0, 0, 0, 0])
    }

    /// Random writes, truncates and reads against an in-memory model, on memory and on a real file,
    /// with a small block size (many boundaries) and the default one. Reopens now and then.
    func testRandomOperationsMatchAModel() throws {
        let seed = ProcessInfo.processInfo.environment["FORMAT_SEED"].flatMap(UInt64.init) ?? UInt64.random(in: 1...UInt64(UInt32.max))
        var random = SeededGenerator(seed: seed)
        for (blockSize, steps) in [(UInt32(64), 1500), (UInt32(4096), 600)] {
            let (fd, path) = try temporaryFile()
            defer { close(fd); unlink(path) }
            for storage in [MemoryStorage() as BlockStorage, DescriptorStorage(fd: fd)] {
                var file = try makeFile([], blockSize: blockSize, storage: storage)
                var model: [UInt8] = []
                let span = Int(blockSize) * 12
                for step in 0..<steps {
                    let context = "seed \(seed) block \(blockSize) step \(step) (replay with FORMAT_SEED=\(seed))"
                    switch Int.random(in: 0..<10, using: &random) {
                    case 0..<5:
                        let offset = Int.random(in: 0..<span, using: &random)
                        let count = Int.random(in: 1...(Int(blockSize) * 3), using: &random)
                        let data = (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) }
                        try file.write(data, at: UInt64(offset))
                        if model.count < offset + count { model += [UInt8](repeating: 0, count: offset + count - model.count) }
                        model.replaceSubrange(offset..<(offset + count), with: data)
                    case 5..<7:
                        let size = Int.random(in: 0..<span, using: &random)
                        try file.truncate(to: UInt64(size))
                        if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
                    case 7..<9:
                        let offset = Int.random(in: 0..<span, using: &random)
                        let count = Int.random(in: 1...(Int(blockSize) * 4), using: &random)
                        let expected = offset < model.count ? Array(model[offset..<min(model.count, offset + count)]) : []
                        XCTAssertEqual(try file.read(count, at: UInt64(offset)), expected, context)
                    default:
                        file = try ProtectedFile.open(storage) { _ in try! symmetricClassKey() }
                    }
                    XCTAssertEqual(file.size, UInt64(model.count), context)
                    if file.size != UInt64(model.count) { return }
                }
                XCTAssertEqual(try file.readAll(), model, "seed \(seed)")
                XCTAssertEqual(try BlockLayout(blockSize: blockSize).plaintextSize(storedSize: storage.size()), UInt64(model.count))
            }
        }
    }

    /// Eight writers rewrite distinct blocks while readers check that no block is ever torn
    /// (each write fills whole blocks with one byte value).
    func testConcurrentWritersAndReadersNeverSeeTornBlocks() throws {
        let blockSize = 4096, blocks = 64
        let file = try makeFile([UInt8](repeating: 0, count: blockSize * blocks))
        nonisolated(unsafe) var torn = 0
        let tornLock = NSLock()
        DispatchQueue.concurrentPerform(iterations: 12) { worker in
            var random = SeededGenerator(seed: UInt64(worker + 1))
            for _ in 0..<150 {
                if worker < 8 {
                    // Writer: blocks worker, worker+8, ... (distinct per writer), one to three at a time.
                    let first = worker + 8 * Int.random(in: 0..<(blocks / 8 - 2), using: &random)
                    let value = UInt8.random(in: 1...255, using: &random)
                    try? file.write([UInt8](repeating: value, count: blockSize), at: UInt64(first * blockSize))
                } else {
                    let offset = Int.random(in: 0..<(blocks - 4), using: &random) * blockSize
                    guard let data = try? file.read(blockSize * 4, at: UInt64(offset)) else {
                        tornLock.lock(); torn += 1; tornLock.unlock()
                        continue
                    }
                    for block in 0..<4 {
                        let slice = data[(block * blockSize)..<((block + 1) * blockSize)]
                        if Set(slice).count != 1 { tornLock.lock(); torn += 1; tornLock.unlock() }
                    }
                }
            }
        }
        XCTAssertEqual(torn, 0)
    }

    /// Found by the fuzzer: an open that fails after the header (an impossible stored length) must
    /// not leak the file's lock storage.
    func testFailedOpensDoNotLeak() throws {
        func residentKiB() -> Int {
            let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
        }
        let key = try symmetricClassKey()
        let storage = MemoryStorage()
        _ = try ProtectedFile.create(on: storage, owner: try Owner("a@b"), protectionClass: .complete, classKey: key)
        let broken = storage.bytes + [1, 2, 3]  // a body shorter than one block's overhead
        for _ in 0..<2000 { _ = try? ProtectedFile.open(MemoryStorage(broken)) { _ in key } }
        let before = residentKiB()
        for _ in 0..<50_000 {
            XCTAssertThrowsError(try ProtectedFile.open(MemoryStorage(broken)) { _ in key })
        }
        XCTAssertLessThan(residentKiB() - before, 20_000, "50,000 failed opens grew RSS by more than 20 MB")
    }

    func testLargeWritesUseEveryCoreAndRoundTrip() throws {
        let content = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 2654435761 >> 13) }
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        let file = try makeFile([], storage: DescriptorStorage(fd: fd))
        try file.write(content, at: 100)
        let again = try ProtectedFile.open(DescriptorStorage(fd: fd)) { _ in try! symmetricClassKey() }
        XCTAssertEqual(try again.read(content.count, at: 100), content)
        XCTAssertEqual(try again.read(100, at: 0), [UInt8](repeating: 0, count: 100))
    }
}

final class ProtectedDataTests: XCTestCase {
    func testManagedUnmanagedAndUnprotectedBuffers() throws {
        let key = try symmetricClassKey()
        let message = Array("quarterly numbers".utf8)
        let sealed = try ProtectedData.encrypt(message, owner: try Owner("Alice@Contoso.com"), protectionClass: .complete, classKey: key)
        XCTAssertNil(sealed.firstRange(of: message))
        XCTAssertEqual(try ProtectedData.header(of: sealed)?.owner?.canonical, "alice@contoso.com")
        XCTAssertEqual(try ProtectedData.unprotect(sealed) { _ in key }, message)
        // What the daemon writes names no owner: the class key ID is all that says whose it is.
        let hidden = try ProtectedData.encrypt(message, owner: nil, protectionClass: .complete, classKey: key)
        let header = try XCTUnwrap(try ProtectedData.header(of: hidden))
        XCTAssertEqual(header.version, 3)
        XCTAssertNil(header.owner)
        XCTAssertEqual(header.classKeyID, key.id)
        XCTAssertNil(hidden.firstRange(of: Array("contoso".utf8)))
        XCTAssertEqual(try ProtectedData.unprotect(hidden) { _ in key }, message)
        // A version 3 header that names an owner, or a version 2 one that does not, is not written.
        XCTAssertThrowsError(try FileHeader.encrypted(owner: try Owner("a@b.c"), protectionClass: .complete, classKey: key,
                                                      fileKey: try SecretBytes.random(count: 32), version: 3))
        XCTAssertThrowsError(try FileHeader.encrypted(owner: nil, protectionClass: .complete, classKey: key,
                                                      fileKey: try SecretBytes.random(count: 32), version: 2))

        let tagged = try ProtectedData.tag(message, owner: try Owner("Bob@Personal.example"))
        XCTAssertEqual(Array(tagged[512...]), message, "unmanaged data stays plain after the header")
        XCTAssertEqual(try ProtectedData.header(of: tagged)?.kind, .plain)
        XCTAssertEqual(try ProtectedData.unprotect(tagged) { _ in key }, message)

        XCTAssertNil(try ProtectedData.header(of: message))
        XCTAssertEqual(try ProtectedData.unprotect(message) { _ in key }, message, "unprotected input comes back unchanged")

        var damaged = sealed
        damaged[damaged.count - 1] ^= 1
        XCTAssertThrowsError(try ProtectedData.unprotect(damaged) { _ in key }) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 0)) }
        XCTAssertEqual(try ProtectedData.encrypt([], owner: try Owner("a@b"), protectionClass: .none, classKey: key).count, 512)
    }
}

/// Storage in memory that records the read-ahead hints it gets.
private final class HintRecordingStorage: BlockStorage, @unchecked Sendable {
    let inner = MemoryStorage()
    private let hints = Mutex<[(offset: UInt64, length: UInt64)]>([])
    var recorded: [(offset: UInt64, length: UInt64)] { hints.withLock { $0 } }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int { try inner.read(into: buffer, at: offset) }
    func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) { try inner.write(data, at: offset) }
    func size() throws(FormatError) -> UInt64 { try inner.size() }
    func truncate(to size: UInt64) throws(FormatError) { try inner.truncate(to: size) }
    func sync() throws(FormatError) { try inner.sync() }
    func willRead(at offset: UInt64, length: UInt64) { hints.withLock { $0.append((offset, length)) } }
}

final class ProtectedFilePrefetchTests: XCTestCase {
    func testLargeReadsAskForTheNextStretchAndSmallOnesDoNot() throws {
        let storage = HintRecordingStorage()
        let file = try ProtectedFile.create(on: storage, owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey())
        let content = UnsafeMutableRawBufferPointer.allocate(byteCount: 3 << 20, alignment: 16)
        defer { content.deallocate() }
        for index in 0..<content.count { content[index] = UInt8(truncatingIfNeeded: index &* 31) }
        try file.write(UnsafeRawBufferPointer(content), at: 0)
        let layout = BlockLayout(blockSize: file.header.blockSize)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }

        // A 4 KiB read: no hint.
        _ = try file.read(into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<4096]), at: 8192)
        XCTAssertTrue(storage.recorded.isEmpty)

        // 1 MiB at 1 MiB: the next stored stretch (as long as this one) is announced; bytes are right.
        XCTAssertEqual(try file.read(into: buffer, at: 1 << 20), 1 << 20)
        XCTAssertTrue(buffer.elementsEqual(content[(1 << 20)..<(2 << 20)]))
        let start = layout.storedOffset(ofBlock: (1 << 20) / layout.blockSize)
        let end = layout.storedOffset(ofBlock: (2 << 20) / layout.blockSize)
        XCTAssertEqual(storage.recorded.count, 1)
        XCTAssertEqual(storage.recorded.first?.offset, end)
        XCTAssertEqual(storage.recorded.first?.length, end - start)

        // The last MiB: nothing after it to fetch.
        _ = try file.read(into: buffer, at: 2 << 20)
        XCTAssertEqual(storage.recorded.count, 1)
    }
}

final class ProtectedFileMappingTests: XCTestCase {
    func mapsOf(_ path: String) throws -> Int {
        let maps = try String(contentsOfFile: "/proc/self/maps", encoding: .utf8)
        return maps.split(separator: "\n").filter { $0.hasSuffix(" " + path) }.count
    }

    func testSmallReadsOfALargeFileComeFromAMappingAndAgreeWithTheFile() throws {
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        var generator = SeededGenerator(seed: 0x6D61_7070)
        var model = (0..<(2 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ ($0 >> 12)) }
        var file: ProtectedFile? = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: try Owner("a@b"), protectionClass: .complete,
                                                            classKey: try symmetricClassKey())
        try file!.write(model, at: 0)
        func check(_ count: Int, at offset: Int) throws {
            let expected = offset < model.count ? Array(model[offset..<min(model.count, offset + count)]) : []
            XCTAssertEqual(try file!.read(count, at: UInt64(offset)), expected, "\(count) bytes at \(offset)")
        }

        // A large read uses pread; the first small one maps the file.
        XCTAssertEqual(try file!.read(1 << 20, at: 0), Array(model[0..<(1 << 20)]))
        XCTAssertEqual(try mapsOf(path), 0)
        for _ in 0..<300 { try check(Int.random(in: 1...9000, using: &generator), at: Int.random(in: 0..<model.count, using: &generator)) }
        XCTAssertEqual(try mapsOf(path), 1)

        // Writes in place are seen; growth past the mapping (2 × the size) gets a new one.
        let patch = (0..<5000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try file!.write(patch, at: 4000)
        model.replaceSubrange(4000..<9000, with: patch)
        try check(6000, at: 3500)
        let tail = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try file!.write(tail, at: 9 << 20)
        model += [UInt8](repeating: 0, count: (9 << 20) - model.count) + tail
        try check(4096, at: 9 << 20)
        try check(8192, at: (9 << 20) - 4096)
        try check(100, at: 5 << 20)
        XCTAssertEqual(try mapsOf(path), 1, "the old mapping went away with its last reader")

        // Shrinking: nothing is read past the new end, and what is left is right.
        try file!.truncate(to: 1_500_000)
        model.removeLast(model.count - 1_500_000)
        try check(4096, at: 1_499_000)
        try check(4096, at: 1_600_000)
        for _ in 0..<100 { try check(Int.random(in: 1...4096, using: &generator), at: Int.random(in: 0..<model.count, using: &generator)) }

        // Cut underneath by someone else: reads past the cut fail cleanly (no SIGBUS), reads before it work.
        let layout = BlockLayout()
        let other = open(path, O_RDWR)
        XCTAssertGreaterThanOrEqual(other, 0)
        XCTAssertEqual(ftruncate(other, off_t(layout.storedOffset(ofBlock: 100))), 0)
        close(other)
        XCTAssertThrowsError(try file!.read(4096, at: 200 * 4096)) { XCTAssertEqual($0 as? FormatError, .corruptLength(layout.storedOffset(ofBlock: 200))) }
        try check(4096, at: 10 * 4096)

        file = nil
        XCTAssertEqual(try mapsOf(path), 0, "the mapping goes with the file")
    }

    func testSmallFilesAndMemoryStorageAreNotMapped() throws {
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        let content = (0..<((1 << 20) - 1)).map { UInt8(truncatingIfNeeded: $0 &* 3) }
        let file = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: try Owner("a@b"), protectionClass: .complete,
                                            classKey: try symmetricClassKey())
        try file.write(content, at: 0)
        XCTAssertEqual(try file.read(100, at: 5000), Array(content[5000..<5100]))
        XCTAssertEqual(try mapsOf(path), 0)
        let inMemory = try ProtectedFile.create(on: MemoryStorage(), owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey())
        try inMemory.write(content + content, at: 0)
        XCTAssertEqual(try inMemory.read(100, at: 5000), Array(content[5000..<5100]))
    }
}

final class ProtectedFileMappedReadTests: XCTestCase {
    func testMappedAndUnmappedReadsOfHolesAndATamperedBlock() throws {
        let (fd, path) = try temporaryFile()
        defer { close(fd); unlink(path) }
        var generator = SeededGenerator(seed: 0x1A26_E5ED)
        let file = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: try Owner("a@b"), protectionClass: .complete,
                                            classKey: try symmetricClassKey())
        var model = (0..<(3 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try file.write(model, at: 0)
        // A hole: written past the end, the blocks between read as zeros.
        try file.write([1, 2, 3], at: 6 << 20)
        model += [UInt8](repeating: 0, count: (6 << 20) - model.count) + [1, 2, 3]
        for (offset, count) in [(0, 1 << 20), (4096 * 3 + 17, 700_000), (2 << 20, 3 << 20), ((6 << 20) - 5000, 9000), (5, 100)] {
            let end = min(model.count, offset + count)
            XCTAssertEqual(try file.read(count, at: UInt64(offset)), Array(model[offset..<end]), "\(count) at \(offset)")
        }

        // A flipped byte in a stored block: the mapped read fails over to pread, which names the block.
        let layout = BlockLayout()
        var byte: UInt8 = 0
        let target = off_t(layout.storedOffset(ofBlock: 300) + 100)
        XCTAssertEqual(pread(fd, &byte, 1, target), 1)
        byte ^= 0x40
        XCTAssertEqual(pwrite(fd, &byte, 1, target), 1)
        XCTAssertThrowsError(try file.read(2 << 20, at: 0)) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 300)) }
        XCTAssertThrowsError(try file.read(10, at: 300 * 4096 + 5)) { XCTAssertEqual($0 as? FormatError, .blockAuthenticationFailed(index: 300)) }
        XCTAssertEqual(try file.read(4096, at: 301 * 4096), Array(model[(301 * 4096)..<(302 * 4096)]))
    }
}

/// Memory that holds at most `capacity` bytes: a write past it stores what fits, then fails with
/// ENOSPC, as a full disk does (a short write, then the error).
final class FullDiskStorage: BlockStorage, @unchecked Sendable {
    let memory = MemoryStorage()
    var capacity: UInt64
    /// Whether it can reserve space (fallocate), or only fails part-way.
    let reserves: Bool
    private(set) var reservations = 0

    init(capacity: UInt64, reserves: Bool) {
        self.capacity = capacity
        self.reserves = reserves
    }

    func reserve(at offset: UInt64, length: UInt64) throws(FormatError) {
        guard reserves else { return }
        reservations += 1
        if offset + length > capacity { throw .io(Errno(ENOSPC)) }
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int { try memory.read(into: buffer, at: offset) }
    /// Fails the next write after this many bytes, wherever it is (a hole filling up).
    var failNextWriteAfter: Int?

    func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) {
        if let limit = failNextWriteAfter {
            failNextWriteAfter = nil
            try memory.write(UnsafeRawBufferPointer(rebasing: data[0..<min(limit, data.count)]), at: offset)
            throw .io(Errno(ENOSPC))
        }
        let end = offset + UInt64(data.count)
        guard end > capacity else { return try memory.write(data, at: offset) }
        if offset < capacity { try memory.write(UnsafeRawBufferPointer(rebasing: data[0..<Int(capacity - offset)]), at: offset) }
        throw .io(Errno(ENOSPC))
    }
    func size() throws(FormatError) -> UInt64 { try memory.size() }
    func punchHole(at offset: UInt64, length: UInt64) throws(FormatError) { try memory.punchHole(at: offset, length: length) }
    func readHoleRecord() throws(FormatError) -> [UInt8]? { try memory.readHoleRecord() }
    func writeHoleRecord(_ record: [UInt8]?) throws(FormatError) { try memory.writeHoleRecord(record) }
    func truncate(to size: UInt64) throws(FormatError) { try memory.truncate(to: size) }
    func sync() throws(FormatError) {}
}

final class FullDiskTests: XCTestCase {
    /// A growing write that runs out of space leaves a file that reads cleanly up to the last
    /// whole block stored, with that size, from the same object and from a fresh open; after space
    /// is freed, writing goes on.
    func testAWriteThatFillsTheDiskLeavesAReadablePrefix() throws {
        try check(reserving: true)
        try check(reserving: false)
    }

    /// The kernel writes back pages in any order, so a write can land in a hole below the end and
    /// fail there part-way: the torn block becomes a hole again, the rest is untouched.
    func testAFailedWriteIntoAHoleLeavesAHole() throws {
        let layout = BlockLayout()
        let storage = FullDiskStorage(capacity: .max, reserves: false)
        let file = try ProtectedFile.create(on: storage, owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey())
        let head = [UInt8](repeating: 1, count: 8192), tail = [UInt8](repeating: 9, count: 5000)
        try file.write(head, at: 0)
        try file.write(tail, at: 9 * 4096)
        storage.failNextWriteAfter = Int(layout.storedBlockSize) + 1500
        XCTAssertThrowsError(try file.write([UInt8](repeating: 5, count: 4 * 4096), at: 3 * 4096))
        var expected = head + [UInt8](repeating: 0, count: 7 * 4096) + tail
        expected.replaceSubrange((3 * 4096)..<(4 * 4096), with: [UInt8](repeating: 5, count: 4096))
        XCTAssertEqual(file.size, UInt64(9 * 4096 + 5000))
        XCTAssertEqual(try file.readAll(), expected, "block 3 was stored whole, block 4 is a hole again")
    }

    func check(reserving: Bool) throws {
        let layout = BlockLayout()
        var generator = SeededGenerator(seed: 21)
        for (existing, writeAt, writeLength, capacityBlocks) in [
            (0, 0, 100_000, 10), (10_000, 10_000, 200_000, 20), (5_000, 60_000, 50_000, 14), (4096 * 3, 4096 * 3, 40_000, 3),
            (7_000, 7_000, 30_000, 1), (0, 0, 5_000, 0), (9_000, 9_000, 9_000, 2), (0, 0, 600_000, 40), (5_000, 8_192, 300_000, 30),
        ] as [(Int, Int, Int, UInt64)] {
            let label = "existing \(existing), write \(writeLength) at \(writeAt), room for \(capacityBlocks) blocks, reserving \(reserving)"
            let storage = FullDiskStorage(capacity: .max, reserves: reserving)
            let file = try ProtectedFile.create(on: storage, owner: try Owner("a@b"), protectionClass: .complete, classKey: try symmetricClassKey())
            let before = (0..<existing).map { _ in UInt8.random(in: 0...255, using: &generator) }
            if !before.isEmpty { try file.write(before, at: 0) }
            // Room for the header, `capacityBlocks` whole blocks, and a torn part of the next one.
            storage.capacity = max(try storage.size(), layout.headerLength + capacityBlocks * layout.storedBlockSize + 1000)
            let data = (0..<writeLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
            XCTAssertThrowsError(try file.write(data, at: UInt64(writeAt)), label) { error in
                guard case .io(let errno)? = error as? FormatError else { return XCTFail("\(label): \(error)") }
                XCTAssertEqual(errno, Errno(ENOSPC), label)
            }
            var model = before
            if model.count < writeAt + writeLength { model += [UInt8](repeating: 0, count: writeAt + writeLength - model.count) }
            model.replaceSubrange(writeAt..<(writeAt + writeLength), with: data)
            let size = Int(file.size)
            XCTAssertTrue(size == existing || size % 4096 == 0, "\(label): size \(size) is the old size or a block boundary")
            XCTAssertGreaterThanOrEqual(size, min(existing, writeAt / 4096 * 4096), label)
            XCTAssertEqual(try file.readAll(), Array(model.prefix(size)), label)
            XCTAssertEqual(try storage.size(), layout.storedSize(plaintextSize: UInt64(size)), "\(label): no torn block is left")
            if reserving, UInt64(writeLength) >= ProtectedFile.reserveThreshold {
                XCTAssertEqual(size, existing, "\(label): a write whose space is not there changes nothing")
                XCTAssertGreaterThan(storage.reservations, 0)
            }
            let key = try symmetricClassKey()
            let reopened = try ProtectedFile.open(storage.memory.copy()) { _ in key }
            XCTAssertEqual(reopened.size, UInt64(size), label)
            XCTAssertEqual(try reopened.readAll(), Array(model.prefix(size)), label)
            storage.capacity = .max
            try file.write(Array(data.suffix(1000)), at: UInt64(size))
            XCTAssertEqual(try file.readAll(), Array(model.prefix(size)) + data.suffix(1000), "\(label): writing goes on")
        }
    }
}
