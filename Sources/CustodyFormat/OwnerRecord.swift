/// The owner of an unmanaged (not encrypted) file, kept in an extended attribute of the stored file
/// instead of a header, so the file stays byte-for-byte plain on the backing store.
///
/// Attribute `trusted.custody.owner` (only root can read or set `trusted.*`, so users cannot forge
/// it from the backing store). Value: `version (1) = 1 ‖ canonical length (1) ‖ canonical ‖
/// display length (1) ‖ display`, UTF-8, lengths 1…180.
public enum OwnerRecord {
    public static let attributeName = "trusted.custody.owner"
    public static let version: UInt8 = 1

    public static func encode(_ owner: Owner) -> [UInt8] {
        let canonical = Array(owner.canonical.utf8), display = Array(owner.display.utf8)
        return [version, UInt8(canonical.count)] + canonical + [UInt8(display.count)] + display
    }

    public static func decode(_ bytes: [UInt8]) throws(FormatError) -> Owner {
        guard let first = bytes.first else { throw .corruptHeader("empty owner record") }
        guard first == version else { throw .unsupportedVersion(UInt16(first)) }
        guard bytes.count >= 2 else { throw .corruptHeader("owner record too short") }
        let canonicalLength = Int(bytes[1])
        let displayAt = 2 + canonicalLength
        guard bytes.count > displayAt else { throw .corruptHeader("owner record too short") }
        let displayLength = Int(bytes[displayAt])
        guard bytes.count == displayAt + 1 + displayLength else { throw .corruptHeader("owner record length mismatch") }
        guard let canonical = String(validating: bytes[2..<displayAt], as: UTF8.self),
              let display = String(validating: bytes[(displayAt + 1)...], as: UTF8.self) else {
            throw .corruptHeader("owner record is not valid UTF-8")
        }
        do { return try Owner(canonical: canonical, display: display) } catch { throw .corruptHeader("\(error)") }
    }
}

import CustodySystem

extension OwnerRecord {
    /// Records `owner` on the stored file at `path` (needs root: `trusted.*`).
    public static func store(_ owner: Owner, at path: String) throws(FormatError) {
        let value = encode(owner)
        do {
            try value.withBytes { (bytes) throws(Errno) in
                try Syscall.setxattr(path, attributeName, bytes.baseAddress, bytes.count, 0)
            }
        } catch {
            throw .io(error)
        }
    }

    /// The owner recorded on the stored file at `path`, or nil when it has none.
    public static func load(from path: String) throws(FormatError) -> Owner? {
        var buffer = [UInt8](repeating: 0, count: 512)
        let count: Int
        do {
            count = try buffer.withMutableBytes { (bytes) throws(Errno) in
                try Syscall.getxattr(path, attributeName, bytes.baseAddress, bytes.count)
            }
        } catch where error == .noData {
            return nil
        } catch {
            throw .io(error)
        }
        return try decode(Array(buffer[0..<count]))
    }

    /// Removes the record (the file becomes untracked).
    public static func remove(at path: String) throws(FormatError) {
        do {
            try Syscall.removexattr(path, attributeName)
        } catch where error == .noData {
        } catch {
            throw .io(error)
        }
    }
}
