import CustodyCore
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// fsx-style: a seeded sequence of mixed operations applied both to the mount and to a plain
/// reference directory. After each step the results (value or errno) must match, and so must the
/// size and every byte of the files involved. On failure the seed and step are printed;
/// `FSX_SEED=N` replays a run and `FSX_STEPS=N` changes its length.
final class RandomizedOperationTests: XCTestCase {
    var daemon: MountedDaemon!
    var reference = ""

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testRandomOperationsMatchAPlainDirectory() throws {
        daemon = try MountedDaemon()
        try runRandomOperations()
        try mustRun(["diff", "-r", "--no-dereference", reference, daemon.backing])
    }

    /// The same, with every operation made by a managed identity (this thread is bound to it),
    /// so that every file goes through encryption.
    func testRandomOperationsAsAManagedIdentity() throws {
        let thread = Linux.currentThreadID()
        daemon = try MountedDaemon { state in
            let engine = try Engine(stateDirectory: state)
            try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
            try engine.bindThread(thread, to: "alice@contoso.com")
        }
        try runRandomOperations()
        let stored = try mustRun(["find", daemon.backing, "-type", "f", "-newer", daemon.state + "/machine-key.json"]).split(separator: "\n")
        var encrypted = 0
        for path in stored {
            if let handle = FileHandle(forReadingAtPath: String(path)) {
                if Array(handle.readData(ofLength: 8)) == FileHeader.magic { encrypted += 1 }
                try? handle.close()
            }
        }
        XCTAssertGreaterThan(stored.count, 0, "the run left files to check")
        XCTAssertEqual(encrypted, stored.count, "every file left on the backing store is encrypted")
    }

    func runRandomOperations() throws {
        reference = daemon.root + "/reference"
        XCTAssertEqual(mkdir(reference, 0o755), 0)
        let environment = ProcessInfo.processInfo.environment
        let seed = environment["FSX_SEED"].flatMap(UInt64.init) ?? UInt64(UInt32.random(in: 1...UInt32.max))
        let steps = environment["FSX_STEPS"].flatMap(Int.init) ?? 4000
        var model = FSXRun(roots: [daemon.mountPoint, reference], seed: seed)
        defer { model.closeAll() }
        for step in 0..<steps {
            let description = model.step()
            if let mismatch = model.compareAfterStep() {
                XCTFail("fsx seed \(seed) step \(step) (\(description)): \(mismatch). Replay with FSX_SEED=\(seed)")
                return
            }
        }
        // Everything at the end, through the mount after the kernel dropped its caches.
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        try mustRun(["diff", "-r", "--no-dereference", reference, daemon.mountPoint])
        print("fsx: \(steps) steps with seed \(seed) matched")
    }
}

/// One randomized run over two roots that must behave identically.
struct FSXRun {
    let roots: [String]
    var random: SeededGenerator
    let names = (0..<6).map { "file\($0)" }
    /// Open descriptors per name, one per root; kept across steps like a long-running program.
    var open: [String: [Int32]] = [:]
    var touched: Set<String> = []
    var lastResults: [String] = []
    static let maxSize = 300_000

    init(roots: [String], seed: UInt64) {
        self.roots = roots
        self.random = SeededGenerator(seed: seed)
        for root in roots { mkdir(root + "/dir", 0o755) }
    }

    mutating func closeAll() {
        for fds in open.values { fds.forEach { close($0) } }
        open = [:]
    }

    private mutating func closeName(_ name: String) {
        open[name]?.forEach { close($0) }
        open[name] = nil
    }

    /// Runs `body` on each root and records each result as text ("=value" or "errno N").
    private mutating func onEach(_ body: (Int, String) -> Int) {
        lastResults = roots.indices.map { index in
            errno = 0
            let value = body(index, roots[index])
            return value < 0 ? "errno \(errno)" : "=\(value)"
        }
    }

    private mutating func descriptors(_ name: String) -> [Int32]? {
        if let fds = open[name] { return fds }
        let fds = roots.map { Glibc.open($0 + "/" + name, O_RDWR | O_CREAT, 0o644) }
        if fds.contains(where: { $0 < 0 }) {
            fds.filter { $0 >= 0 }.forEach { close($0) }
            return nil
        }
        open[name] = fds
        return fds
    }

