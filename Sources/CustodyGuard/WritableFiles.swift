import CustodySystem
import Glibc

/// The regular files a process can write to now (its descriptors open for writing, its shared
/// writable mappings), or reads now. A process that comes to hold an identity's data must not have
/// a file to write where the identity may not save (the data would go there whatever it opens
/// next); one that comes to write into an identity's files must not be reading from where the
/// identity may not open from.
struct WritableFile: Equatable {
    let path: String
    let device: UInt64
}

enum WritableFiles {
    static func of(process pid: Int32) -> [WritableFile] {
        descriptors(of: pid) { $0 != O_RDONLY } + sharedWritableMappings(of: pid)
    }

    /// The data it reads now: regular files open for reading that root does not own (root's are
    /// the system's programs, libraries and settings, not documents). Mapped files are left out:
    /// what a process maps to read is a library or a program far more often than a document.
    static func readable(by pid: Int32) -> [WritableFile] {
        descriptors(of: pid, owned: { $0 != 0 }) { $0 != O_WRONLY }
    }

    /// Regular files among `pid`'s descriptors whose access mode `access` accepts. Where a
    /// descriptor is comes from its fdinfo (`mnt_id`) and the mount table: a file in one of
    /// Custody's mounts is never looked at (a `stat` would be a request to this very daemon, maybe
    /// to the thread asking), only reported by its device; nor are pseudo file systems'.
    static func descriptors(of pid: Int32, owned: (uid_t) -> Bool = { _ in true }, _ access: (Int32) -> Bool) -> [WritableFile] {
        var result: [WritableFile] = []
        let mounts = Dictionary(MountTable.entries().map { ($0.id, $0) }, uniquingKeysWith: { _, last in last })
        let directory = "/proc/\(pid)/fd"
        for number in Syscall.numberedEntries(directory) ?? [] {
            guard let info = fdinfo(pid, number), access(info.flags & O_ACCMODE),
                  let mount = mounts[info.mountID], !FileSystemSelection.pseudo.contains(mount.fileSystemType) || mount.fileSystemType == "fuse.custody",
                  let path = try? Syscall.readlink("\(directory)/\(number)") else { continue }
            if mount.fileSystemType == "fuse.custody" {
                if let device = FileSystemSelection.device(mount.device) { result.append(WritableFile(path: path, device: device)) }
                continue
            }
            var status = stat()
            guard stat("\(directory)/\(number)", &status) == 0, status.st_mode & S_IFMT == S_IFREG, owned(status.st_uid) else { continue }
            result.append(WritableFile(path: path, device: UInt64(status.st_dev)))
        }
        return result
    }

    /// The `flags:` (octal) and `mnt_id:` lines of /proc/PID/fdinfo/N.
    static func fdinfo(_ pid: Int32, _ fd: Int32) -> (flags: Int32, mountID: Int)? {
        // The same "name: value" lines as /proc/PID/status.
        guard let text = readTextFile("/proc/\(pid)/fdinfo/\(fd)"),
              let flags = ProcStatus.values("flags:", in: text)?.first.flatMap({ Int32($0, radix: 8) }),
              let mountID = ProcStatus.values("mnt_id:", in: text)?.first.flatMap({ Int($0) }) else { return nil }
        return (flags, mountID)
    }

    /// Mappings with `w` and `s` in their permissions that map a file.
    static func sharedWritableMappings(of pid: Int32) -> [WritableFile] {
        guard let maps = readTextFile("/proc/\(pid)/maps") else { return [] }
        return parseSharedWritable(maps)
    }

    /// "start-end perms offset major:minor inode path" (major and minor in hex).
    static func parseSharedWritable(_ maps: String) -> [WritableFile] {
        var result: [WritableFile] = []
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6, fields[1].count == 4 else { continue }
            let permissions = Array(fields[1].utf8)
            guard permissions[1] == UInt8(ascii: "w"), permissions[3] == UInt8(ascii: "s"), fields[4] != "0" else { continue }
            let device = fields[3].split(separator: ":")
            guard device.count == 2, let major = UInt64(device[0], radix: 16), let minor = UInt64(device[1], radix: 16) else { continue }
            let path = String(fields[5].drop { $0 == " " })
            guard path.hasPrefix("/") else { continue }
            result.append(WritableFile(path: path, device: FileSystemSelection.makeDevice(major: major, minor: minor)))
        }
        return result
    }
}
