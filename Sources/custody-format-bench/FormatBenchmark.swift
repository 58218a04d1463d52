// Throughput of the protected file format, in release mode (`make bench-format`): the raw
// AES-256-GCM AEAD (BoringSSL) on 4 KiB blocks as the reference, then sequential 1 MiB writes and reads and random
// 4 KiB writes and reads through ProtectedFile, on one core and on every core. Each figure is the
// best of three runs: this machine is a VM whose speed varies from run to run.
import CustodyCrypto
import CustodyFormat
import Glibc

func now() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

/// Best (shortest) of `runs` timings of `body`.
func best(_ runs: Int = 3, _ body: () throws -> Void) rethrows -> Double {
    var fastest = Double.infinity
    for _ in 0..<runs {
        let start = now()
        try body()
        fastest = min(fastest, now() - start)
    }
    return fastest
}

/// Storage that keeps nothing: measures the format's own work on writes, without the kernel's copy.
final class DiscardingStorage: BlockStorage, @unchecked Sendable {
    private var end: UInt64 = 0
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int { 0 }
    func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) { end = max(end, offset + UInt64(data.count)) }
    func size() throws(FormatError) -> UInt64 { end }
    func truncate(to size: UInt64) throws(FormatError) { end = size }
    func sync() throws(FormatError) {}
}

@main
struct FormatBenchmark {
    static func main() throws {
        let arguments = CommandLine.arguments
        let sizeMiB = arguments.count > 1 ? Int(arguments[1]) ?? 256 : 256
        let directory = arguments.count > 2 ? arguments[2] : "/dev/shm"
        let total = sizeMiB << 20
        let classKey = ClassKey.symmetric(id: [1, 2, 3, 4, 5, 6, 7, 8], key: try AESGCMKey(try SecretBytes.random(count: 32)))
        let owner = try Owner("bench@example.org")
        func rate(_ bytes: Int, _ seconds: Double) -> Double { Double(bytes) / seconds / 1_000_000 }
        var rows: [(String, Double, String)] = []

        // Reference: the AES-256-GCM AEAD alone, 4 KiB blocks, one core.
        let key = try AESGCMKey(try SecretBytes.random(count: 32))
        let block = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16)
        let sealed = UnsafeMutableRawPointer.allocate(byteCount: 4096 + 16, alignment: 16)
        block.initializeMemory(as: UInt8.self, repeating: 7)
        let nonce = [UInt8](repeating: 1, count: 12), aad = [UInt8](repeating: 2, count: 25)
        let context = key.context
        let aeadTime = try best {
            try nonce.withBytes { (n) throws(CryptoError) in
                try aad.withBytes { (a) throws(CryptoError) in
                    for _ in 0..<(total / 4096) {
                        try context.seal(nonce: n, aad: a, plaintext: UnsafeRawBufferPointer(block), ciphertext: sealed, tag: sealed + 4096)
                    }
                }
            }
        }
        let aead = rate(total, aeadTime)
        rows.append(("AES-256-GCM AEAD alone, 4 KiB blocks, 1 core (reference)", aead, ""))

        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        for index in 0..<chunk.count { chunk[index] = UInt8(truncatingIfNeeded: index &* 31) }
        let percent = { (value: Double) in "\(Int((value / aead * 100).rounded())) % of the AEAD alone" }