    mutating func step() -> String {
        let name = names.randomElement(using: &random)!
        let other = names.randomElement(using: &random)!
        touched = [name, other]
        switch Int.random(in: 0..<100, using: &random) {
        case 0..<30:
            let offset = Int.random(in: 0..<Self.maxSize, using: &random)
            let length = Int.random(in: 1...min(65536, Self.maxSize - offset + 1), using: &random)
            let fill = UInt8.random(in: 0...255, using: &random)
            let data = (0..<length).map { fill &+ UInt8(truncatingIfNeeded: $0) }
            guard let fds = descriptors(name) else { return "open \(name) failed" }
            onEach { i, _ in data.withUnsafeBytes { pwrite(fds[i], $0.baseAddress, length, off_t(offset)) } }
            return "write \(name) @\(offset) +\(length)"
        case 30..<45:
            let offset = Int.random(in: 0..<Self.maxSize, using: &random)
            let length = Int.random(in: 1...100_000, using: &random)
            guard let fds = descriptors(name) else { return "open \(name) failed" }
            var buffers = roots.map { _ in [UInt8](repeating: 0, count: length) }
            onEach { i, _ in buffers[i].withUnsafeMutableBytes { pread(fds[i], $0.baseAddress, length, off_t(offset)) } }
            if buffers[0] != buffers[1] { lastResults.append("read bytes differ") }
            return "read \(name) @\(offset) +\(length)"
        case 45..<55:
            let size = Int.random(in: 0..<Self.maxSize, using: &random)
            if Bool.random(using: &random), let fds = descriptors(name) {
                onEach { i, _ in Int(ftruncate(fds[i], off_t(size))) }
                return "ftruncate \(name) \(size)"
            }
            onEach { _, root in Int(truncate(root + "/" + name, off_t(size))) }
            return "truncate \(name) \(size)"
        case 55..<62:
            let data = (0..<Int.random(in: 1...5000, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            onEach { _, root in
                let fd = Glibc.open(root + "/" + name, O_WRONLY | O_APPEND | O_CREAT, 0o644)
                if fd < 0 { return -1 }
                defer { close(fd) }
                return data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            }
            return "append \(name) +\(data.count)"
        case 62..<70:
            closeName(name)
            closeName(other)
            onEach { _, root in Int(rename(root + "/" + name, root + "/" + other)) }
            return "rename \(name) \(other)"
        case 70..<76:
            closeName(other)
            onEach { _, root in Int(link(root + "/" + name, root + "/" + other)) }
            return "link \(name) \(other)"
        case 76..<83:
            closeName(name)
            onEach { _, root in Int(unlink(root + "/" + name)) }
            return "unlink \(name)"
        case 83..<88:
            closeName(name)
            onEach { _, root in Int(rename(root + "/" + name, root + "/dir/" + name)) }
            let back = Bool.random(using: &random)
            if back {
                onEach { _, root in Int(rename(root + "/dir/" + name, root + "/" + name)) }
            }
            return "rename \(name) into dir\(back ? " and back" : "")"
        case 88..<93:
            guard let fds = descriptors(name) else { return "open \(name) failed" }
            onEach { i, _ in Int(fsync(fds[i])) }
            return "fsync \(name)"
        case 93..<97:
            let fill = UInt8.random(in: 0...255, using: &random)
            let data = [UInt8](repeating: fill, count: Int.random(in: 0...20_000, using: &random))
            closeName(name)
            onEach { _, root in
                let fd = Glibc.open(root + "/" + name, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                if fd < 0 { return -1 }
                defer { close(fd) }
                return data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            }
            return "rewrite \(name) with O_TRUNC +\(data.count)"
        default:
            let offset = Int.random(in: 0..<Self.maxSize, using: &random)
            let length = Int.random(in: 1...65536, using: &random)
            guard let fds = descriptors(name) else { return "open \(name) failed" }
            onEach { i, _ in Int(Syscall.fallocateResult(fds[i], offset, length)) }
            return "fallocate \(name) @\(offset) +\(length)"
        }
    }

    /// nil when both roots agree on the step's result and on the touched files.
    func compareAfterStep() -> String? {
        if Set(lastResults).count > 1 { return "results differ: \(lastResults)" }
        for name in touched.union(["dir/" + (touched.first ?? "")]) {
            let states = roots.map { Self.state(of: $0 + "/" + name) }
            if states[0] != states[1] { return "\(name) differs: mount \(states[0].summary) vs reference \(states[1].summary)" }
        }
        return nil
    }

    struct FileState: Equatable {
        var errorNumber: Int32 = 0
        var size = 0
        var links = 0
        var content: [UInt8] = []
        var summary: String {
            errorNumber != 0 ? "errno \(errorNumber)" : "size \(size), links \(links), sha \(content.hashValue)"
        }
    }

    static func state(of path: String) -> FileState {
        var state = FileState()
        do {
            let st = try Syscall.lstat(path)
            state.size = Int(st.st_size)
            state.links = Int(st.st_nlink)
            state.content = try readFile(path)
        } catch let error as Errno {
            state.errorNumber = error.rawValue
        } catch {
            state.errorNumber = -1
        }
        return state
    }
}

extension Syscall {
    /// fallocate as a C-style result, for the comparison table.
    static func fallocateResult(_ fd: Int32, _ offset: Int, _ length: Int) -> Int {
        do {
            try fallocate(fd, 0, Int64(offset), Int64(length))
            return 0
        } catch {
            errno = error.rawValue
            return -1
        }
    }
}
