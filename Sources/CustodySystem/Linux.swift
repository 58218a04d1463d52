import CLinux
import Glibc

/// Linux constants that Swift's Glibc module hides behind _GNU_SOURCE.
public enum Linux {
    public static let O_PATH = clinux_O_PATH
    public static let O_DIRECT = clinux_O_DIRECT
    public static let O_NOATIME = clinux_O_NOATIME
    public static let O_TMPFILE = clinux_O_TMPFILE
    public static let AT_EMPTY_PATH = clinux_AT_EMPTY_PATH
    public static let SEEK_DATA = clinux_SEEK_DATA
    public static let SEEK_HOLE = clinux_SEEK_HOLE
    public static let RENAME_NOREPLACE = clinux_RENAME_NOREPLACE
    public static let RENAME_EXCHANGE = clinux_RENAME_EXCHANGE
    public static let RENAME_WHITEOUT = clinux_RENAME_WHITEOUT
    public static let UTIME_NOW = clinux_UTIME_NOW
    public static let UTIME_OMIT = clinux_UTIME_OMIT
    public static let XATTR_CREATE = clinux_XATTR_CREATE
    public static let XATTR_REPLACE = clinux_XATTR_REPLACE
    public static let FALLOC_FL_KEEP_SIZE = clinux_FALLOC_FL_KEEP_SIZE
    public static let FALLOC_FL_PUNCH_HOLE = clinux_FALLOC_FL_PUNCH_HOLE

    /// The calling thread's ID (what FUSE reports as the caller's "pid").
    public static func currentThreadID() -> pid_t { clinux_gettid() }
}