        for parallelism in [1, ProtectedFile.defaultParallelism] {
            let label = parallelism == 1 ? "1 core" : "\(parallelism) cores"
            // The format alone: encryption, block math and buffers, bytes discarded. (Whole 1 MiB
            // rewrites of one range: storage that keeps nothing cannot serve read-modify-write.)
            let discard = try ProtectedFile.create(on: DiscardingStorage(), owner: owner, protectionClass: .untilFirstAuthentication,
                                                   classKey: classKey, parallelism: parallelism)
            let alone = try best {
                for _ in 0..<(total / chunk.count) {
                    try discard.write(UnsafeRawBufferPointer(chunk), at: 0)
                }
            }
            rows.append(("sequential 1 MiB writes, format alone, \(label)", rate(total, alone), percent(rate(total, alone))))

            let path = directory + "/custody-format-bench.\(getpid())"
            let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
            guard fd >= 0 else { print("cannot create \(path)"); return }
            defer { close(fd); unlink(path) }
            let file = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: owner, protectionClass: .untilFirstAuthentication,
                                                classKey: classKey, parallelism: parallelism)
            // The first run also warms the VM's memory (the first touch of fresh pages is slow here).
            let write = try best(4) {
                try file.truncate(to: 0)
                for offset in stride(from: 0, to: total, by: chunk.count) {
                    try file.write(UnsafeRawBufferPointer(chunk), at: UInt64(offset))
                }
            }
            let read = try best {
                for offset in stride(from: 0, to: total, by: chunk.count) {
                    _ = try file.read(into: chunk, at: UInt64(offset))
                }
            }
            rows.append(("sequential 1 MiB writes to a \(directory) file, \(label)", rate(total, write), percent(rate(total, write))))
            rows.append(("sequential 1 MiB reads from a \(directory) file, \(label)", rate(total, read), percent(rate(total, read))))

            var random = SystemRandomNumberGenerator()
            let operations = 50_000
            let small = UnsafeMutableRawBufferPointer(rebasing: chunk[0..<4096])
            let randomWrite = try best {
                for _ in 0..<operations {
                    try file.write(UnsafeRawBufferPointer(small), at: UInt64(Int.random(in: 0..<(total / 4096), using: &random) * 4096))
                }
            }
            let randomRead = try best {
                for _ in 0..<operations {
                    _ = try file.read(into: small, at: UInt64(Int.random(in: 0..<(total / 4096), using: &random) * 4096))
                }
            }
            rows.append(("random 4 KiB writes, \(label)", rate(operations * 4096, randomWrite), "\(Int(Double(operations) / randomWrite)) ops/s"))
            rows.append(("random 4 KiB reads, \(label)", rate(operations * 4096, randomRead), "\(Int(Double(operations) / randomRead)) ops/s"))
        }
        // Names: what a lookup or a creation pays to encrypt one, and a listing to decrypt one
        // (names of 11 bytes, the mean of /usr/include's).
        let nameKey = try NameKey(deriving: try SecretBytes.random(count: 32))
        let tweak = [UInt8](repeating: 9, count: NameCipher.tweakSize)
        let names = (0..<20_000).map { Array("name-\($0).h".utf8.prefix(11)) }
        var stored: [String] = []
        let encryptTime = try best {
            stored = try names.map { (name) throws(FormatError) -> String in
                guard case .short(let form) = try NameCipher.encrypt(name, tweak: tweak, key: nameKey) else { return "" }
                return form
            }
        }
        let associatedData = NameCipher.associatedData(tweak: tweak)
        let decryptTime = try best {
            for form in stored { _ = try NameCipher.decrypt(form, associatedData: associatedData, key: nameKey) }
        }
        // Keys: what every file created or opened pays to derive its content key.
        let fileKey = try SecretBytes.random(count: 32)
        let fileID = [UInt8](repeating: 7, count: 16)
        let derivations = 20_000
        let deriveTime = try best {
            for _ in 0..<derivations { _ = try HKDF.derive(.sha256, key: fileKey, salt: fileID, info: Array("custody content".utf8), count: 32) }
        }
        var nameRows: [(String, Double)] = []
        nameRows.append(("encrypt a name (11 bytes)", encryptTime / Double(names.count) * 1e6))
        nameRows.append(("decrypt a name (11 bytes)", decryptTime / Double(names.count) * 1e6))
        nameRows.append(("derive a file's content key (HKDF-SHA-256)", deriveTime / Double(derivations) * 1e6))

        print("| measurement | MB/s | |")
        print("|---|---|---|")
        for (name, value, note) in rows { print("| \(name) | \(Int(value.rounded())) | \(note) |") }
        print("\n| names and keys | µs each |\n|---|---|")
        for (name, value) in nameRows { print("| \(name) | \((value * 100).rounded() / 100) |") }
        print("\n\(sizeMiB) MiB per run, best of 3 runs each; files in \(directory) (page cache, not disk)")
    }
}
