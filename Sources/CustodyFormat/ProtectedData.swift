import CustodyCrypto

/// Whole byte buffers in the protected format: what the data protection API (the SDK's
/// `IntuneMAMDataProtectionManager`) protects and unprotects.
public enum ProtectedData {
    /// Managed owner: header and encrypted blocks (`owner` nil: a header that names no owner, as
    /// `ProtectedFile.create`).
    public static func encrypt(_ plaintext: [UInt8], owner: Owner?, protectionClass: ProtectionClass, classKey: ClassKey) throws(FormatError) -> [UInt8] {
        let storage = MemoryStorage()
        let file = try ProtectedFile.create(on: storage, owner: owner, protectionClass: protectionClass, classKey: classKey)
        try plaintext.withBytes { (bytes) throws(FormatError) in try file.write(bytes, at: 0) }
        return storage.bytes
    }

    /// Unmanaged owner: a plain-kind header recording the owner, then the bytes unchanged.
    public static func tag(_ plaintext: [UInt8], owner: Owner) throws(FormatError) -> [UInt8] {
        try FileHeader.plain(owner: owner).encoded() + plaintext
    }

    /// The header of protected bytes, or nil when they are not protected at all.
    public static func header(of bytes: [UInt8]) throws(FormatError) -> FileHeader? {
        let hasMagic = bytes.withUnsafeBytes { FileHeader.hasMagic($0) }
        guard hasMagic else { return nil }
        return try bytes.withBytes { (buffer) throws(FormatError) in try FileHeader.decode(buffer) }
    }

    /// The plaintext of protected bytes: decrypted (managed), the body (unmanaged), or the input
    /// itself when it was never protected (the SDK's rule for `unprotect`).
    public static func unprotect(_ bytes: [UInt8], classKey: (FileHeader) throws(FormatError) -> ClassKey) throws(FormatError) -> [UInt8] {
        guard let header = try header(of: bytes) else { return bytes }
        switch header.kind {
        case .plain:
            return Array(bytes[FileHeader.length...])
        case .encrypted:
            let file = try ProtectedFile.open(MemoryStorage(bytes), classKey: classKey)
            var plaintext = [UInt8](repeating: 0, count: Int(file.size))
            let count = try plaintext.withMutableBytes { (buffer) throws(FormatError) in try file.read(into: buffer, at: 0) }
            guard count == plaintext.count else { throw .corruptLength(UInt64(bytes.count)) }
            return plaintext
        }
    }
}
