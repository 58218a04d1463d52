// libFuzzer target for the format's parsers and block decoder (`make fuzz`).
//
// Built with `-sanitize=fuzzer -parse-as-library -D FUZZING`, libFuzzer provides `main` and calls
// `LLVMFuzzerTestOneInput`. In an ordinary build this file is a small program that runs the same
// checks over files named on the command line (to replay a crash or a corpus).
import CustodyCrypto
import CustodyFormat

/// A fixed class key, and a valid header made with it: fuzzed bytes appended to this header reach
/// the block decoder with a key that unwraps, which random headers never would.
let fuzzClassKey: ClassKey? = {
    guard let secret = try? SecretBytes(count: 32), let key = try? AESGCMKey(secret) else { return nil }
    return .symmetric(id: [1, 2, 3, 4, 5, 6, 7, 8], key: key)
}()

let validHeader: [UInt8] = {
    guard let fuzzClassKey, let owner = try? Owner("fuzz@example.org"), let fileKey = try? SecretBytes(count: 32),
          let header = try? FileHeader.encrypted(owner: owner, protectionClass: .complete, classKey: fuzzClassKey,
                                                 fileKey: fileKey, fileID: [UInt8](repeating: 0xF0, count: 16), blockSize: 64)
    else { return [] }
    return header.encoded()
}()

func readEverything(_ file: ProtectedFile) {
    var buffer = [UInt8](repeating: 0, count: 100)
    var offset: UInt64 = 0
    while offset < file.size {
        let count = (try? buffer.withUnsafeMutableBytes { try file.read(into: $0, at: offset) }) ?? 0
        if count == 0 { break }
        offset += UInt64(count)
    }
}

func checkOneInput(_ bytes: [UInt8]) {
    guard let fuzzClassKey else { return }
    // 1. The header parser on arbitrary bytes, and the unwrap of whatever parses.
    if let header = try? bytes.withUnsafeBytes({ try FileHeader.decode($0) }) {
        _ = header.encoded()
        _ = try? header.unwrapFileKey(with: fuzzClassKey)
    }
    // 2. The owner record codec.
    _ = try? OwnerRecord.decode(bytes)
    // 3. Whole files: arbitrary bytes, then a valid header over an arbitrary body (block decoder).
    for candidate in [bytes, validHeader + bytes] {
        if let file = try? ProtectedFile.open(MemoryStorage(candidate), classKey: { _ in fuzzClassKey }) {
            readEverything(file)
        }
    }
    // 4. The data protection entry point.
    _ = try? ProtectedData.unprotect(bytes) { _ in fuzzClassKey }
}

#if FUZZING
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    checkOneInput(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}
#else
import Glibc

@main
struct FuzzReplay {
    static func main() {
        for path in CommandLine.arguments.dropFirst() {
            guard let file = fopen(path, "rb") else {
                print("cannot open \(path)")
                continue
            }
            var bytes: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = fread(&chunk, 1, chunk.count, file)
                if n == 0 { break }
                bytes += chunk[0..<n]
            }
            fclose(file)
            checkOneInput(bytes)
            print("ok \(path) (\(bytes.count) bytes)")
        }
    }
}
#endif
