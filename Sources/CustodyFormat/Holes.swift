import CustodyCrypto
import CustodySystem

/// The blocks of a version 2 file that are holes: never written, so stored as zeros (and sparse
/// on the backing store). A block of zeros that is not listed here is not a hole but damage or
/// tampering, and reads as an error. Ranges of block indices, sorted, disjoint, never adjacent.
struct HoleSet: Equatable {
    private(set) var ranges: [Range<UInt64>] = []

    var isEmpty: Bool { ranges.isEmpty }

    func contains(_ block: UInt64) -> Bool {
        var low = 0, high = ranges.count
        while low < high {
            let middle = (low + high) / 2
            if ranges[middle].upperBound <= block { low = middle + 1 } else { high = middle }
        }
        return low < ranges.count && ranges[low].contains(block)
    }

    func intersects(_ blocks: Range<UInt64>) -> Bool {
        ranges.contains { $0.overlaps(blocks) }
    }

    mutating func insert(_ blocks: Range<UInt64>) {
        guard !blocks.isEmpty else { return }
        var merged = blocks
        var kept: [Range<UInt64>] = []
        for range in ranges {
            if range.upperBound < merged.lowerBound || range.lowerBound > merged.upperBound {
                kept.append(range)
            } else {
                merged = min(range.lowerBound, merged.lowerBound)..<max(range.upperBound, merged.upperBound)
            }
        }
        kept.append(merged)
        ranges = kept.sorted { $0.lowerBound < $1.lowerBound }
    }

    mutating func remove(_ blocks: Range<UInt64>) {
        guard !blocks.isEmpty else { return }
        var kept: [Range<UInt64>] = []
        for range in ranges {
            guard range.overlaps(blocks) else {
                kept.append(range)
                continue
            }
            if range.lowerBound < blocks.lowerBound { kept.append(range.lowerBound..<blocks.lowerBound) }
            if range.upperBound > blocks.upperBound { kept.append(blocks.upperBound..<range.upperBound) }
        }
        ranges = kept
    }

    /// Drops everything from block `count` on (the file was cut to `count` blocks).
    mutating func trim(toBlocks count: UInt64) {
        ranges = ranges.compactMap { range in
            range.lowerBound >= count ? nil : range.lowerBound..<min(range.upperBound, count)
        }
    }

    // MARK: The stored record

    /// The most ranges a record holds (it lives in an extended attribute, at most 64 KiB).
    static let maxRanges = 2048
    static let recordVersion: UInt8 = 1
    static let context = Array("custody/v2/holes".utf8)

    /// `version (1) ‖ count (4, LE) ‖ (first block (8, LE) ‖ block count (8, LE)) × count ‖
    /// nonce (12) ‖ tag (16)`; the tag is AES-256-GCM under the file's content key over an empty
    /// message, with associated data `"custody/v2/holes" ‖ file ID ‖ everything before the nonce`.
    func record(cipher: ContentCipher, nonce fixedNonce: [UInt8]? = nil) throws(FormatError) -> [UInt8] {
        var body = [UInt8](repeating: 0, count: 5 + ranges.count * 16)
        body[0] = Self.recordVersion
        body.storeLE(UInt32(ranges.count), at: 1)
        for (index, range) in ranges.enumerated() {
            body.storeLE(range.lowerBound, at: 5 + index * 16)
            body.storeLE(range.upperBound - range.lowerBound, at: 13 + index * 16)
        }
        // A fixed nonce only for test vectors.
        var nonce = fixedNonce ?? [UInt8](repeating: 0, count: AESGCMKey.nonceSize)
        if fixedNonce == nil {
            do throws(CryptoError) {
                try nonce.withMutableBytes { (bytes) throws(CryptoError) in try Random.fill(bytes) }
            } catch {
                throw .crypto(error)
            }
        }
        guard nonce.count == AESGCMKey.nonceSize else { throw .unsupported("a hole record nonce of \(nonce.count) bytes") }
        let tag = try Self.tag(body: body, nonce: nonce, cipher: cipher)
        return body + nonce + tag
    }

    /// The set a record describes, if its tag verifies for this file; nil otherwise.
    static func decode(_ record: [UInt8], cipher: ContentCipher) -> HoleSet? {
        let trailer = AESGCMKey.nonceSize + AESGCMKey.tagSize
        guard record.count >= 5 + trailer, record[0] == recordVersion else { return nil }
        let body = Array(record[0..<(record.count - trailer)])
        let nonce = Array(record[body.count..<(body.count + AESGCMKey.nonceSize)])
        let tag = Array(record[(body.count + AESGCMKey.nonceSize)...])
        guard let expected = try? Self.tag(body: body, nonce: nonce, cipher: cipher), constantTimeEquals(expected, tag) else { return nil }
        return body.withUnsafeBytes { raw -> HoleSet? in
            let count = Int(raw.loadLE(UInt32.self, at: 1))
            guard count <= maxRanges, raw.count == 5 + count * 16 else { return nil }
            var set = HoleSet()
            for index in 0..<count {
                let first = raw.loadLE(UInt64.self, at: 5 + index * 16), length = raw.loadLE(UInt64.self, at: 13 + index * 16)
                let (end, overflow) = first.addingReportingOverflow(length)
                guard !overflow, length > 0 else { return nil }
                set.insert(first..<end)
            }
            return set
        }
    }

    private static func tag(body: [UInt8], nonce: [UInt8], cipher: ContentCipher) throws(FormatError) -> [UInt8] {
        let aad = context + cipher.fileID + body
        var tag = [UInt8](repeating: 0, count: AESGCMKey.tagSize)
        // The map is authenticated, not encrypted: an empty message whose data is all in the AAD.
        var empty: UInt8 = 0
        do throws(CryptoError) {
            try aad.withBytes { (aadBytes) throws(CryptoError) in
                try nonce.withBytes { (nonceBytes) throws(CryptoError) in
                    try tag.withMutableBytes { (tagBytes) throws(CryptoError) in
                        try withUnsafeMutableBytes(of: &empty) { (emptyBytes) throws(CryptoError) in
                            guard let tagStart = tagBytes.baseAddress, let emptyStart = emptyBytes.baseAddress else {
                                throw CryptoError.library("no buffer")
                            }
                            try cipher.key.seal(nonce: nonceBytes, aad: aadBytes, plaintext: UnsafeRawBufferPointer(rebasing: emptyBytes[0..<0]),
                                                ciphertext: emptyStart, tag: tagStart)
                        }
                    }
                }
            }
        } catch {
            throw .crypto(error)
        }
        return tag
    }
}
