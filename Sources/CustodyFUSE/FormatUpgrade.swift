import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import Dispatch
import Glibc

/// Brings what a managed identity stored in earlier formats to format version 3, in the
/// background, so that the disk stops naming it (`docs/format.md`, "Names" and "Owners a copy
/// does not name"): an owner record that names the identity is written by key ID, an encrypted
/// version 2 header that names it is rewrapped without the owner (in place: one sector, it cannot
/// tear; the content is not touched), and a name stored plain is renamed into the identity's
/// encrypted form (a symlink's target sealed with it).
///
/// It runs for an identity when its name key appears (its first unlock since the daemon started,
/// an enrolment, a recovery), and leaves for a later run what it cannot do now: a file open at
/// the moment, a header whose class key is locked away. A pass that left nothing notes the
/// identity's key tag on the backing directory (`StoreAttributes.upgraded`), and no pass runs for it
/// there again: nothing written since is in an earlier format. A version 1 file (every zero block
/// a hole, which a newer header would not mean) is written anew in the current format, as
/// re-protection writes a file (`MountFileSystem.reprotect`); one with several hard links keeps
/// its version, and so its owner.
final class FormatUpgrade: @unchecked Sendable {
    private let filesystem: MountFileSystem
    private weak var engine: Engine?
    /// Shared with the mount's `PolicyReprotection`: one rewrites names and records while the
    /// other walks the same files by name, so they take turns.
    private let queue: DispatchQueue

    init(filesystem: MountFileSystem, engine: Engine, queue: DispatchQueue) {
        self.filesystem = filesystem
        self.engine = engine
        self.queue = queue
    }

    /// Queues a pass over the tree for `account`.
    func start(for account: Account) {
        queue.async { self.run(account.id) }
    }

    /// Waits for the passes queued so far (for tests).
    func settle() { queue.sync {} }

    struct Counts: Equatable {
        var records = 0
        var headers = 0
        var names = 0
        var left = 0
    }

    /// On the backing directory: `v3:` and the key tags of the identities whose pass completed.
    static let completedVersion = "v3:"

    @discardableResult
    private func run(_ identity: String) -> Counts {
        var counts = Counts()
        guard let engine, let account = try? engine.account(identity), account.isEnrolled, let tag = engine.nameKey(for: account.id)?.tag,
              let root = try? filesystem.inodes.inode(InodeTable.rootID) else { return counts }
        var completed = completedTags(root)
        guard !completed.contains(tag) else { return counts }
        walk(root, account: account, counts: &counts)
        if counts != Counts() {
            filesystem.log("format upgrade for \(account.upn): \(counts.records) owner records, \(counts.headers) headers, " +
                           "\(counts.names) names brought to version 3; \(counts.left) left for later")
        }
        if counts.left == 0 {
            completed.insert(tag)
            noteCompleted(completed, on: root)
        }
        return counts
    }

    private func completedTags(_ root: Inode) -> Set<String> {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let path = filesystem.attributePath(of: root)
        let count = buffer.withUnsafeMutableBytes { bytes in
            (try? Syscall.getxattr(path, filesystem.storeAttributes.upgraded, bytes.baseAddress, bytes.count)) ?? 0
        }
        let text = String(decoding: buffer.prefix(max(0, count)), as: UTF8.self)
        guard text.hasPrefix(Self.completedVersion) else { return [] }
        return Set(text.dropFirst(Self.completedVersion.count).split(separator: ",").map(String.init))
    }

    private func noteCompleted(_ tags: Set<String>, on root: Inode) {
        let value = Array((Self.completedVersion + tags.sorted().joined(separator: ",")).utf8)
        let path = filesystem.attributePath(of: root)
        do throws(Errno) {
            try value.withBytes { (bytes) throws(Errno) in try Syscall.setxattr(path, filesystem.storeAttributes.upgraded, bytes.baseAddress, bytes.count, 0) }
        } catch {
            filesystem.log("cannot note the format upgrade as complete on the backing directory (\(error)): it runs again at the next start")
        }
    }

