import CustodyCrypto
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Work on blocks: a worker per thread (cipher context and scratch), large ranges split across
/// cores, and the striped locks that keep two requests off one block.
extension ProtectedFile {
    /// Runs `body` over `range`, split across cores when the range is large. Each part gets its own
    /// keyed cipher context and scratch buffers. The lowest-numbered part's error is thrown.
    func processBlocks(_ range: ClosedRange<UInt64>, _ body: (ClosedRange<UInt64>, BlockWorker) throws(FormatError) -> Void) throws(FormatError) {
        let count = range.upperBound - range.lowerBound + 1
        let parts = count >= Self.parallelThreshold ? min(UInt64(parallelism), count / (Self.parallelThreshold / 2)) : 1
        if parts <= 1 {
            try BlockWorker.with(self) { (worker) throws(FormatError) in try body(range, worker) }
            return
        }
        let perPart = (count + parts - 1) / parts
        let failures = Mutex<[(Int, FormatError)]>([])
        withoutActuallyEscaping(body) { body in
            // concurrentPerform returns only when every part is done, and the parts touch disjoint
            // blocks of buffers that outlive the call: sharing the closure is safe.
            let shared = UncheckedSendable(body)
            DispatchQueue.concurrentPerform(iterations: Int(parts)) { part in
                let lower = range.lowerBound + UInt64(part) * perPart
                guard lower <= range.upperBound else { return }
                let upper = min(range.upperBound, lower + perPart - 1)
                do throws(FormatError) {
                    try BlockWorker.with(self) { (worker) throws(FormatError) in try shared.value(lower...upper, worker) }
                } catch {
                    failures.withLock { $0.append((part, error)) }
                }
            }
        }
        if let failure = failures.withLock({ $0.min { $0.0 < $1.0 } }) { throw failure.1 }
    }

    /// Locks the stripes of blocks `range` in ascending order; returns the mask to unlock.
    func lockStripes(_ range: ClosedRange<UInt64>) -> UInt64 {
        var mask: UInt64 = 0
        if range.upperBound - range.lowerBound >= UInt64(Self.stripeCount - 1) {
            mask = ~0
        } else {
            for index in range { mask |= 1 << (index % UInt64(Self.stripeCount)) }
        }
        var bits = mask
        while bits != 0 {
            let stripe = bits.trailingZeroBitCount
            pthread_mutex_lock(stripes + stripe)
            bits &= bits - 1
        }
        return mask
    }

    func unlockStripes(_ mask: UInt64) {
        var bits = mask
        while bits != 0 {
            pthread_mutex_unlock(stripes + bits.trailingZeroBitCount)
            bits &= bits - 1
        }
    }
}

/// Per-thread state for processing blocks: the file's cipher context and scratch buffers (from the
/// thread's scratch: a 4 KiB request pays for a worker on every call).
final class BlockWorker {
    /// Keeps the content key, and so `context`, alive while the worker runs.
    let key: AESGCMKey
    let context: AESGCMContext
    let stored: UnsafeMutableRawPointer
    let aad: UnsafeMutableRawPointer
    let scratch: UnsafeMutableRawPointer
    /// Whether the scratch plaintext was handed out (and so may hold a block of the file).
    private(set) var plaintextUsed = false

    init(key: AESGCMKey, scratch: UnsafeMutableRawPointer, blockSize: Int, storedSize: Int) {
        self.key = key
        context = key.context
        self.scratch = scratch
        stored = scratch + blockSize
        aad = stored + storedSize
    }

    /// Runs `body` with a worker for `file`; its scratch plaintext is cleared afterwards if used.
    static func with(_ file: ProtectedFile, _ body: (BlockWorker) throws(FormatError) -> Void) throws(FormatError) {
        let blockSize = Int(file.layout.blockSize)
        let storedSize = (Int(file.layout.storedBlockSize) + 63) & ~63
        try ThreadScratch.withBuffer(byteCount: blockSize + storedSize + 64, zeroing: false) { (scratch) throws(FormatError) in
            let worker = BlockWorker(key: file.cipher.key, scratch: scratch.baseAddress!, blockSize: blockSize, storedSize: storedSize)
            // Requests that decrypt or encrypt whole blocks in place never touch the scratch plaintext.
            defer { if worker.plaintextUsed { scratch.baseAddress!.initializeMemory(as: UInt8.self, repeating: 0, count: blockSize) } }
            try body(worker)
        }
    }

    /// Scratch for one block's plaintext.
    var plaintext: UnsafeMutableRawPointer {
        plaintextUsed = true
        return scratch
    }
}

/// A value handed to concurrent work that only uses it in ways the caller has checked are safe.
struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
