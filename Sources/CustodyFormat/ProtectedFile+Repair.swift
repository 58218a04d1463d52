import CustodyCrypto
import CustodySystem
import Glibc

/// What `ProtectedFile.repair` found and did.
public struct RepairOutcome: Equatable, Sendable {
    /// The plaintext size the stored length gave (nil: a length no file can have, cut inside a block).
    public var sizeBefore: UInt64?
    /// The plaintext size now: the file's last authentic block ends there.
    public var sizeAfter: UInt64
    /// The first block that failed authentication, or the last one when it was not sealed as the
    /// last; nil when the file was whole.
    public var firstDamagedBlock: UInt64?

    /// Whether the file was changed.
    public var repaired: Bool { firstDamagedBlock != nil || sizeBefore != sizeAfter }
}

extension ProtectedFile {
    /// Cuts an encrypted file back to its last authentic block, for a file a crash (or damage) left
    /// unreadable past some point: bytes past the last whole block go; blocks are opened in order
    /// and the file ends before the first that fails (holes listed in its hole record count as
    /// whole); the new last block is re-sealed as the final block, so the size is authenticated
    /// again. A file that is whole is left as it is. Everything kept is what was there: nothing
    /// is decrypted that did not verify, and nothing past the first damaged block is kept, even
    /// blocks that would verify (a file is a prefix or nothing). The header is not repaired: a
    /// file whose header fails cannot be opened at all.
    public static func repair(_ storage: BlockStorage, header: FileHeader, fileKey: SecretBytes) throws(FormatError) -> RepairOutcome {
        let layout = BlockLayout(blockSize: header.blockSize)
        let stored = try storage.size()
        guard stored >= layout.headerLength else { throw .corruptLength(stored) }
        let body = stored - layout.headerLength
        let overhead = UInt64(BlockLayout.overhead)
        var blocks = body / layout.storedBlockSize
        let rest = body % layout.storedBlockSize
        var lastLength = layout.blockSize
        if rest > overhead {
            blocks += 1
            lastLength = rest - overhead
        }
        let implied = blocks == 0 ? 0 : (blocks - 1) * layout.blockSize + lastLength
        // Bytes past the last whole block that cannot be a block: cut first, so that the file opens.
        let tornTail = rest > 0 && rest <= overhead
        if tornTail { try storage.truncate(to: layout.storedSize(plaintextSize: implied)) }
        let file = try ProtectedFile(storage: storage, header: header, fileKey: fileKey, parallelism: 1, plaintextSize: implied)

        // Blocks that open, in order; the last may be whole but not sealed as the last block.
        var good: UInt64 = 0
        var sealedLast = true
        var plaintext = [UInt8](repeating: 0, count: Int(layout.blockSize))
        defer { plaintext.withUnsafeMutableBytes { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        while good < blocks {
            do throws(FormatError) {
                _ = try plaintext.withMutableBytes { (buffer) throws(FormatError) in try file.read(into: buffer, at: good * layout.blockSize) }
                good += 1
            } catch .truncated where good == blocks - 1 {
                sealedLast = false
                good += 1
            } catch {
                guard ProtectedFile.isDamage(error) else { throw error }
                break
            }
        }
        if good == blocks, sealedLast {
            return RepairOutcome(sizeBefore: tornTail ? nil : implied, sizeAfter: implied, firstDamagedBlock: nil)
        }
        pthread_rwlock_wrlock(file.sizeLock)
        defer { pthread_rwlock_unlock(file.sizeLock) }
        if good == blocks {
            // Whole, but the last block was not sealed as the last (a cut at a block boundary):
            // read it as an inner block, write it back as the last. Its size stays.
            let last = blocks - 1
            try file.storeBlocks(last...last, oldSize: implied + 1, newSize: implied, data: nil, dataOffset: 0)
            try storage.sync()
            return RepairOutcome(sizeBefore: tornTail ? nil : implied, sizeAfter: implied, firstDamagedBlock: last)
        }
        let size = good * layout.blockSize
        if good == 0 {
            try storage.truncate(to: layout.headerLength)
        } else {
            try file.storeBlocks((good - 1)...(good - 1), oldSize: implied, newSize: size, data: nil, dataOffset: 0)
            try storage.truncate(to: layout.storedSize(plaintextSize: size))
            file.filledHoles((good - 1)...(good - 1))
        }
        file.plaintextSize = size
        file.cutHoles(toSize: size)
        try storage.sync()
        return RepairOutcome(sizeBefore: tornTail ? nil : implied, sizeAfter: size, firstDamagedBlock: good)
    }

    /// Whether a read failed because the stored bytes are damaged (not because the storage or the
    /// crypto library failed).
    static func isDamage(_ error: FormatError) -> Bool {
        switch error {
        case .blockAuthenticationFailed, .truncated, .corruptLength: return true
        default: return false
        }
    }
}
