import CustodySystem

/// One object an identity owns in a mount, as `Engine.ownedObjects` reports it: what
/// `custodyctl files --owner` lists and what `custodyctl wipe --dry-run` shows a wipe would delete.
public struct OwnedObject: Equatable, Sendable {
    public enum Kind: String, Sendable {
        case file, directory, symlink, other
    }

    /// The path as the mount shows it: names decrypted where the identity's name key is held,
    /// as stored where it is not.
    public var path: String
    public var kind: Kind
    /// The plaintext size of a file (an encrypted file's without its header and tags); 0 else.
    public var size: UInt64
    /// What it takes on the disk (allocated blocks); the bytes a wipe frees.
    public var bytesOnDisk: UInt64
    public var encrypted: Bool
    /// A wipe deletes it: every file and every other object named with the identity's key; a
    /// directory only when nothing of other owners is left in it.
    public var wipeDeletes: Bool
    /// Another name of a file listed already (a hard link): its bytes are counted once.
    public var otherLink: Bool

    public init(path: String, kind: Kind, size: UInt64, bytesOnDisk: UInt64, encrypted: Bool, wipeDeletes: Bool, otherLink: Bool = false) {
        self.path = path
        self.kind = kind
        self.size = size
        self.bytesOnDisk = bytesOnDisk
        self.encrypted = encrypted
        self.wipeDeletes = wipeDeletes
        self.otherLink = otherLink
    }
}

/// The totals of a listing of owned objects.
public struct OwnedTotals: Equatable, Sendable {
    public var files = 0
    public var directories = 0
    public var symlinks = 0
    public var other = 0
    /// Plaintext bytes of the files (each file once, however many names it has).
    public var size: UInt64 = 0
    /// What the files take on the disk, each once: what a wipe of them frees.
    public var bytesOnDisk: UInt64 = 0
    public var encryptedFiles = 0

    public init() {}

    public var objects: Int { files + directories + symlinks + other }

    public mutating func add(_ object: OwnedObject) {
        switch object.kind {
        case .file: files += 1
        case .directory: directories += 1
        case .symlink: symlinks += 1
        case .other: other += 1
        }
        guard object.kind == .file else { return }
        if object.encrypted { encryptedFiles += 1 }
        guard !object.otherLink else { return }
        size += object.size
        bytesOnDisk += object.bytesOnDisk
    }
}

/// Lists what an identity owns in a mount (the mounts implement it; the engine knows nothing of
/// FUSE). `visit` gets each object, the contents of a directory before the directory itself, and
/// answers false to stop (a client that went away).
public protocol OwnedObjectLister: Sendable {
    func listOwnedObjects(of account: Account, visit: (OwnedObject) -> Bool) throws(Errno)
}

extension Engine {
    /// Walks every mount for the objects `identity` (a registered account, managed or not) owns:
    /// exactly those a wipe of it would reach, each marked with whether the wipe deletes it.
    /// Reads only; needs none of the identity's keys (its names are shown decrypted when its name
    /// key is held). Returns false when `visit` stopped the walk.
    @discardableResult
    public func ownedObjects(of identity: String, visit: (OwnedObject) -> Bool) throws(EngineError) -> Bool {
        var account = try self.account(identity)
        if account.nameTag == nil { account.nameTag = nameKey(for: account.id)?.tag }
        var going = true
        for volume in volumes {
            do throws(Errno) {
                try volume.listOwnedObjects(of: account) { object in
                    going = visit(object)
                    return going
                }
            } catch {
                throw .io(file: volume.mountPoint, error)
            }
            if !going { return false }
        }
        return true
    }
}
