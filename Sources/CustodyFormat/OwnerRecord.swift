/// The owner of a stored file, kept in an extended attribute of the file, readable without opening
/// it: on ext4 a small attribute sits in the inode, so checking it costs no extra disk read.
///
/// Attribute `trusted.custody.owner` (only root can read or set `trusted.*`, so users cannot forge
/// it from the backing store; `user.custody.store.owner` on a store that keeps only `user.*`
/// attributes: `StoreAttributes`). Version 1 names the owner: `1 ‖ kind (1): 0 plain, 1 encrypted ‖
/// protection class (1) ‖ canonical length (1) ‖ canonical ‖ display length (1) ‖ display`, UTF-8,
/// lengths 1…180 (an unmanaged identity's record, and any record written before version 2).
/// Version 2 names a managed identity by a key ID instead: `2 ‖ kind ‖ protection class ‖ key ID
/// (8)`, the ID of the identity's class D key, which only its keybag links to the identity.
/// Unmanaged owners' files stay byte-for-byte plain and this record is their only mark; for
/// encrypted files the header is authoritative and the record is an index of it.
public struct OwnerRecord: Equatable, Sendable {
    public static let attributeName = "trusted.custody.owner"
    public static let version: UInt8 = 1
    public static let keyIDVersion: UInt8 = 2

    /// Who owns the object, as the record says it.
    public enum Holder: Equatable, Sendable {
        case named(Owner)
        /// A managed identity, by the ID of its class D key.
        case keyID([UInt8])
    }

    public var holder: Holder
    /// The class of an encrypted file; nil for a plain (unmanaged) one.
    public var encryptedClass: ProtectionClass?

    /// The owner the record names (nil for a record by key ID).
    public var owner: Owner? {
        if case .named(let owner) = holder { return owner }
        return nil
    }

    public init(owner: Owner, encryptedClass: ProtectionClass? = nil) {
        holder = .named(owner)
        self.encryptedClass = encryptedClass
    }

    public init(ownerKeyID: [UInt8], encryptedClass: ProtectionClass? = nil) {
        holder = .keyID(ownerKeyID)
        self.encryptedClass = encryptedClass
    }

    public func encoded() -> [UInt8] {
        let kind: [UInt8] = [encryptedClass == nil ? 0 : 1, encryptedClass?.rawValue ?? 0]
        switch holder {
        case .named(let owner):
            let canonical = Array(owner.canonical.utf8), display = Array(owner.display.utf8)
            return [Self.version] + kind + [UInt8(canonical.count)] + canonical + [UInt8(display.count)] + display
        case .keyID(let id):
            return [Self.keyIDVersion] + kind + id
        }
    }

    public static func decode(_ bytes: [UInt8]) throws(FormatError) -> OwnerRecord {
        guard let first = bytes.first else { throw .corruptHeader("empty owner record") }
        guard first == version || first == keyIDVersion else { throw .unsupportedVersion(UInt16(first)) }
        guard bytes.count >= 4 else { throw .corruptHeader("owner record too short") }
        let encryptedClass: ProtectionClass?
        switch bytes[1] {
        case 0:
            guard bytes[2] == 0 else { throw .corruptHeader("a plain owner record with a class") }
            encryptedClass = nil
        case 1:
            guard let value = ProtectionClass(rawValue: bytes[2]) else { throw .corruptHeader("unknown protection class \(bytes[2])") }
            encryptedClass = value
        default:
            throw .corruptHeader("unknown owner record kind \(bytes[1])")
        }
        if first == keyIDVersion {
            guard bytes.count == 3 + FileHeader.classKeyIDSize else { throw .corruptHeader("owner record length mismatch") }
            return OwnerRecord(ownerKeyID: Array(bytes[3...]), encryptedClass: encryptedClass)
        }
        let canonicalLength = Int(bytes[3])
        let displayAt = 4 + canonicalLength
        guard bytes.count > displayAt else { throw .corruptHeader("owner record too short") }
        let displayLength = Int(bytes[displayAt])
        guard bytes.count == displayAt + 1 + displayLength else { throw .corruptHeader("owner record length mismatch") }
        guard let canonical = String(validating: bytes[4..<displayAt], as: UTF8.self),
              let display = String(validating: bytes[(displayAt + 1)...], as: UTF8.self) else {
            throw .corruptHeader("owner record is not valid UTF-8")
        }
        do { return OwnerRecord(owner: try Owner(canonical: canonical, display: display), encryptedClass: encryptedClass) } catch { throw .corruptHeader("\(error)") }
    }
}

