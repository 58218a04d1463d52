/// Where content blocks sit in stored bytes, and the plaintext size that a stored size implies.
///
/// Stored: `header (512) ‖ block 0 ‖ block 1 ‖ …`; each block is `nonce (12) ‖ ciphertext ‖ tag (16)`,
/// with `blockSize` bytes of ciphertext except in the final block (1 … blockSize).
public struct BlockLayout: Equatable, Sendable {
    public static let overhead = 28
    public let blockSize: UInt64
    public let headerLength: UInt64

    public init(blockSize: UInt32 = FileHeader.defaultBlockSize, headerLength: Int = FileHeader.length) {
        self.blockSize = UInt64(blockSize)
        self.headerLength = UInt64(headerLength)
    }

    public var storedBlockSize: UInt64 { blockSize + UInt64(Self.overhead) }

    /// Offset of block `index` in the stored bytes.
    public func storedOffset(ofBlock index: UInt64) -> UInt64 { headerLength + index * storedBlockSize }

    /// Plaintext size for `storedSize` stored bytes; no content is read.
    public func plaintextSize(storedSize: UInt64) throws(FormatError) -> UInt64 {
        guard storedSize >= headerLength else { throw .corruptLength(storedSize) }
        let body = storedSize - headerLength
        let full = body / storedBlockSize, rest = body % storedBlockSize
        if rest == 0 { return full * blockSize }
        guard rest > UInt64(Self.overhead) else { throw .corruptLength(storedSize) }
        return full * blockSize + rest - UInt64(Self.overhead)
    }

    /// Stored bytes for a plaintext of `size` bytes.
    public func storedSize(plaintextSize size: UInt64) -> UInt64 {
        let full = size / blockSize, rest = size % blockSize
        return headerLength + full * storedBlockSize + (rest > 0 ? rest + UInt64(Self.overhead) : 0)
    }

    /// Index of the block holding plaintext byte `offset`.
    public func block(containing offset: UInt64) -> UInt64 { offset / blockSize }

    /// Plaintext bytes in block `index` of a file of `size` bytes (0 past its end).
    public func plaintextLength(ofBlock index: UInt64, fileSize size: UInt64) -> UInt64 {
        let start = index * blockSize
        guard size > start else { return 0 }
        return min(blockSize, size - start)
    }
}
