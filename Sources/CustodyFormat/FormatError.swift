import CustodyCrypto
import CustodySystem

/// Why protected content could not be read or written. None of these ever comes with plaintext.
public enum FormatError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The data does not start with a Custody header.
    case notProtected
    /// A header of a format version this build does not read.
    case unsupportedVersion(UInt16)
    /// A header that breaks the layout rules (the reason says which).
    case corruptHeader(String)
    /// The header names another class key than the one offered (`keyID` is the header's).
    case wrongKey(keyID: [UInt8])
    /// The wrapped file key did not verify: the header was modified, or the key is wrong.
    case headerAuthenticationFailed
    /// Content block `index` did not verify: modified, moved, or from another file.
    case blockAuthenticationFailed(index: UInt64)
    /// The content ends with block `lastBlock`, which was not written as the final block.
    case truncated(lastBlock: UInt64)
    /// The content length cannot result from any plaintext length (cut inside a block).
    case corruptLength(UInt64)
    /// An owner identity that is empty or longer than the header holds.
    case invalidOwner(String)
    /// A stored name or symlink target that does not open with the key offered (changed, moved from
    /// another directory, another identity's) or is not a name at all.
    case corruptName(String)
    /// An operation the file's kind does not support (for example content I/O on a plain record).
    case unsupported(String)
    /// The storage below failed.
    case io(Errno)
    /// The crypto library failed (not an authentication failure: those have their own cases).
    case crypto(CryptoError)

    public var description: String {
        switch self {
        case .notProtected: return "not a Custody protected file"
        case .unsupportedVersion(let version): return "unsupported format version \(version)"
        case .corruptHeader(let reason): return "corrupt header: \(reason)"
        case .wrongKey: return "the file is protected with a different key"
        case .headerAuthenticationFailed: return "the header failed authentication (modified, or wrong key)"
        case .blockAuthenticationFailed(let index): return "content block \(index) failed authentication"
        case .truncated(let block): return "the content was truncated after block \(block)"
        case .corruptLength(let length): return "content length \(length) is impossible for this format"
        case .invalidOwner(let reason): return "invalid owner identity: \(reason)"
        case .corruptName(let reason): return "encrypted name: \(reason)"
        case .unsupported(let what): return "unsupported: \(what)"
        case .io(let errno): return "I/O error: \(errno)"
        case .crypto(let error): return "crypto error: \(error)"
        }
    }
}

extension FormatError: ErrnoConvertible {
    /// The errno a file system caller sees: an I/O error's own, else EIO.
    public var errnoValue: Errno {
        if case .io(let error) = self { return error }
        return .ioError
    }
}
