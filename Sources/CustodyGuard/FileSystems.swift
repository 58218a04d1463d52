import CustodyCore
import CustodySystem
import Glibc

/// A file system the guard watches: a mount point that leads to it (to mark it), and the
/// location of what it stores (`Other` for network file systems, else `LocalDrive`).
struct WatchedFileSystem: Equatable, Sendable {
    let device: UInt64
    let mountPoint: String
    let type: String
    let location: String
}

enum FileSystemSelection {
    /// File system types that hold no data at rest (or only device nodes).
    static let pseudo: Set<String> = ["proc", "sysfs", "cgroup", "cgroup2", "devpts", "devtmpfs", "debugfs", "tracefs",
                                      "securityfs", "bpf", "pstore", "efivarfs", "configfs", "fusectl", "mqueue",
                                      "binfmt_misc", "autofs", "rpc_pipefs", "nsfs", "selinuxfs", "nfsd", "fuse.custody"]

    /// The file systems `selection` names, by device. `reach` gives the device a path leads to
    /// now (a mount point may be covered by a later mount).
    static func select(_ selection: GuardedFileSystems, entries: [MountEntry] = MountTable.entries(),
                       reach: (String) -> UInt64? = deviceOf) -> [UInt64: WatchedFileSystem] {
        var result: [UInt64: WatchedFileSystem] = [:]
        switch selection {
        case .none:
            return [:]
        case .all:
            for entry in entries where !pseudo.contains(entry.fileSystemType) {
                guard let device = Self.device(entry.device), result[device] == nil,
                      let reached = reach(entry.mountPoint), reached == device else { continue }
                result[device] = WatchedFileSystem(device: device, mountPoint: entry.mountPoint, type: entry.fileSystemType,
                                                   location: location(of: entry.fileSystemType))
            }
        case .holding(let paths):
            for path in paths {
                if let device = reach(path), result[device] == nil {
                    let entry = entries.last { Self.device($0.device) == device }
                    if !pseudo.contains(entry?.fileSystemType ?? "") {
                        result[device] = WatchedFileSystem(device: device, mountPoint: path, type: entry?.fileSystemType ?? "",
                                                           location: location(of: entry?.fileSystemType ?? ""))
                    }
                }
                for entry in entries where entry.mountPoint.isPath(inside: path) && !pseudo.contains(entry.fileSystemType) {
                    guard let device = Self.device(entry.device), result[device] == nil,
                          let reached = reach(entry.mountPoint), reached == device else { continue }
                    result[device] = WatchedFileSystem(device: device, mountPoint: entry.mountPoint, type: entry.fileSystemType,
                                                       location: location(of: entry.fileSystemType))
                }
            }
        }
        return result
    }

    static func location(of type: String) -> String {
        Engine.remoteFileSystems.contains(type) ? Location.other.name : Location.localDrive.name
    }

    /// The device number of "major:minor", as `stat` gives it.
    static func device(_ text: String) -> UInt64? {
        let parts = text.split(separator: ":")
        guard parts.count == 2, let major = UInt64(parts[0]), let minor = UInt64(parts[1]) else { return nil }
        return makeDevice(major: major, minor: minor)
    }

    static func makeDevice(major: UInt64, minor: UInt64) -> UInt64 {
        ((major & 0xffff_f000) << 32) | ((major & 0xfff) << 8) | ((minor & 0xffff_ff00) << 12) | (minor & 0xff)
    }

    static func deviceOf(_ path: String) -> UInt64? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return UInt64(info.st_dev)
    }
}
