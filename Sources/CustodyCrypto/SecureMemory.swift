import CSodium
import Synchronization

/// libsodium is initialised once, before any use.
let sodiumReady: Bool = sodium_init() >= 0

/// Secret bytes held in libsodium secure memory (locked, guarded), zeroed when released.
///
/// Small secrets (keys) share 16 KiB `sodium_malloc` slabs in 64-byte slots, so that thousands of
/// per-file keys neither cost three mmap calls each nor exceed the locked-memory limit; larger
/// ones get an allocation of their own. The type prints as "redacted" and has no mirror, so a key
/// cannot end up in a log by accident.
public final class SecretBytes: @unchecked Sendable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public let count: Int
    @usableFromInline
    let pointer: UnsafeMutableRawPointer
    private let allocation: SecurePool.Allocation

    /// Zero-filled secret bytes.
    public init(count: Int) throws(CryptoError) {
        guard count > 0 else { throw .invalidLength(what: "secret", expected: 1, actual: 0) }
        guard let allocation = SecurePool.shared.allocate(count) else {
            throw .library("secure memory exhausted (sodium_malloc failed)")
        }
        self.allocation = allocation
        pointer = allocation.pointer
        self.count = count
        sodium_memzero(pointer, count)
    }

    /// A copy of `bytes` in secure memory. The caller zeroes its own copy.
    public convenience init(copying bytes: UnsafeRawBufferPointer) throws(CryptoError) {
        try self.init(count: bytes.count)
        if let base = bytes.baseAddress { pointer.copyMemory(from: base, byteCount: bytes.count) }
    }

    /// Fresh random bytes from the system's CSPRNG.
    public static func random(count: Int) throws(CryptoError) -> SecretBytes {
        let secret = try SecretBytes(count: count)
        randombytes_buf(secret.pointer, count)
        return secret
    }

    deinit {
        sodium_memzero(pointer, count)
        SecurePool.shared.release(allocation)
    }

    @inlinable
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    @inlinable
    public func withUnsafeMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeMutableRawBufferPointer(start: pointer, count: count))
    }

    /// Constant-time equality.
    public func constantTimeEquals(_ other: SecretBytes) -> Bool {
        count == other.count && sodium_memcmp(pointer, other.pointer, count) == 0
    }

    public var description: String { "SecretBytes(\(count) bytes, redacted)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: [:]) }
}

/// Slabs of libsodium secure memory, cut into fixed slots for small secrets: 64-byte slots for
/// keys, 1 KiB slots for keyed cipher states (an AES-GCM context holds the key schedule).
final class SecurePool: @unchecked Sendable {
    static let shared = SecurePool()
    static let slotSizes = [64, 1024]
    static let slabSize = 16384

    struct Allocation: Sendable {
        nonisolated(unsafe) let pointer: UnsafeMutableRawPointer
        /// The entry of `slotSizes` whose slabs it came from; nil for an allocation of its own.
        let sizeClass: Int?
    }

    private struct State {
        /// Free slots, one list per entry of `slotSizes`.
        var free: [[UnsafeMutableRawPointer]] = SecurePool.slotSizes.map { _ in [] }
        var slabs = 0
    }

    private let state = Mutex(State())

    /// Secure memory for `count` bytes; nil when libsodium is unusable or memory is exhausted.
    func allocate(_ count: Int) -> Allocation? {
        guard sodiumReady else { return nil }
        guard let sizeClass = Self.slotSizes.firstIndex(where: { count <= $0 }) else {
            return sodium_malloc(count).map { Allocation(pointer: $0, sizeClass: nil) }
        }
        let slot = Self.slotSizes[sizeClass]
        let pointer: UnsafeMutableRawPointer? = state.withLock { state in
            if let free = state.free[sizeClass].popLast() { return free }
            guard let slab = sodium_malloc(Self.slabSize) else { return nil }
            state.slabs += 1
            for index in 1..<(Self.slabSize / slot) { state.free[sizeClass].append(slab + index * slot) }
            return slab
        }
        return pointer.map { Allocation(pointer: $0, sizeClass: sizeClass) }
    }

    func release(_ allocation: Allocation) {
        guard let sizeClass = allocation.sizeClass else {
            sodium_free(allocation.pointer)
            return
        }
        sodium_memzero(allocation.pointer, Self.slotSizes[sizeClass])
        state.withLock { $0.free[sizeClass].append(allocation.pointer) }
    }

    /// Slabs allocated so far (for tests).
    var slabCount: Int { state.withLock { $0.slabs } }
}
