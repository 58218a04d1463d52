import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

/// JSON state files in the state directory, written atomically: a temporary file in the same
/// directory, fsync, rename over the old one, fsync the directory. A daemon killed at any point
/// finds either the old or the new file, never a mix.
/// Files that name an identity are sealed under the state key (`StateSeal`) on the way.
struct StateFiles: Sendable {
    let directory: String
    /// Seals and opens the files that name identities; nil for the seal's own files.
    let seal: StateSeal?

    init(directory: String, seal: StateSeal?) {
        self.directory = directory
        self.seal = seal
    }

    func path(_ name: String) -> String { directory + "/" + name }

    /// The file of an identity's keybag (a keyed hash of the identity: see `StateSeal.name`).
    func keybagName(_ identity: String) -> String {
        seal?.name(of: identity, in: "keybags") ?? StateSeal.legacyName(of: identity, in: "keybags")
    }

    /// The journal of an identity's wipe while it runs.
    func wipeJournalName(_ identity: String) -> String {
        seal?.name(of: identity, in: "wipes") ?? StateSeal.legacyName(of: identity, in: "wipes")
    }

    func write<T: Encodable>(_ value: T, to name: String) throws(EngineError) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        let data: Data
        do { data = try encoder.encode(value) } catch { throw .corruptState(file: path(name), reason: "cannot encode: \(error)") }
        if let seal, StateSeal.isSealed(name) {
            try writeBytes(try seal.seal(Array(data), name: name), to: name)
        } else {
            try writeBytes(Array(data), to: name)
        }
    }

    func writeBytes(_ bytes: [UInt8], to name: String, mode: mode_t = 0o600) throws(EngineError) {
        let target = path(name)
        let temporary = target + ".tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        do throws(Errno) {
            let fd = try Syscall.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
            do {
                try bytes.withBytes { (buffer) throws(Errno) in
                    if let base = buffer.baseAddress { try Syscall.pwriteAll(fd, base, buffer.count, 0) }
                }
                try Syscall.fsync(fd)
                Syscall.close(fd)
            } catch {
                Syscall.close(fd)
                _ = unlink(temporary)
                throw error
            }
            try Syscall.renameat2(AT_FDCWD, temporary, AT_FDCWD, target, 0)
            let dir = try Syscall.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            defer { Syscall.close(dir) }
            try Syscall.fsync(dir)
        } catch {
            throw .io(file: target, error)
        }
    }

    /// The decoded file, or nil when it does not exist. Unreadable or invalid files are errors
    /// that name the file.
    func read<T: Decodable>(_ type: T.Type, from name: String) throws(EngineError) -> T? {
        guard var bytes = try readBytes(name) else { return nil }
        if let seal, StateSeal.isSealed(name) { bytes = try seal.open(bytes, name: name) }
        do {
            return try JSONDecoder().decode(T.self, from: Data(bytes))
        } catch {
            throw .corruptState(file: path(name), reason: Self.describe(error))
        }
    }

    func readBytes(_ name: String) throws(EngineError) -> [UInt8]? {
        let target = path(name)
        let fd: Int32
        do {
            fd = try Syscall.open(target, O_RDONLY | O_CLOEXEC)
        } catch where error == .noSuchFile {
            return nil
        } catch {
            throw .io(file: target, error)
        }
        defer { Syscall.close(fd) }
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        var offset: Int64 = 0
        while true {
            let count: Int
            do {
                count = try chunk.withMutableBytes { (buffer) throws(Errno) in try Syscall.pread(fd, buffer.baseAddress!, buffer.count, offset) }
            } catch {
                throw .io(file: target, error)
            }
            if count == 0 { return result }
            result += chunk[0..<count]
            offset += Int64(count)
        }
    }

    /// Overwrites a file with zeros, syncs, and removes it (for key material).
    func destroy(_ name: String) throws(EngineError) {
        let target = path(name)
        do throws(Errno) {
            let fd = try Syscall.open(target, O_WRONLY | O_CLOEXEC)
            let size = Int(try Syscall.fstat(fd).st_size)
            let zeros = [UInt8](repeating: 0, count: max(size, 1))
            try zeros.withBytes { (buffer) throws(Errno) in try Syscall.pwriteAll(fd, buffer.baseAddress!, size, 0) }
            try Syscall.fsync(fd)
            Syscall.close(fd)
            try Syscall.unlinkat(AT_FDCWD, target, 0)
            let dir = try Syscall.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            defer { Syscall.close(dir) }
            try Syscall.fsync(dir)
        } catch where error == .noSuchFile {
        } catch {
            throw .io(file: target, error)
        }
    }

    /// Removes temporary files a killed daemon left behind (the real files are intact: a temporary
    /// only replaces its target by rename once it is complete and synced).
    func removeStaleTemporaries() {
        for subdirectory in ["", "keybags", "wipes"] {
            let base = subdirectory.isEmpty ? directory : path(subdirectory)
            for name in list(subdirectory) where name.contains(".tmp-") { _ = unlink(base + "/" + name) }
        }
    }

    /// The names in a subdirectory (empty when it cannot be read).
    func list(_ subdirectory: String) -> [String] {
        // Only names this code writes (text) are state files.
        ((try? Syscall.directoryNames(atPath: path(subdirectory))) ?? []).compactMap(\.text)
    }

    /// Creates a subdirectory (0700) if missing.
    func makeDirectory(_ name: String) throws(EngineError) {
        do { try Syscall.mkdirat(AT_FDCWD, path(name), 0o700) } catch where error == .exists {} catch { throw .io(file: path(name), error) }
    }

    static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.dataCorrupted(let context):
            return context.debugDescription + at(context.codingPath)
        case DecodingError.keyNotFound(let key, let context):
            return "missing key \(key.stringValue)" + at(context.codingPath)
        case DecodingError.typeMismatch(let type, let context):
            return "expected \(type)" + at(context.codingPath)
        case DecodingError.valueNotFound(let type, let context):
            return "missing \(type)" + at(context.codingPath)
        default:
            return "\(error)"
        }
    }

    private static func at(_ path: [CodingKey]) -> String {
        path.isEmpty ? "" : " at " + path.map(\.stringValue).joined(separator: ".")
    }
}

