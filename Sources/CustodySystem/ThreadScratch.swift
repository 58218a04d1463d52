import Glibc

/// Scratch memory of the calling thread, for the buffers of small requests.
///
/// A 4 KiB encrypted read or write needs three buffers of a few KiB (its plaintext, its stored
/// bytes, a block's scratch). From malloc those are chunks too large for its thread cache: each
/// request went through malloc's bins and consolidation, about as much CPU as the request's
/// own pread. Here each thread keeps one region and hands out pieces of it in LIFO order
/// (nested `withBuffer` calls), so a small request allocates nothing.
///
/// A request that does not fit in what is left gets a heap buffer of its own. The region lives
/// until its thread ends. It is not cleared between uses: callers that put plaintext in a
/// buffer pass `zeroing: true` (or clear it themselves).
public enum ThreadScratch {
    /// Bytes in each thread's region.
    public static let regionSize = 256 << 10
    static let alignment = 64

    /// One thread's region: `top` bytes of it are in use. Mapped on its own, so that it can be
    /// kept out of core dumps and swap (it holds plaintext).
    final class Region {
        let base: UnsafeMutableRawPointer
        let mapped: Bool
        let locked: Bool
        var top = 0
        init() {
            let address = mmap(nil, ThreadScratch.regionSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            if let address, address != MAP_FAILED {
                base = address
                mapped = true
                locked = LockedMemory.protect(address, ThreadScratch.regionSize)
            } else {
                base = UnsafeMutableRawPointer.allocate(byteCount: ThreadScratch.regionSize, alignment: ThreadScratch.alignment)
                mapped = false
                locked = false
            }
        }
        deinit {
            if mapped { munmap(base, ThreadScratch.regionSize) } else { base.deallocate() }
            if locked { LockedMemory.released(ThreadScratch.regionSize) }
        }
    }

    private static let regions = PerThread { Region() }

    /// Runs `body` with `byteCount` bytes (aligned to 64) that no other code uses meanwhile;
    /// zeroes them afterwards when `zeroing`.
    @inline(__always)
    public static func withBuffer<R, E: Error>(byteCount: Int, zeroing: Bool,
                                               _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let region = regions.value
        let start = region.top
        let rounded = (max(byteCount, 1) + alignment - 1) & ~(alignment - 1)
        guard rounded <= regionSize - start else {
            return try withHeapBuffer(byteCount: byteCount, zeroing: zeroing, body)
        }
        let buffer = UnsafeMutableRawBufferPointer(start: region.base + start, count: byteCount)
        region.top = start + rounded
        defer {
            if zeroing { buffer.initializeMemory(as: UInt8.self, repeating: 0) }
            region.top = start
        }
        return try body(buffer)
    }

    /// Bytes of the calling thread's region in use (for tests).
    public static var bytesInUse: Int { regions.value.top }
}

/// Runs `body` with `byteCount` bytes from the heap (aligned to 64), zeroed before they are freed
/// when `zeroing`: for buffers too large for a pool or a thread's scratch.
func withHeapBuffer<R, E: Error>(byteCount: Int, zeroing: Bool,
                                 _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(byteCount, 1), alignment: 64)
    defer {
        if zeroing { buffer.initializeMemory(as: UInt8.self, repeating: 0) }
        buffer.deallocate()
    }
    return try body(UnsafeMutableRawBufferPointer(rebasing: buffer[0..<byteCount]))
}
