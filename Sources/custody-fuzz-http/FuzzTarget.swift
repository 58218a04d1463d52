// libFuzzer target for the control plane's input (`make fuzz-http`): the front's HTTP pipeline
// (SwiftNIO's decoder, the limits, the front's checks), the JSON decoding of every route's body,
// and the frames between the front and the daemon. Built with `-sanitize=fuzzer -parse-as-library -D FUZZING`, libFuzzer provides
// `main`; an ordinary build replays files and directories named on the command line (`make test`
// replays the committed corpus, fuzz/http).
import CustodyControl

func checkOneInput(_ bytes: [UInt8]) {
    ControlInputs.parseAndCheck(bytes)
    ControlInputs.checkAsEveryBody(bytes)
    ControlInputs.decodeFrames(bytes)
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
        var count = 0
        for argument in CommandLine.arguments.dropFirst() {
            for path in files(argument) {
                guard let bytes = read(path) else {
                    print("cannot read \(path)")
                    exit(1)
                }
                checkOneInput(bytes)
                count += 1
            }
        }
        print("replayed \(count) inputs")
    }

    /// The file itself, or the files in a directory.
    static func files(_ path: String) -> [String] {
        guard let directory = opendir(path) else { return [path] }
        defer { closedir(directory) }
        var names: [String] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if !name.hasPrefix(".") { names.append(path + "/" + name) }
        }
        return names.sorted()
    }

    static func read(_ path: String) -> [UInt8]? {
        guard let file = fopen(path, "rb") else { return nil }
        defer { fclose(file) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = fread(&chunk, 1, chunk.count, file)
            if n == 0 { break }
            bytes += chunk[0..<n]
        }
        return bytes
    }
}
#endif
