import CLinux
import Glibc

/// A file, by what names it on the machine: its device and inode.
public struct FileIdentity: Hashable, Sendable, CustomStringConvertible {
    public var device: UInt64
    public var inode: UInt64
    public init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }
    public init(_ attributes: stat) {
        self.init(device: UInt64(attributes.st_dev), inode: UInt64(attributes.st_ino))
    }
    public var description: String { "device \(device), inode \(inode)" }
}

/// A file mapped executable into a process (its program, the dynamic loader, each library): who
/// owns it and who may change it.
public struct MappedFile: Hashable, Sendable {
    public var file: FileIdentity
    public var owner: uid_t
    public var mode: mode_t
    public init(file: FileIdentity, owner: uid_t, mode: mode_t) {
        self.file = file
        self.owner = owner
        self.mode = mode
    }
    /// Only root can change it: owned by root, not writable by its group or others.
    public var onlyRootCanChange: Bool { owner == 0 && mode & 0o022 == 0 }
}

/// What the kernel says about the program a process runs, read by the daemon from its own view
/// of /proc: nothing here is what the process says about itself (its name, arguments,
/// environment, working directory or the paths it uses).
public struct RunningProgram: Sendable, Equatable {
    /// The executable's path as `/proc/PID/exe` reads to the daemon. For a process in another
    /// mount namespace this is a path of that namespace, which may name another file here.
    public var path: String
    /// The executable itself: `/proc/PID/exe` opened by the daemon, which leads to the file the
    /// process runs whatever namespace it is in.
    public var file: FileIdentity
    /// Whether the process shares the daemon's mount and user namespaces.
    public var sharesNamespaces: Bool
    /// The process tracing it (`TracerPid:`), 0 when none.
    public var tracer: Int32
    /// The files mapped executable into it; nil when they could not be read.
    public var executableMappings: [MappedFile]?

    public init(path: String, file: FileIdentity, sharesNamespaces: Bool, tracer: Int32, executableMappings: [MappedFile]?) {
        self.path = path
        self.file = file
        self.sharesNamespaces = sharesNamespaces
        self.tracer = tracer
        self.executableMappings = executableMappings
    }

    /// Inspects process `pid`; nil when it is gone or cannot be inspected (the daemon needs root
    /// for another user's processes).
    public static func inspect(_ pid: Int32) -> RunningProgram? {
        guard pid > 0, let target = try? Syscall.readlink("/proc/\(pid)/exe") else { return nil }
        let fd = Glibc.open("/proc/\(pid)/exe", Linux.O_PATH | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        guard let attributes = try? Syscall.stat(of: fd),
              let tracer = ProcStatus.values("TracerPid:", of: pid)?.first.flatMap({ Int32($0) }) else { return nil }
        return RunningProgram(path: target, file: FileIdentity(attributes),
                              sharesNamespaces: sharesNamespace("mnt", pid) && sharesNamespace("user", pid),
                              tracer: tracer, executableMappings: executableMappings(of: pid))
    }

    /// Whether process `pid` is in the daemon's namespace of that kind (`mnt`, `user`).
    static func sharesNamespace(_ kind: String, _ pid: Int32) -> Bool {
        var theirs = stat(), ours = stat()
        guard stat("/proc/\(pid)/ns/\(kind)", &theirs) == 0, stat("/proc/self/ns/\(kind)", &ours) == 0 else { return false }
        return theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino
    }

    /// The files behind the process's executable mappings, each opened through
    /// `/proc/PID/map_files` (the mapping itself, not a path), once per file.
    static func executableMappings(of pid: Int32) -> [MappedFile]? {
        guard let maps = readTextFile("/proc/\(pid)/maps") else { return nil }
        var seen = Set<FileIdentity>(), files: [MappedFile] = []
        for range in executableFileRanges(inMaps: maps) {
            let fd = Glibc.open("/proc/\(pid)/map_files/\(range)", Linux.O_PATH | O_CLOEXEC)
            guard fd >= 0 else { return nil }   // the mapping went, or it cannot be read: unknown
            defer { Glibc.close(fd) }
            guard let attributes = try? Syscall.stat(of: fd) else { return nil }
            let file = FileIdentity(attributes)
            if seen.insert(file).inserted {
                files.append(MappedFile(file: file, owner: attributes.st_uid, mode: attributes.st_mode))
            }
        }
        return files
    }

    /// The address ranges (`start-end`, as map_files names them) of a maps text's executable
    /// mappings of files (an inode other than 0).
    static func executableFileRanges(inMaps maps: String) -> [Substring] {
        var ranges: [Substring] = []
        for line in maps.split(separator: "\n") {
            // address perms offset device inode [path]
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count >= 5, fields[1].count == 4, fields[1].dropFirst(2).first == "x", fields[4] != "0" else { continue }
            ranges.append(fields[0])
        }
        return ranges
    }
}
