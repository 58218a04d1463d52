import Glibc

/// Paths that only root can make lead to another file: every directory on the way (the
/// directories of any symlink's target included) is owned by root and writable by nobody else,
/// or is sticky (like /tmp: then only the owner of an entry, root here, can replace it); every
/// symlink and the file at the end are owned by root, and the file is writable by nobody else.
public enum RootControlledPath {
    /// The most symlinks followed, as the kernel allows.
    static let mostLinks = 40

    /// Resolves an absolute path in the daemon's view, component by component: the file it leads
    /// to (its real path and identity), or why another user could make it lead elsewhere.
    public static func resolve(_ path: String) -> Result<Resolved, ResolutionFailure> {
        guard path.isAbsolutePath else { return .failure(.notAbsolute) }
        var root = stat()
        guard lstat("/", &root) == 0 else { return .failure(.missing("/")) }
        if let problem = directoryProblem(root) { return .failure(.changeable("/", problem)) }
        // Split at slash bytes: as Characters, a slash followed by a combining mark is no slash,
        // and the directory before it would go unchecked.
        var remaining = path.pathComponents
        var resolved: [String] = []
        var links = 0
        while !remaining.isEmpty {
            let component = remaining.removeFirst()
            if component.bytesEqual(".") { continue }
            if component.bytesEqual("..") {
                _ = resolved.popLast()
                continue
            }
            let current = "/" + (resolved + [component]).joined(separator: "/")
            var attributes = stat()
            guard lstat(current, &attributes) == 0 else { return .failure(.missing(current)) }
            switch attributes.st_mode & S_IFMT {
            case S_IFLNK:
                guard attributes.st_uid == 0 else { return .failure(.changeable(current, "a symlink owned by uid \(attributes.st_uid)")) }
                links += 1
                guard links <= mostLinks, let text = try? Syscall.readlink(current) else { return .failure(.missing(current)) }
                if text.isAbsolutePath { resolved = [] }
                remaining = text.pathComponents + remaining
            case S_IFDIR:
                if let problem = directoryProblem(attributes) { return .failure(.changeable(current, problem)) }
                resolved.append(component)
            default:
                guard remaining.isEmpty else { return .failure(.missing(current + "/" + remaining.joined(separator: "/"))) }
                guard attributes.st_mode & S_IFMT == S_IFREG else { return .failure(.notRegularFile(current)) }
                if attributes.st_uid != 0 { return .failure(.changeable(current, "owned by uid \(attributes.st_uid)")) }
                if attributes.st_mode & 0o022 != 0 { return .failure(.changeable(current, "writable by its group or others")) }
                return .success(Resolved(path: current, file: FileIdentity(attributes)))
            }
        }
        return .failure(.notRegularFile(path))
    }

    /// Why a directory lets someone other than root replace its entries, or nil.
    static func directoryProblem(_ attributes: stat) -> String? {
        if attributes.st_uid != 0 { return "a directory owned by uid \(attributes.st_uid)" }
        if attributes.st_mode & 0o022 != 0, attributes.st_mode & S_ISVTX == 0 { return "a directory writable by its group or others" }
        return nil
    }

    /// Where a path leads: the file's real path and its identity.
    public struct Resolved: Equatable, Sendable {
        public var path: String
        public var file: FileIdentity
        public init(path: String, file: FileIdentity) {
            self.path = path
            self.file = file
        }
    }

    /// Why a path is not one only root controls.
    public enum ResolutionFailure: Error, Equatable, CustomStringConvertible {
        case notAbsolute
        case missing(String)
        case notRegularFile(String)
        case changeable(String, String)

        public var description: String {
            switch self {
            case .notAbsolute: return "not an absolute path"
            case .missing(let path): return "\(path) does not exist"
            case .notRegularFile(let path): return "\(path) is not a regular file"
            case .changeable(let path, let why): return "\(path) is \(why), so someone other than root could replace the program"
            }
        }
    }
}
