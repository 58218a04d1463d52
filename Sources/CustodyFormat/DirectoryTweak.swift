import CustodyCrypto
import CustodySystem
import Glibc

/// The tweak of a backing directory: 16 random bytes in the directory's attribute
/// `trusted.custody.dirid` (only root can set `trusted.*`; `StoreAttributes.directoryTweak`), which the names of managed entries in
/// it are encrypted with (`NameCipher`), so that the same name in two directories is stored
/// differently. Made when the directory first holds an encrypted name; it moves with the
/// directory, so renaming a directory leaves the names inside as they are.
public enum DirectoryTweak {
    public static let attributeName = "trusted.custody.dirid"

    /// The tweak of the directory at `path` (a `/proc/self/fd/N` path does for a descriptor, an
    /// `O_PATH` one included); nil when it has none.
    public static func read(_ path: String, names: StoreAttributes = .trusted) throws(FormatError) -> [UInt8]? {
        var value = [UInt8](repeating: 0, count: NameCipher.tweakSize + 1)
        var length = 0
        var failure: Errno?
        value.withUnsafeMutableBytes { buffer in
            do throws(Errno) {
                length = try Syscall.getxattr(path, names.directoryTweak, buffer.baseAddress, buffer.count)
            } catch {
                failure = error
            }
        }
        if let failure {
            if failure == .noData { return nil }
            throw .io(failure)
        }
        guard length == NameCipher.tweakSize else { throw .corruptName("the directory's tweak is \(length) bytes") }
        return Array(value.prefix(length))
    }

    /// The tweak of the directory open as `fd` (a descriptor it can be read by, not `O_PATH`).
    public static func read(fd: Int32, names: StoreAttributes = .trusted) throws(FormatError) -> [UInt8]? {
        var value = [UInt8](repeating: 0, count: NameCipher.tweakSize + 1)
        let length: Int
        do {
            length = try value.withMutableBytes { (buffer) throws(Errno) in try Syscall.fgetxattr(fd, names.directoryTweak, buffer.baseAddress, buffer.count) }
        } catch where error == .noData {
            return nil
        } catch {
            throw .io(error)
        }
        guard length == NameCipher.tweakSize else { throw .corruptName("the directory's tweak is \(length) bytes") }
        return Array(value.prefix(length))
    }

    /// The tweak of the directory open as `fd` (for reading), made now if it has none. For a
    /// directory just made: it is tried as absent first.
    public static func ensure(fd: Int32, names: StoreAttributes = .trusted) throws(FormatError) -> [UInt8] {
        let fresh: [UInt8]
        do { fresh = try Random.bytes(NameCipher.tweakSize) } catch { throw .crypto(error) }
        do {
            try fresh.withBytes { (bytes) throws(Errno) in
                try Syscall.fsetxattr(fd, names.directoryTweak, bytes.baseAddress, bytes.count, Linux.XATTR_CREATE)
            }
        } catch where error == .exists {
            guard let winner = try read(fd: fd, names: names) else { throw .corruptName("the directory's tweak went away") }
            return winner
        } catch {
            throw .io(error)
        }
        return fresh
    }

    /// Makes the tweak of the directory `name` in `directory`, just made, by name in one call
    /// where the kernel can (`Syscall.setxattr(in:…)`), else through a descriptor opened on it.
    /// A tweak that is there already (another request made it first) is read and returned.
    public static func make(in directory: Int32, named name: UnsafePointer<CChar>, names: StoreAttributes = .trusted) throws(FormatError) -> [UInt8] {
        let fresh: [UInt8]
        do { fresh = try Random.bytes(NameCipher.tweakSize) } catch { throw .crypto(error) }
        let made: Bool
        do {
            made = try fresh.withBytes { (bytes) throws(Errno) in
                try Syscall.setxattr(in: directory, name, names.directoryTweak, bytes.baseAddress, bytes.count, Linux.XATTR_CREATE)
            }
        } catch where error == .exists {
            made = false
        } catch {
            throw .io(error)
        }
        if made { return fresh }
        let fd: Int32
        do { fd = try Syscall.openat(directory, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0) } catch { throw .io(error) }
        defer { Syscall.close(fd) }
        return try ensure(fd: fd, names: names)
    }

    /// The directory's tweak, made now if it has none. Two callers at once agree: the attribute is
    /// created only if absent, and whoever loses the race reads the winner's.
    public static func ensure(_ path: String, names: StoreAttributes = .trusted) throws(FormatError) -> [UInt8] {
        if let existing = try read(path, names: names) { return existing }
        let fresh: [UInt8]
        do { fresh = try Random.bytes(NameCipher.tweakSize) } catch { throw .crypto(error) }
        var failure: Errno?
        fresh.withUnsafeBytes { bytes in
            do throws(Errno) {
                try Syscall.setxattr(path, names.directoryTweak, bytes.baseAddress, bytes.count, Linux.XATTR_CREATE)
            } catch {
                failure = error
            }
        }
        guard let failure else { return fresh }
        guard failure == .exists else { throw .io(failure) }
        guard let winner = try read(path, names: names) else { throw .corruptName("the directory's tweak went away") }
        return winner
    }
}
