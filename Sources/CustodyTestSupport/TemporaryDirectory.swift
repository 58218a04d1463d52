import CustodySystem
import Glibc

/// A directory of its own for a test, under /tmp, removed with everything in it by `removeTree`.
/// Every test target makes its scratch space this way (one spelling, one cleanup).
public struct TemporaryDirectory: Sendable {
    public let path: String

    /// Makes `/tmp/<prefix>.XXXXXX`.
    public init(_ prefix: String = "custody-test") throws(Errno) {
        var template = Array("/tmp/\(prefix).XXXXXX".utf8CString)
        guard let created = mkdtemp(&template) else { throw Errno.current }
        path = String(cString: created)
    }

    /// Removes `path` and everything below it, not following symbolic links nor crossing into
    /// another mount (a mount left behind by a failed test stays, and so does its mount point).
    public static func removeTree(_ path: String) {
        _ = system("rm -rf --one-file-system '\(path.replacingAll(of: "'", with: "'\\''"))'")
    }
}
