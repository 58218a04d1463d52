import CLinux
import Glibc

/// A POSIX error number. Every syscall wrapper in this module throws it, so callers at the
/// FUSE boundary can reply with `rawValue` and callers elsewhere get a readable message.
public struct Errno: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32

    @inlinable public init(_ rawValue: Int32) { self.rawValue = rawValue }

    /// The calling thread's `errno`.
    @inlinable public static var current: Errno { Errno(errno) }

    public var description: String {
        "\(String(cString: strerror(rawValue))) (errno \(rawValue))"
    }

    /// The symbolic name ("ENOENT"), or "E" and the number for one glibc does not name.
    public var name: String {
        clinux_errno_name(rawValue).map { String(cString: $0) } ?? "E\(rawValue)"
    }

    public static let notPermitted = Errno(EPERM)
    public static let noSuchFile = Errno(ENOENT)
    public static let noSuchProcess = Errno(ESRCH)
    public static let interrupted = Errno(EINTR)
    public static let ioError = Errno(EIO)
    public static let badFileDescriptor = Errno(EBADF)
    public static let accessDenied = Errno(EACCES)
    public static let exists = Errno(EEXIST)
    public static let notDirectory = Errno(ENOTDIR)
    public static let isDirectory = Errno(EISDIR)
    public static let invalidArgument = Errno(EINVAL)
    public static let noSpace = Errno(ENOSPC)
    public static let rangeError = Errno(ERANGE)
    public static let notEmpty = Errno(ENOTEMPTY)
    public static let notSupported = Errno(EOPNOTSUPP)
    public static let noData = Errno(ENODATA)
    public static let nameTooLong = Errno(ENAMETOOLONG)
    /// `ELOOP`: a symbolic link where none may be followed, or too many in a row.
    public static let tooManySymbolicLinkLevels = Errno(ELOOP)
    /// `EMLINK`: too many hard links.
    public static let tooManyLinks = Errno(EMLINK)
    /// `EBUSY`.
    public static let resourceBusy = Errno(EBUSY)
    /// `ENXIO`.
    public static let noSuchAddressOrDevice = Errno(ENXIO)
    public static let crossDevice = Errno(EXDEV)
    public static let notConnected = Errno(ENOTCONN)
    public static let notImplemented = Errno(ENOSYS)
    /// The corresponding C error is `EROFS`.
    public static let readOnlyFileSystem = Errno(EROFS)
}

/// An error with the errno a file system caller sees for it (`FormatError`, `EngineError`,
/// `CryptoError`, and `Errno` itself), so that the FUSE boundary bridges them all one way.
public protocol ErrnoConvertible: Error {
    var errnoValue: Errno { get }
}

extension Errno: ErrnoConvertible {
    @inlinable public var errnoValue: Errno { self }
}

/// Runs `body` and turns its typed error into the errno it maps to:
/// `let n = try asErrno { () throws(FormatError) in try file.read(into: buffer, at: 0) }`.
@inlinable @inline(__always)
public func asErrno<T, E: ErrnoConvertible>(_ body: () throws(E) -> T) throws(Errno) -> T {
    do { return try body() } catch { throw error.errnoValue }
}

/// The same, calling `failed` with the error first (to release what `body` was handed, to log
/// or count it) before the errno is thrown.
@inlinable @inline(__always)
public func asErrno<T, E: ErrnoConvertible>(_ body: () throws(E) -> T, failed: (E) -> Void) throws(Errno) -> T {
    do { return try body() } catch {
        failed(error)
        throw error.errnoValue
    }
}

/// Returns `result`, or throws the current errno when it is -1.
@inlinable @inline(__always)
public func valueOrErrno<T: FixedWidthInteger>(_ result: T) throws(Errno) -> T {
    if result == -1 { throw Errno.current }
    return result
}

/// Runs `call` again while it fails with EINTR.
@inlinable @inline(__always)
public func retryingOnInterrupt<T: FixedWidthInteger>(_ call: () -> T) throws(Errno) -> T {
    while true {
        let result = call()
        if result != -1 { return result }
        let error = Errno.current
        if error != .interrupted { throw error }
    }
}
