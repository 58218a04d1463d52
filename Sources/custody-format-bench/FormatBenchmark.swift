// Throughput of the protected file format, in release mode (`make bench-format`): raw OpenSSL
// AES-256-GCM on 4 KiB blocks as the reference, then sequential 1 MiB writes and reads and random
// 4 KiB writes and reads through ProtectedFile, on one core and on every core.
import CustodyCrypto
import CustodyFormat
import Glibc

func now() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

func megabytesPerSecond(_ bytes: Int, _ seconds: Double) -> String {
    String(Int((Double(bytes) / 1_000_000 / seconds).rounded()))
}

@main
struct FormatBenchmark {
    static func main() throws {
        let arguments = CommandLine.arguments
        let sizeMiB = arguments.count > 1 ? Int(arguments[1]) ?? 256 : 256
        let directory = arguments.count > 2 ? arguments[2] : "/dev/shm"
        let total = sizeMiB << 20
        let classKey = ClassKey.symmetric(id: [1, 2, 3, 4, 5, 6, 7, 8], key: try AESGCMKey(try SecretBytes.random(count: 32)))

        // Reference: OpenSSL AES-256-GCM, one context, 4 KiB blocks, one core.
        let key = try AESGCMKey(try SecretBytes.random(count: 32))
        let block = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 16)
        let sealed = UnsafeMutableRawPointer.allocate(byteCount: 4096 + 16, alignment: 16)
        block.initializeMemory(as: UInt8.self, repeating: 7)
        let nonce = [UInt8](repeating: 1, count: 12), aad = [UInt8](repeating: 2, count: 25)
        var start = now()
        try key.withContext { (context) throws(CryptoError) in
            try nonce.withBytes { (n) throws(CryptoError) in
                try aad.withBytes { (a) throws(CryptoError) in
                    for _ in 0..<(total / 4096) {
                        try context.seal(nonce: n, aad: a, plaintext: UnsafeRawBufferPointer(block), ciphertext: sealed, tag: sealed + 4096)
                    }
                }
            }
        }
        let openssl = Double(total) / (now() - start)
        print("| measurement | MB/s |")
        print("|---|---|")
        print("| OpenSSL AES-256-GCM, 4 KiB blocks, 1 core (reference) | \(megabytesPerSecond(total, Double(total) / openssl)) |")

        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        for index in 0..<chunk.count { chunk[index] = UInt8(truncatingIfNeeded: index &* 31) }
        for parallelism in [1, ProtectedFile.defaultParallelism] {
            let label = parallelism == 1 ? "1 core" : "\(parallelism) cores"
            let path = directory + "/custody-format-bench.\(getpid())"
            let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
            guard fd >= 0 else { print("cannot create \(path)"); return }
            defer { close(fd); unlink(path) }
            let file = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: try Owner("bench@example.org"),
                                                protectionClass: .untilFirstAuthentication, classKey: classKey, parallelism: parallelism)
            start = now()
            for offset in stride(from: 0, to: total, by: chunk.count) {
                try file.write(UnsafeRawBufferPointer(chunk), at: UInt64(offset))
            }
            let write = now() - start
            start = now()
            for offset in stride(from: 0, to: total, by: chunk.count) {
                _ = try file.read(into: chunk, at: UInt64(offset))
            }
            let read = now() - start
            print("| sequential 1 MiB writes, \(label) | \(megabytesPerSecond(total, write)) (\(Int(Double(total) / write / openssl * 100)) % of OpenSSL) |")
            print("| sequential 1 MiB reads, \(label) | \(megabytesPerSecond(total, read)) (\(Int(Double(total) / read / openssl * 100)) % of OpenSSL) |")

            var random = SystemRandomNumberGenerator()
            let operations = 50_000
            let small = UnsafeMutableRawBufferPointer(rebasing: chunk[0..<4096])
            start = now()
            for _ in 0..<operations {
                try file.write(UnsafeRawBufferPointer(small), at: UInt64(Int.random(in: 0..<(total / 4096), using: &random) * 4096))
            }
            let randomWrite = now() - start
            start = now()
            for _ in 0..<operations {
                _ = try file.read(into: small, at: UInt64(Int.random(in: 0..<(total / 4096), using: &random) * 4096))
            }
            let randomRead = now() - start
            print("| random 4 KiB writes, \(label) | \(megabytesPerSecond(operations * 4096, randomWrite)) (\(Int(Double(operations) / randomWrite)) ops/s) |")
            print("| random 4 KiB reads, \(label) | \(megabytesPerSecond(operations * 4096, randomRead)) (\(Int(Double(operations) / randomRead)) ops/s) |")
        }
        print("\n\(sizeMiB) MiB file in \(directory) (page cache: measures the format, not the disk)")
    }
}
