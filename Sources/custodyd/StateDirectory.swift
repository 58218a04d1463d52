import CustodySystem
import Glibc

struct StateDirectoryError: Error, CustomStringConvertible {
    var path: String
    var reason: String
    var description: String { "state directory \(path): \(reason)" }
}

/// Where the daemon keeps keys and state: created 0700 if missing, refused if others can read it.
enum StateDirectory {
    static func defaultPath() -> String {
        if geteuid() == 0 { return "/var/lib/custody" }
        if let xdg = getenv("XDG_STATE_HOME").map({ String(cString: $0) }), !xdg.isEmpty {
            return xdg + "/custody"
        }
        let home = getenv("HOME").map { String(cString: $0) } ?? "/tmp"
        return home + "/.local/state/custody"
    }

    static func prepare(_ path: String) throws(StateDirectoryError) {
        var prefix = path.isAbsolutePath ? "" : "."
        for component in path.pathComponents {
            prefix += "/" + component
            if mkdir(prefix, 0o700) != 0, errno != EEXIST {
                throw StateDirectoryError(path: path, reason: "cannot create \(prefix): \(Errno.current)")
            }
        }
        guard let attributes = try? Syscall.lstat(path), attributes.st_mode & S_IFMT == S_IFDIR else {
            throw StateDirectoryError(path: path, reason: "not a directory")
        }
        if attributes.st_mode & 0o077 != 0 {
            throw StateDirectoryError(path: path, reason: "group or others have access (mode \(String(attributes.st_mode & 0o777, radix: 8))); run chmod 700 on it")
        }
    }
}
