import CLinux
import Glibc

/// What an open that the guard is asked about does, from the flags of the opening thread's call.
enum OpenIntent: Equatable {
    case read
    /// Opens for writing (or truncates); `creates` with O_CREAT, `exclusive` with O_EXCL as well,
    /// `reads` unless write-only.
    case write(creates: Bool, exclusive: Bool, reads: Bool)
    /// Not an open call the guard can read (an io_uring worker): judged as a write.
    case unknown

    init(flags: Int64) {
        let access = Int32(truncatingIfNeeded: flags) & O_ACCMODE
        let creates = flags & Int64(O_CREAT) != 0
        if access == O_RDONLY, !creates, flags & Int64(O_TRUNC) == 0 {
            self = .read
        } else {
            self = .write(creates: creates, exclusive: creates && flags & Int64(O_EXCL) != 0, reads: access != O_WRONLY)
        }
    }

    /// The intent of the open thread `tid` is in (it waits for the guard's answer).
    static func of(thread tid: Int32) -> OpenIntent {
        var flags: Int64 = 0
        guard clinux_open_call_flags(tid, &flags) == 0 else { return .unknown }
        return OpenIntent(flags: flags)
    }

    var creates: Bool {
        if case .write(let creates, _, _) = self { return creates }
        return false
    }

    var exclusive: Bool {
        if case .write(_, let exclusive, _) = self { return exclusive }
        return false
    }

    /// Whether the open can read (an unknown one is taken to).
    var reads: Bool {
        if case .write(_, _, let reads) = self { return reads }
        return true
    }
}
