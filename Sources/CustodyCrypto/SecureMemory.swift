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

    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: pointer, count: count))
    }

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

/// Slabs of libsodium secure memory, cut into fixed slots for small secrets.
final class SecurePool: @unchecked Sendable {
    static let shared = SecurePool()
    static let slotSize = 64
    static let slabSize = 16384

    struct Allocation: Sendable {
        nonisolated(unsafe) let pointer: UnsafeMutableRawPointer
        let pooled: Bool
    }

    private struct State {
        var free: [UnsafeMutableRawPointer] = []
        var slabs = 0
    }

    private let state = Mutex(State())

    /// Secure memory for `count` bytes; nil when libsodium is unusable or memory is exhausted.
    func allocate(_ count: Int) -> Allocation? {
        guard sodiumReady else { return nil }
        if count > Self.slotSize {
            return sodium_malloc(count).map { Allocation(pointer: $0, pooled: false) }
        }
        let pointer: UnsafeMutableRawPointer? = state.withLock { state in
            if let slot = state.free.popLast() { return slot }
            guard let slab = sodium_malloc(Self.slabSize) else { return nil }
            state.slabs += 1
            let slots = Self.slabSize / Self.slotSize
            for index in 1..<slots { state.free.append(slab + index * Self.slotSize) }
            return slab
        }
        return pointer.map { Allocation(pointer: $0, pooled: true) }
    }

    func release(_ allocation: Allocation) {
        if allocation.pooled {
            sodium_memzero(allocation.pointer, Self.slotSize)
            state.withLock { $0.free.append(allocation.pointer) }
        } else {
            sodium_free(allocation.pointer)
        }
    }

    /// Slabs allocated so far (for tests).
    var slabCount: Int { state.withLock { $0.slabs } }
}

