import CustodyCore
import CustodySystem
import Prometheus
import Synchronization

/// The FUSE requests a mount serves, named as the kernel's opcodes are.
public enum FileOperation: Int, CaseIterable, Sendable {
    case lookup, forget, getattr, setattr, access, readlink, statfs, mkdir, mknod, symlink, link, unlink, rmdir, rename
    case open, create, read, write, flush, release, fsync, fallocate, lseek, copyFileRange
    case opendir, readdir, readdirplus, releasedir, fsyncdir, getxattr, listxattr, setxattr, removexattr

    public var name: String {
        switch self {
        case .copyFileRange: return "copy_file_range"
        default: return "\(self)"
        }
    }
}

/// Who owns a file, as metrics tell owners apart (never by name).
public enum OwnerKind: String, CaseIterable, Sendable {
    /// No owner record: a plain passthrough file.
    case none
    /// An owner whose bytes are stored plain (unmanaged, or a policy that does not encrypt).
    case plain
    /// A managed owner's encrypted file.
    case encrypted
}

/// What the mounts count, shared by every mount of the daemon. Each request costs two atomic
/// increments and one histogram update (a short lock); the objects are made once, so the request
/// path allocates nothing.
public final class MountMetrics: Sendable {
    private let registry: PrometheusCollectorRegistry
    private let requests: [Counter]
    private let durations: [DurationHistogram]
    private let errors = Mutex<[Int64: Counter]>([:])
    private let created: [OwnerKind: Counter]
    private let tampering: [TamperKind: Counter]
    private let tornWrites: [TamperKind: Counter]
    /// Requests served through per-CPU request rings (FUSE over io_uring) rather than /dev/fuse.
    public let ringRequests: Counter
    /// Requests a ring's thread handed to a worker because they may wait (fsync, large reads and writes …).
    public let ringHandoffs: Counter
    /// Changes and large reads or writes that took 10 ms or more: the store is slow, and the rings
    /// hand changes to workers for the next 10 s.
    public let slowStoreRequests: Counter
    /// Times a CPU's ring threads were raised from idle to normal priority because requests waited.
    public let ringPriorityRaises: Counter
    /// Plaintext bytes encrypted into and decrypted out of the mounts' files.
    public let bytesEncrypted: Counter
    public let bytesDecrypted: Counter

    /// Latency buckets: a FUSE round trip takes tens of microseconds; a cold disk read milliseconds.
    static let buckets: [Duration] = [.microseconds(10), .microseconds(25), .microseconds(50), .microseconds(100), .microseconds(250),
                                      .microseconds(500), .milliseconds(1), .microseconds(2500), .milliseconds(10), .milliseconds(50),
                                      .milliseconds(250), .seconds(1)]

    init(registry: PrometheusCollectorRegistry) {
        self.registry = registry
        requests = FileOperation.allCases.map {
            registry.counter("custody_fuse_requests_total", [("op", $0.name)],
                                 help: "FUSE requests served, by operation.")
        }
        durations = FileOperation.allCases.map {
            registry.histogram("custody_fuse_request_duration_seconds", [("op", $0.name)], buckets: Self.buckets,
                                           help: "Time from receiving a FUSE request to answering it, by operation.")
        }
        created = Dictionary(uniqueKeysWithValues: OwnerKind.allCases.map {
            ($0, registry.counter("custody_files_created_total", [("owner", $0.rawValue)],
                                  help: "Files created through the mounts, by owner kind (none, plain, encrypted)."))
        })
        tampering = Dictionary(uniqueKeysWithValues: TamperKind.allCases.map {
            ($0, registry.counter("custody_tamper_detections_total", [("kind", $0.rawValue)],
                                  help: "Requests refused because an encrypted file failed authentication (block, header, truncated)."))
        })
        tornWrites = Dictionary(uniqueKeysWithValues: TamperKind.allCases.map {
            ($0, registry.counter("custody_torn_writes_total", [("kind", $0.rawValue)],
                                  help: "Requests refused because an encrypted file ends in a block torn by a write the daemon had not finished when it stopped uncleanly (block, header, truncated)."))
        })
        ringRequests = registry.counter("custody_fuse_ring_requests_total",
                                        help: "FUSE requests served through per-CPU request rings (FUSE over io_uring) rather than /dev/fuse.")
        ringHandoffs = registry.counter("custody_fuse_ring_handoffs_total",
                                        help: "FUSE requests from a request ring handed to a worker thread because they may wait (fsync, large reads and writes, truncation).")
        slowStoreRequests = registry.counter("custody_fuse_slow_store_requests_total",
                                             help: "Changes to a backing store and large reads or writes that took 10 ms or more through the request rings; for 10 s after each, changes go to worker threads.")
        ringPriorityRaises = registry.counter("custody_fuse_ring_priority_raises_total",
                                              help: "Times a CPU's ring threads went from idle to normal priority because a request waited for them.")
        bytesEncrypted = registry.counter("custody_encrypted_bytes_total", help: "Plaintext bytes encrypted into the mounts' files.")
        bytesDecrypted = registry.counter("custody_decrypted_bytes_total", help: "Plaintext bytes decrypted from the mounts' files.")
        // The most common error, so that the family is never empty.
        _ = errorCounter(.lookup, Errno.noSuchFile.rawValue)
    }

    /// One answered request: its operation, how long it took, and the errno it was answered with (0: success).
    @inline(__always)
    public func served(_ operation: FileOperation, nanoseconds: Int64, errno: Int32) {
        requests[operation.rawValue].increment()
        durations[operation.rawValue].recordNanoseconds(nanoseconds)
        if errno != 0 { errorCounter(operation, errno).increment() }
    }

    public func created(_ owner: OwnerKind) { created[owner]?.increment() }

    public func tampered(_ kind: TamperKind) { tampering[kind]?.increment() }

    public func tornWrite(_ kind: TamperKind) { tornWrites[kind]?.increment() }

    /// The error counter of an operation and errno, made the first time it is needed.
    private func errorCounter(_ operation: FileOperation, _ errno: Int32) -> Counter {
        let key = Int64(operation.rawValue) << 32 | Int64(UInt32(bitPattern: errno))
        if let known = errors.withLock({ $0[key] }) { return known }
        let counter = registry.counter("custody_fuse_errors_total", [("op", operation.name), ("errno", Errno(errno).name)],
                                           help: "FUSE requests answered with an error, by operation and errno.")
        errors.withLock { $0[key] = counter }
        return counter
    }
}
