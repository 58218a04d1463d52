import CustodySystem

/// Why a mount could not start. Each case reads as a sentence for the command line.
public enum MountError: Error, Equatable, CustomStringConvertible {
    case backingMissing(String)
    case backingNotDirectory(String)
    case backingUnreadable(String, Errno)
    case mountPointMissing(String)
    case mountPointNotDirectory(String)
    case mountPointNotEmpty(String)
    case mountPointInsideBacking(mountPoint: String, backing: String)
    case alreadyMounted(String, type: String)
    case staleMount(String)
    case fuseUnavailable(Errno)
    case sessionFailed(String)
    case mountFailed(String)
    /// The store's extended attributes cannot hold Custody's records as asked (`StoreAttributes`).
    case storeAttributes(String, String)

    public var description: String {
        switch self {
        case .backingMissing(let path):
            return "backing directory \(path) does not exist"
        case .backingNotDirectory(let path):
            return "backing path \(path) is not a directory"
        case .backingUnreadable(let path, let error):
            return "cannot open backing directory \(path): \(error)"
        case .mountPointMissing(let path):
            return "mount point \(path) does not exist"
        case .mountPointNotDirectory(let path):
            return "mount point \(path) is not a directory"
        case .mountPointNotEmpty(let path):
            return "mount point \(path) is not empty (use --allow-nonempty to mount over it)"
        case .mountPointInsideBacking(let mountPoint, let backing):
            return "mount point \(mountPoint) lies inside the backing directory \(backing)"
        case .alreadyMounted(let path, let type):
            return "\(path) is already a mount point (\(type)); unmount it first"
        case .staleMount(let path):
            return "\(path) is a dead FUSE mount; run 'fusermount3 -u \(path)' first"
        case .fuseUnavailable(let error):
            return "/dev/fuse is not usable: \(error) (is the fuse module loaded, and fuse3 installed?)"
        case .sessionFailed(let detail):
            return "could not create the FUSE session: \(detail)"
        case .mountFailed(let path):
            return "mounting at \(path) failed (see the message above)"
        case .storeAttributes(let path, let reason):
            return "backing directory \(path): \(reason)"
        }
    }
}