import CustodySystem

extension OwnerRecord {
    /// Writes this record on the stored file at `path` (needs root: `trusted.*`).
    public func store(at path: String, names: StoreAttributes = .trusted) throws(FormatError) {
        try storeEncoded { (bytes) throws(Errno) in
            try Syscall.setxattr(path, names.owner, bytes.baseAddress, bytes.count, 0)
        }
    }

    /// Writes this record on the open stored file `fd` (not an `O_PATH` descriptor).
    public func store(on fd: Int32, names: StoreAttributes = .trusted) throws(FormatError) {
        try storeEncoded { (bytes) throws(Errno) in
            try Syscall.fsetxattr(fd, names.owner, bytes.baseAddress, bytes.count, 0)
        }
    }

    private func storeEncoded(_ set: (UnsafeRawBufferPointer) throws(Errno) -> Void) throws(FormatError) {
        let value = encoded()
        do {
            try value.withBytes { (bytes) throws(Errno) in try set(bytes) }
        } catch {
            throw .io(error)
        }
    }

    /// Removes the record from the open stored file `fd` (not an `O_PATH` descriptor).
    public static func remove(from fd: Int32, names: StoreAttributes = .trusted) throws(FormatError) {
        do {
            try Syscall.fremovexattr(fd, names.owner)
        } catch where error == .noData {
        } catch {
            throw .io(error)
        }
    }

    /// The record on the stored file at `path`, or nil when it has none.
    public static func load(from path: String, names: StoreAttributes = .trusted) throws(FormatError) -> OwnerRecord? {
        try load { (bytes) throws(Errno) in try Syscall.getxattr(path, names.owner, bytes.baseAddress, bytes.count) }
    }

    /// The record on the open stored file or directory `fd` (not an `O_PATH` descriptor), or nil
    /// when it has none.
    public static func load(on fd: Int32, names: StoreAttributes = .trusted) throws(FormatError) -> OwnerRecord? {
        try load { (bytes) throws(Errno) in try Syscall.fgetxattr(fd, names.owner, bytes.baseAddress, bytes.count) }
    }

    /// The record of `name` in the directory `directory` (a symlink's own, never its target's);
    /// nil when it has none. One system call where the kernel has `getxattrat`.
    public static func load(in directory: Int32, name: UnsafePointer<CChar>, names: StoreAttributes = .trusted) throws(FormatError) -> OwnerRecord? {
        try load { (bytes) throws(Errno) in try Syscall.getxattr(in: directory, name, names.owner, bytes.baseAddress, bytes.count) }
    }

    /// Reads the attribute with `read` (into a buffer, returning its length; the store's `owner`
    /// attribute is the one to read) and decodes it; nil when `read` finds no such attribute.
    public static func load(_ read: (UnsafeMutableRawBufferPointer) throws(Errno) -> Int) throws(FormatError) -> OwnerRecord? {
        var buffer = [UInt8](repeating: 0, count: 512)
        let count: Int
        do {
            count = try buffer.withMutableBytes { (bytes) throws(Errno) in try read(bytes) }
        } catch where error == .noData {
            return nil
        } catch {
            throw .io(error)
        }
        return try decode(Array(buffer[0..<count]))
    }

    /// Removes the record (the file becomes untracked).
    public static func remove(at path: String, names: StoreAttributes = .trusted) throws(FormatError) {
        do {
            try Syscall.removexattr(path, names.owner)
        } catch where error == .noData {
        } catch {
            throw .io(error)
        }
    }
}
