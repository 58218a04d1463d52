import CLinux
import Glibc
import Synchronization

/// A few large buffers kept for reuse across requests.
///
/// A buffer freshly allocated for every 1 MiB request is fresh memory every time: the kernel maps
/// new pages and, on a virtual machine, the host backs each one on its first touch. On the
/// project's machine that first touch ran at about 400 MB/s, so copying a request into a new
/// buffer cost more than decrypting it. Buffers kept here stay resident.
///
/// At most `keep` buffers are kept (the rest are freed when returned), so the memory held is
/// bounded; requests larger than `capacity` get a buffer of their own. Requests of at most
/// `smallLimit` bytes come from the thread's scratch (`ThreadScratch`): no lock, and no whole
/// `capacity` buffer mapped when every kept one is busy (a 4 KiB request then paid a page fault
/// and an munmap, whose TLB shootdown interrupts the other CPUs). Buffers are mapped and
/// unmapped directly, not taken from malloc: a freed one leaves the process at once (malloc
/// would keep a burst's worth of 1 MiB blocks resident in its arenas).
public final class BufferPool: Sendable {
    /// Bytes in each kept buffer.
    public let capacity: Int
    /// How many buffers are kept between uses.
    public let keep: Int
    /// Whether a buffer's used bytes are zeroed when it comes back (buffers that hold plaintext).
    public let zeroesOnReturn: Bool
    /// Requests of at most this many bytes use the thread's scratch instead of a kept buffer.
    public let smallLimit: Int
    private let free: Mutex<[UnsafeMutableRawBufferPointerBox]>

    public init(capacity: Int, keep: Int, zeroesOnReturn: Bool, smallLimit: Int = 0) {
        self.capacity = capacity
        self.keep = keep
        self.zeroesOnReturn = zeroesOnReturn
        self.smallLimit = smallLimit
        free = Mutex([])
    }

    deinit {
        free.withLock { buffers in
            for box in buffers { Self.unmap(box.buffer) }
            buffers.removeAll()
        }
    }

    /// A fresh buffer, kept out of core dumps: its bytes are plaintext of protected files. (Not
    /// locked: pooled buffers come and go; the threads' scratch regions, which stay, are.)
    private static func map(_ byteCount: Int) -> UnsafeMutableRawBufferPointer? {
        let address = mmap(nil, byteCount, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        guard let address, address != MAP_FAILED else { return nil }
        _ = clinux_protect_memory(address, byteCount, 0)
        return UnsafeMutableRawBufferPointer(start: address, count: byteCount)
    }

    private static func unmap(_ buffer: UnsafeMutableRawBufferPointer) {
        munmap(buffer.baseAddress, buffer.count)
    }

    /// Runs `body` with a buffer of exactly `byteCount` bytes (a prefix of a kept buffer).
    public func withBuffer<R, E: Error>(byteCount: Int, _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        if byteCount <= smallLimit {
            return try ThreadScratch.withBuffer(byteCount: byteCount, zeroing: zeroesOnReturn, body)
        }
        let count = max(byteCount, 1)
        let pooled = count <= capacity ? (free.withLock { $0.popLast()?.buffer } ?? Self.map(capacity)) : nil
        guard let buffer = pooled else {
            return try withHeapBuffer(byteCount: byteCount, zeroing: zeroesOnReturn, body)
        }
        defer {
            if zeroesOnReturn {
                UnsafeMutableRawBufferPointer(rebasing: buffer[0..<count]).initializeMemory(as: UInt8.self, repeating: 0)
            }
            let kept = free.withLock { buffers -> Bool in
                guard buffers.count < keep else { return false }
                buffers.append(UnsafeMutableRawBufferPointerBox(buffer: buffer))
                return true
            }
            if !kept { Self.unmap(buffer) }
        }
        return try body(UnsafeMutableRawBufferPointer(rebasing: buffer[0..<byteCount]))
    }

    /// Buffers kept now (for tests).
    public var keptCount: Int { free.withLock { $0.count } }
}

/// A buffer pointer that may cross threads (the pool hands each to one user at a time).
struct UnsafeMutableRawBufferPointerBox: @unchecked Sendable {
    let buffer: UnsafeMutableRawBufferPointer
}