/// A state file that changes under the engine's one lock but is written after the lock is
/// released: every CREATE waits on that lock for its class key, and a write costs two disk
/// `fsync`s. A change takes a numbered snapshot under the lock (numbers follow the order of the
/// changes, since the lock orders them); `save` writes it unless a later snapshot is already on
/// disk, so that a slow writer never puts an older state back.
final class OrderedStateFile<Value: Encodable>: @unchecked Sendable {
    let name: String
    private let taken = Atomic<UInt64>(0)
    private let written = Mutex<UInt64>(0)

    init(_ name: String) { self.name = name }

    struct Snapshot {
        fileprivate let number: UInt64
        fileprivate let value: Value
        fileprivate let file: OrderedStateFile
    }

    /// Numbers `value` as the newest state. Call it under the lock that orders the changes.
    func snapshot(_ value: Value) -> Snapshot {
        Snapshot(number: taken.add(1, ordering: .relaxed).newValue, value: value, file: self)
    }

    /// Writes the snapshot, or nothing when a later one is already written.
    fileprivate func save(_ snapshot: Snapshot, to files: StateFiles) throws(EngineError) {
        try written.withLock { (last) throws(EngineError) in
            guard snapshot.number > last else { return }
            try files.write(snapshot.value, to: name)
            last = snapshot.number
        }
    }
}

extension StateFiles {
    /// Writes a snapshot taken under the engine's lock (`OrderedStateFile`).
    func save<Value>(_ snapshot: OrderedStateFile<Value>.Snapshot) throws(EngineError) {
        try snapshot.file.save(snapshot, to: self)
    }
}
