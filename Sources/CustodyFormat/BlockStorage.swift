import CustodySystem
import Glibc
import Synchronization

/// Random-access bytes under a protected file: a descriptor on the backing store, or memory.
public protocol BlockStorage: AnyObject, Sendable {
    /// Reads up to `buffer.count` bytes at `offset`; fewer only at the end.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int
    /// Writes all of `data` at `offset`.
    func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError)
    func size() throws(FormatError) -> UInt64
    func truncate(to size: UInt64) throws(FormatError)
    func sync() throws(FormatError)
    /// Allocates space for `length` bytes at `offset` without changing the size, so that a write
    /// there cannot run out of space part-way; throws ENOSPC (or EDQUOT) when the space is not
    /// there. Storage that cannot reserve does nothing.
    func reserve(at offset: UInt64, length: UInt64) throws(FormatError)
    /// Makes `length` bytes at `offset` a hole again (reads as zeros; frees the space where it
    /// can). Needs no new space.
    func punchHole(at offset: UInt64, length: UInt64) throws(FormatError)
    /// The record of a version 2 file's holes (`HoleSet`), nil when there is none.
    func readHoleRecord() throws(FormatError) -> [UInt8]?
    /// Stores the hole record, or removes it (nil). Throws when this storage cannot keep one.
    func writeHoleRecord(_ record: [UInt8]?) throws(FormatError)
    /// A hint that `length` bytes at `offset` will be read soon (may start fetching them).
    func willRead(at offset: UInt64, length: UInt64)
    /// A read-only mapping of the first `length` bytes (which may run past the end), or nil if
    /// this storage cannot be mapped.
    func map(length: Int) -> FileMapping?
}

extension BlockStorage {
    public func readHoleRecord() throws(FormatError) -> [UInt8]? { nil }
    public func writeHoleRecord(_ record: [UInt8]?) throws(FormatError) {
        if record != nil { throw .unsupported("hole records on this storage") }
    }
    public func punchHole(at offset: UInt64, length: UInt64) throws(FormatError) { throw .unsupported("punching holes") }
    public func reserve(at offset: UInt64, length: UInt64) throws(FormatError) {}
    public func willRead(at offset: UInt64, length: UInt64) {}
    public func map(length: Int) -> FileMapping? { nil }
}

/// A file descriptor (not closed here unless `closeOnDeinit`).
public final class DescriptorStorage: BlockStorage {
    public let fd: Int32
    private let closeOnDeinit: Bool

    /// The store's attribute names: where the hole record is kept.
    public let attributes: StoreAttributes

    public init(fd: Int32, closeOnDeinit: Bool = false, attributes: StoreAttributes = .trusted) {
        self.fd = fd
        self.closeOnDeinit = closeOnDeinit
        self.attributes = attributes
    }

    deinit { if closeOnDeinit { Syscall.close(fd) } }

    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int {
        guard let base = buffer.baseAddress else { return 0 }
        do { return try Syscall.preadAll(fd, base, buffer.count, Int64(offset)) } catch { throw .io(error) }
    }

