import CustodyFormat
import Synchronization

/// A mounted protected directory, as the engine sees it: where it is, and how to change the owner
/// of something in it. The FUSE front end implements it (the engine knows nothing of FUSE), so
/// that owner changes made through the control API keep the mount's inodes and caches coherent.
public protocol ProtectedVolume: AnyObject, WipeHandler, OwnedObjectLister {
    /// Where the protected view is mounted (absolute, no trailing slash).
    var mountPoint: String { get }
    /// The backing directory that holds the stored files (absolute).
    var backingDirectory: String { get }
    /// Whether users other than the daemon's may use the mount (`allow_other`); when not, only
    /// administrators may name its paths over the control API.
    var allowsOtherUsers: Bool { get }
    /// Gives `relativePath` ("" for the root) the owner `owner` (nil: no owner), and for a
    /// directory everything below it; calls `progress` with the number of objects done so far.
    /// (`wipeFiles`, from `WipeHandler`, deletes an identity's files in the mount;
    /// `listOwnedObjects` lists what a wipe would reach.)
    func changeOwner(_ relativePath: String, to owner: String?, progress: (Int) -> Void) throws(EngineError)
    /// Returns once the mount has acted on every lock so far (cached plaintext of locked files
    /// dropped from the kernel).
    func settleCaches()

    // What the engine tells every mount, as it happens (the events say the same to observers).
    /// A lock of `account` was requested: its class A files' dirty pages are written back while
    /// the keys still exist (the grace period).
    func lockRequested(_ account: Account)
    /// The lock of `account` completed: the kernel's cached plaintext of its class A files goes.
    func locked(_ account: Account)
    /// `account`'s policy changed, or it was enrolled (its files may predate the policy): the
    /// cached pages of its files go (mappings granted across identities fault again and ask), and
    /// its existing files are re-protected in the background.
    func policyChanged(_ account: Account)
    /// `account` has a new generation of keys (`Engine.rotateKeys`, or one imported): what it
    /// stored under its earlier ones (file keys, owner records, names, symlink targets) is brought
    /// to the new one in the background.
    func keysRotated(_ account: Account)
    /// `account` was unlocked while marked for re-protection (`reprotectPending`): what the pass
    /// could not do while its keys were locked away is tried again.
    func unlocked(_ account: Account)
    /// A wipe of `account` starts: the cached pages of its files go.
    func wipeStarting(_ account: Account)
    /// `account`'s name key went (a wipe, or deregistering): names the kernel holds decrypted go.
    func namesHidden(_ account: Account)
    /// `account`'s name key appeared (a first unlock, an enrolment, a recovery): listings the
    /// kernel holds with names shown as stored go, and what earlier formats stored for it is
    /// brought up to date.
    func namesRevealed(_ account: Account)
    /// Cuts the encrypted file at `relativePath` back to its last authentic block
    /// (`Engine.repairFile`), keeping the kernel's view of it coherent; refused while it is open.
    func repair(_ relativePath: String) throws(EngineError) -> RepairOutcome
    /// The backing path of the object at `relativePath` (names as the backing directory stores
    /// them: encrypted ones encrypted); a name that is not found is kept as given.
    func storedPath(of relativePath: String) -> String
}

extension ProtectedVolume {
    public func keysRotated(_ account: Account) {}
    public func unlocked(_ account: Account) {}
    public func namesHidden(_ account: Account) {}
    public func namesRevealed(_ account: Account) {}

    public func storedPath(of relativePath: String) -> String {
        relativePath.isEmpty ? backingDirectory : backingDirectory + "/" + relativePath
    }
}

/// A path located in a mount: the volume and the path below its mount point.
public struct VolumePath: Sendable {
    public let volume: ProtectedVolume
    /// Relative to the mount point; "" for the mount point itself.
    public let relativePath: String

    public var mountPath: String { relativePath.isEmpty ? volume.mountPoint : volume.mountPoint + "/" + relativePath }
    public var backingPath: String { volume.storedPath(of: relativePath) }
}

/// The mounted volumes; the mounts add and remove themselves.
final class VolumeRegistry: Sendable {
    private let volumes = Mutex<[ProtectedVolume]>([])

    func add(_ volume: ProtectedVolume) { volumes.withLock { $0.append(volume) } }
    func remove(_ volume: ProtectedVolume) { volumes.withLock { $0.removeAll { $0 === volume } } }
    var all: [ProtectedVolume] { volumes.withLock { $0 } }
}

extension Engine {
    public func attach(_ volume: ProtectedVolume) { volumeRegistry.add(volume) }
    public func detach(_ volume: ProtectedVolume) { volumeRegistry.remove(volume) }
    public var volumes: [ProtectedVolume] { volumeRegistry.all }

    /// The volume whose mount holds `path` (absolute and normalized: no `.`, `..` or `//`).
    public func volume(containing path: String) -> VolumePath? {
        for volume in volumes {
            let root = volume.mountPoint
            if path.bytesEqual(root) { return VolumePath(volume: volume, relativePath: "") }
            // Byte-wise: canonically equivalent spellings are different directories.
            let prefix = root.bytesEqual("/") ? "/" : root + "/"
            if path.hasBytePrefix(prefix) { return VolumePath(volume: volume, relativePath: path.droppingBytes(prefix.utf8.count)) }
        }
        return nil
    }
}