    /// Upgrades every entry of `directory` that `account` owns, then goes down.
    private func walk(_ directory: Inode, account: Account, counts: inout Counts) {
        guard let names = try? Syscall.directoryNames(in: directory.fd) else { return }
        for name in names where !name.hasPrefix(MountFileSystem.stagingPrefix) {
            guard let attributes = try? Syscall.fstatat(directory.fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
            let kind = attributes.st_mode & S_IFMT
            var stored = name
            if kind == S_IFREG || kind == S_IFDIR, let record = try? OwnerRecord.load(in: directory.fd, name: name.cString, names: filesystem.storeAttributes),
               filesystem.record(record, isOf: account) {
                // A record by key ID was written by this version (or upgraded, last): only one
                // that names the owner has a header or a record to upgrade. The header goes
                // first, so that a record stays naming the owner until its header is done.
                if record.owner != nil, let (id, child) = node(named: name, in: directory, attributes: attributes),
                   kind != S_IFREG || upgradeHeader(child, id: id, account: account, counts: &counts) {
                    upgradeRecord(child, counts: &counts)
                }
                stored = renamed(name, in: directory, owner: account.upn, counts: &counts)
            }
            if kind == S_IFDIR, let (_, child) = node(named: stored, in: directory, attributes: attributes) {
                walk(child, account: account, counts: &counts)
            }
        }
    }

    /// The node of an entry: the kernel's (with its ID), when it knows the object, else one for
    /// this pass.
    private func node(named name: FileName, in directory: Inode, attributes: stat) -> (id: UInt64?, inode: Inode)? {
        if let known = filesystem.inodes.known(attributes) { return known }
        guard let fd = try? Syscall.openat(directory.fd, name.cString, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC) else { return nil }
        return (nil, Inode(fd: fd, attributes: attributes))
    }

    private func upgradeRecord(_ inode: Inode, counts: inout Counts) {
        let protection = filesystem.protection(of: inode)
        guard let record = filesystem.ownerRecord(for: protection), record.owner == nil else { return }
        do throws(FormatError) {
            try record.store(at: inode.procPath, names: filesystem.storeAttributes)
            counts.records += 1
        } catch {
            counts.left += 1
        }
    }

    /// Rewraps a version 2 header without its owner, unless the file is open (its content holds
    /// the header) or its class key is not at hand. True when the header is done (or needed
    /// nothing).
    @discardableResult
    private func upgradeHeader(_ inode: Inode, id: UInt64?, account: Account, counts: inout Counts) -> Bool {
        let protection = filesystem.protection(of: inode)
        guard let engine, case .encrypted(_, let protectionClass) = protection else { return true }
        var versionOne = false
        let outcome = inode.protectionState.withLock { state -> Bool? in
            guard state.openHandles == 0, state.content == nil else { return false }
            guard let fd = try? Syscall.open(inode.procPath, O_RDWR | O_CLOEXEC) else { return false }
            defer { Syscall.close(fd) }
            let storage = DescriptorStorage(fd: fd, attributes: filesystem.storeAttributes)
            guard let header = try? ProtectedFile.readHeader(from: storage) else { return false }
            guard header.owner != nil else { return nil }
            if header.version == 1 {
                versionOne = true
                return nil
            }
            guard header.version == FileHeader.hiddenOwnerVersion - 1 else { return nil }
            guard let lease = try? engine.openFileKey(header) else { return false }
            defer { engine.closeFileKey(lease) }
            do {
                let classKey = try engine.classKey(for: account.id, protectionClass, purpose: .create)
                let hidden = try header.rewrapped(fileKey: lease.fileKey, to: header.protectionClass, classKey: classKey, hidingOwner: true)
                try storage.writeBytes(hidden.encoded(), at: 0)
                try storage.sync()
                return true
            } catch {
                return false
            }
        }
        if versionOne { return rewrite(inode, id: id, protection, account: account, counts: &counts) }
        switch outcome {
        case true?: counts.headers += 1
        case false?: counts.left += 1
        case nil: break
        }
        return outcome != false
    }

    /// Writes a version 1 file anew in the current format (its content read and written through
    /// the keys, its holes as zeros). True when done, or when it cannot be (several hard links:
    /// it keeps its version); false when left for later (open, or its class key locked away).
    private func rewrite(_ inode: Inode, id: UInt64?, _ protection: Protection, account: Account, counts: inout Counts) -> Bool {
        guard let engine, case .encrypted(_, let protectionClass) = protection else { return true }
        do throws(Errno) {
            let classKey: ClassKey
            do { classKey = try engine.classKey(for: account.id, protectionClass, purpose: .create) } catch { throw Errno.accessDenied }
            try filesystem.reprotect(id: id, inode, to: protection, classKey: classKey, rewriting: true)
            counts.headers += 1
            return true
        } catch where error == .tooManyLinks {
            return true
        } catch {
            counts.left += 1
            return false
        }
    }

    private func renamed(_ name: FileName, in directory: Inode, owner: String, counts: inout Counts) -> FileName {
        guard !name.hasPrefix(NameCipher.prefix) else { return name }
        let now = filesystem.renameForOwner(name, in: directory, owner: owner)
        if now != name { counts.names += 1 }
        return now
    }
}