    public func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) {
        guard let base = data.baseAddress else { return }
        do { try Syscall.pwriteAll(fd, base, data.count, Int64(offset)) } catch { throw .io(error) }
    }

    public func size() throws(FormatError) -> UInt64 {
        do { return UInt64(try Syscall.fstat(fd).st_size) } catch { throw .io(error) }
    }

    public func truncate(to size: UInt64) throws(FormatError) {
        do { try Syscall.ftruncate(fd, Int64(size)) } catch { throw .io(error) }
    }

    public func sync() throws(FormatError) {
        do { try Syscall.fdatasync(fd) } catch { throw .io(error) }
    }

    /// The hole record lives in an extended attribute of the backing file (root-only
    /// `trusted.*`, as the owner record, or `StoreAttributes.holes`; hidden in the mount).

    public func readHoleRecord() throws(FormatError) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        let result: Result<Int, Errno> = buffer.withUnsafeMutableBytes { raw in
            do throws(Errno) {
                return .success(try Syscall.fgetxattr(fd, attributes.holes, raw.baseAddress, raw.count))
            } catch {
                return .failure(error)
            }
        }
        switch result {
        case .success(let count): return Array(buffer[0..<min(count, buffer.count)])
        case .failure(let error) where error == .noData: return nil
        case .failure(let error): throw .io(error)
        }
    }

    public func writeHoleRecord(_ record: [UInt8]?) throws(FormatError) {
        do throws(Errno) {
            if let record {
                try record.withBytes { (raw) throws(Errno) in try Syscall.fsetxattr(fd, attributes.holes, raw.baseAddress, raw.count, 0) }
            } else {
                do throws(Errno) { try Syscall.fremovexattr(fd, attributes.holes) } catch where error == .noData {}
            }
        } catch {
            throw .io(error)
        }
    }

    public func punchHole(at offset: UInt64, length: UInt64) throws(FormatError) {
        do {
            try Syscall.fallocate(fd, Linux.FALLOC_FL_PUNCH_HOLE | Linux.FALLOC_FL_KEEP_SIZE, Int64(clamping: offset), Int64(clamping: length))
        } catch {
            throw .io(error)
        }
    }

    public func reserve(at offset: UInt64, length: UInt64) throws(FormatError) {
        guard length > 0 else { return }
        do {
            try Syscall.fallocate(fd, Linux.FALLOC_FL_KEEP_SIZE, Int64(clamping: offset), Int64(clamping: length))
        } catch where error == .noSpace || error.rawValue == EDQUOT {
            throw .io(error)
        } catch {
            // No fallocate here (EOPNOTSUPP, a pipe, …): write without reserving.
        }
    }

    public func willRead(at offset: UInt64, length: UInt64) {
        Syscall.willNeed(fd, offset: Int64(clamping: offset), length: Int64(clamping: length))
    }

    public func map(length: Int) -> FileMapping? {
        do throws(Errno) { return try FileMapping(fd: fd, length: length) } catch { return nil }
    }
}

/// Bytes in memory: protected buffers (the data protection API), tests and the fuzzer.
public final class MemoryStorage: BlockStorage {
    private let storage: Mutex<[UInt8]>
    private let holeRecord = Mutex<[UInt8]?>(nil)

    public func readHoleRecord() throws(FormatError) -> [UInt8]? { holeRecord.withLock { $0 } }
    public func writeHoleRecord(_ record: [UInt8]?) throws(FormatError) { holeRecord.withLock { $0 = record } }

    public init(_ bytes: [UInt8] = [], holeRecord: [UInt8]? = nil) {
        storage = Mutex(bytes)
        self.holeRecord.withLock { $0 = holeRecord }
    }

    /// A copy of these bytes and this hole record.
    public func copy() -> MemoryStorage { MemoryStorage(bytes, holeRecord: holeRecord.withLock { $0 }) }

    public var bytes: [UInt8] { storage.withLock { $0 } }

    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64) throws(FormatError) -> Int {
        storage.withLock { bytes in
            guard offset < UInt64(bytes.count) else { return 0 }
            let count = min(buffer.count, bytes.count - Int(offset))
            bytes.withUnsafeBytes { source in
                buffer.baseAddress?.copyMemory(from: source.baseAddress! + Int(offset), byteCount: count)
            }
            return count
        }
    }

    public func write(_ data: UnsafeRawBufferPointer, at offset: UInt64) throws(FormatError) {
        storage.withLock { bytes in
            let end = Int(offset) + data.count
            if bytes.count < end { bytes += [UInt8](repeating: 0, count: end - bytes.count) }
            bytes.withUnsafeMutableBytes { target in
                if let base = data.baseAddress { (target.baseAddress! + Int(offset)).copyMemory(from: base, byteCount: data.count) }
            }
        }
    }

    public func size() throws(FormatError) -> UInt64 { storage.withLock { UInt64($0.count) } }

    public func truncate(to size: UInt64) throws(FormatError) {
        storage.withLock { bytes in
            if UInt64(bytes.count) > size { bytes.removeLast(bytes.count - Int(size)) }
            else { bytes += [UInt8](repeating: 0, count: Int(size) - bytes.count) }
        }
    }

    public func sync() throws(FormatError) {}

    public func punchHole(at offset: UInt64, length: UInt64) throws(FormatError) {
        storage.withLock { bytes in
            guard offset < UInt64(bytes.count) else { return }
            let end = Int(min(UInt64(bytes.count), offset + length))
            for index in Int(offset)..<end { bytes[index] = 0 }
        }
    }
}

extension BlockStorage {
    public func writeBytes(_ bytes: [UInt8], at offset: UInt64) throws(FormatError) {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(bytes.count, 1), alignment: 8)
        defer { buffer.deallocate() }
        buffer.copyBytes(from: bytes)
        try write(UnsafeRawBufferPointer(rebasing: buffer[0..<bytes.count]), at: offset)
    }
}
