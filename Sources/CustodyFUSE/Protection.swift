import CFuse3
import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import Glibc
import Logging
import Synchronization

/// The mount's log (swift-log; the daemon decides where it goes and scrubs identities).
let mountLogger = Logger(label: "custody.mount")

/// How a backing object is protected, as its owner record says.
enum Protection: Equatable {
    /// No owner: plain passthrough.
    case untracked
    /// An unmanaged owner (or a managed one whose policy does not encrypt): owner recorded, bytes plain.
    case plain(Owner)
    /// A managed owner's encrypted file of this class.
    case encrypted(Owner, ProtectionClass)

    var owner: Owner? {
        switch self {
        case .untracked: return nil
        case .plain(let owner), .encrypted(let owner, _): return owner
        }
    }

    var isEncrypted: Bool {
        if case .encrypted = self { return true }
        return false
    }

    init(record: OwnerRecord?, owner: Owner) {
        guard let record else { self = .untracked; return }
        if let protectionClass = record.encryptedClass {
            self = .encrypted(owner, protectionClass)
        } else {
            self = .plain(owner)
        }
    }
}

/// The decrypted view of one encrypted backing file, shared by all its open handles (the format
/// wants one `ProtectedFile` per stored file). Its descriptor is read-write: the kernel reads pages
/// to complete partial writes, and partial blocks are read-modify-written. On a store that is
/// read-only (mounted so, or remounted so after an error) it is read-only, and writes through it
/// fail with EROFS.
final class ProtectedContent: @unchecked Sendable {
    let fd: Int32
    let file: ProtectedFile
    let lease: FileKeyLease
    /// The store refused to open the file for writing (EROFS).
    let readOnly: Bool
    /// Open handles; guarded by the inode's protection lock.
    var opens = 1
    /// What the first authentication failure of this content was taken for (one event per open content).
    let damageReported = Mutex<DamageCause?>(nil)

    init(fd: Int32, file: ProtectedFile, lease: FileKeyLease, readOnly: Bool = false) {
        self.fd = fd
        self.file = file
        self.lease = lease
        self.readOnly = readOnly
    }

    deinit { Syscall.close(fd) }

    /// Refuses a change where the store is read-only.
    func requireWritable() throws(Errno) {
        if readOnly { throw Errno.readOnlyFileSystem }
    }
}

/// Per-inode protection state: probed once, then kept.
struct InodeProtection {
    var protection: Protection?
    var content: ProtectedContent?
    /// Open handles of any kind (re-protection waits for none).
    var openHandles = 0
    /// The latest plain handle opened, while it lives: its descriptor serves attribute reads.
    weak var plainHandle: OpenFile?
    /// Unlinked while handles were open: see at the last close whether its storage can go.
    var releaseWhenClosed = false
    /// Its descriptor points at the placeholder: the file is gone (`StorageEdges`).
    var storageReleased = false
    /// A write failed since the last flush: the kernel's cache is dropped again then.
    var writeFailed = false
    /// A plain write failed with this error: writes that would leave a gap fail with it too,
    /// until the file is truncated or its last handle closes (`PlainFailedWrites.swift`).
    var refusingGaps: Int32?
}

extension MountFileSystem {
    // MARK: Probing

    /// On a shared store another daemon may have changed a file's owner record since it was read
    /// (a file opened with truncation there takes its caller's identity in place): a lookup or
    /// an open that finds none of its handles open reads it again.
    func readProtectionAgainOnSharedStore(_ inode: Inode) {
        guard options.sharedStore, inode.isRegularFile else { return }
        inode.protectionState.withLock { state in
            if state.openHandles == 0, state.content == nil { state.protection = nil }
        }
    }

    /// The protection of `inode`, read from its owner record the first time.
    ///
    /// `entry`: the directory and name the inode was just looked up by, which reach its record
    /// faster than its /proc path.
    func protection(of inode: Inode, lookedUpAs entry: BackingEntry? = nil) -> Protection {
        if let known = inode.protectionState.withLock({ $0.protection }) { return known }
        var found = Protection.untracked
        if inode.isRegularFile || inode.isDirectory {
            let record = try? OwnerRecord.load { (bytes) throws(Errno) in
                try backingGetxattr(inode, lookedUpAs: entry, storeAttributes.owner, bytes.baseAddress, bytes.count)
            }
            let (read, settled) = protection(from: record)
            found = read
            // An owner no account names now is asked again next time: an enrolment may name it.
            if !settled { return found }
        }
        inode.protectionState.withLock { if $0.protection == nil { $0.protection = found } }
        return found
    }

    /// Attributes as the mount shows them: encrypted files show their plaintext size. Every
    /// attribute answer passes here, which notes the owner for allocations.
    func presented(_ attributes: stat, of inode: Inode) -> stat {
        inode.ownerUID.store(attributes.st_uid, ordering: .relaxed)
        guard inode.isRegularFile, protection(of: inode).isEncrypted else { return attributes }
        var shown = attributes
        shown.st_size = off_t((try? BlockLayout().plaintextSize(storedSize: UInt64(attributes.st_size))) ?? 0)
        return shown
    }

    /// How long the kernel may keep the attributes it is given: not at all while the inode's keys
    /// are revoked (its identity locked), so that every write through an open handle first asks
    /// `getattr`, which refuses it.
    func attributeTimeout(of inode: Inode) -> Double {
        let revoked = inode.protectionState.withLock { $0.content?.lease.isRevoked ?? false }
        return revoked ? 0 : options.attributeTimeout
    }

    // MARK: Owners

    /// What an owner record says: a record by key ID names the identity whose keybag holds that
    /// key (an owner no account here matches is shown as unknown, and opens nothing; `settled` is
    /// false then: an enrolment may name it later).
    func protection(from record: OwnerRecord?) -> (protection: Protection, settled: Bool) {
        guard let record else { return (.untracked, true) }
        switch record.holder {
        case .named(let owner):
            return (Protection(record: record, owner: owner), true)
        case .keyID(let id):
            // Every entry looked up or listed asks: the owner of each key ID is kept for the
            // engine's owner generation once an account here names it.
            let generation = engine?.ownerGeneration ?? 0
            if let owner = keyIDOwners.withLock({ $0.generation == generation ? $0.owners[id] : nil }) {
                return (Protection(record: record, owner: owner), true)
            }
            let account = engine?.account(forKeyID: id)
            let name = account?.upn ?? engine?.unknownOwner(keyID: id) ?? hexString(id)
            guard let owner = try? Owner(name) else { return (.untracked, account != nil) }
            if account != nil {
                keyIDOwners.withLock { known in
                    if known.generation != generation { known = (generation, [:]) }
                    known.owners[id] = owner
                }
            }
            return (Protection(record: record, owner: owner), account != nil)
        }
    }

    /// The owner record of `protection`: a managed identity is recorded by its key ID, any other
    /// owner by name; nil for no owner.
    func ownerRecord(for protection: Protection) -> OwnerRecord? {
        guard let owner = protection.owner else { return nil }
        let encryptedClass: ProtectionClass?
        if case .encrypted(_, let protectionClass) = protection { encryptedClass = protectionClass } else { encryptedClass = nil }
        if let id = engine?.ownerKeyID(for: owner.display) { return OwnerRecord(ownerKeyID: id, encryptedClass: encryptedClass) }
        return OwnerRecord(owner: owner, encryptedClass: encryptedClass)
    }

    /// Writes the owner record `protection` calls for on `inode` (by path), or removes the one it
    /// has when `protection` names no owner.
    func storeRecord(for protection: Protection, on inode: Inode) throws(Errno) {
        try asErrno { () throws(FormatError) in
            if let record = ownerRecord(for: protection) {
                try record.store(at: attributePath(of: inode), names: storeAttributes)
            } else {
                try OwnerRecord.remove(at: attributePath(of: inode), names: storeAttributes)
            }
        }
    }

    /// Whether `record` names `account` (by name, or by its key ID, also once its keybag is gone:
    /// a wipe's account carries it).
    func record(_ record: OwnerRecord, isOf account: Account) -> Bool {
        switch record.holder {
        case .named(let owner):
            return account.matches(owner.canonical) || account.matches(owner.display)
        case .keyID(let id):
            if let known = account.keyIDs { return known.contains(hexString(id)) }
            return engine?.account(forKeyID: id)?.key == account.key
        }
    }

    /// What a new (or truncated) file of `ownerName` becomes: encrypted when the owner is managed
    /// and its policy requires it, else plain with the owner recorded, or untracked without owner.
    func plan(for ownerName: String?) throws(Errno) -> (Protection, ClassKey?) {
        guard let given = ownerName else { return (.untracked, nil) }
        guard let engine else {
            do throws(FormatError) { return (.plain(try Owner(given)), nil) } catch { throw Errno.invalidArgument }
        }
        return try plan(for: engine.newFileOwner(given))
    }

    /// As above, for an owner the engine has described (a registered account is recorded as
    /// registered; other identities as given).
    func plan(for described: NewFileOwner) throws(Errno) -> (Protection, ClassKey?) {
        guard let owner = described.owner else { throw Errno.invalidArgument }
        guard let engine, let protectionClass = described.protectionClass else { return (.plain(owner), nil) }
        let classKey = try asErrno({ () throws(EngineError) in try engine.classKey(forNewFileOf: described) },
                                   failed: { log("create refused for \(owner.display): \($0)") })
        return (.encrypted(owner, protectionClass), classKey)
    }

    /// The caller's effective identity (FUSE gives the calling thread's ID).
    func callerIdentity(_ req: fuse_req_t) -> ResolvedIdentity {
        guard let engine, let context = fuse_req_ctx(req)?.pointee else { return .nobody }
        return engine.resolve(thread: context.pid, uid: context.uid)
    }

    /// The owner a directory passes to files created in it by callers without identity.
    func directoryOwner(_ directory: Inode) -> String? {
        protection(of: directory).owner?.display
    }

    /// Writes a fresh protected form over the open backing file `fd` (emptied): a new header for
    /// an encrypted file, and the owner record (or none). Returns the shared content when encrypted.
    ///
    /// `isNew`: `fd` is a file this request created and that is known to be empty (opened with
    /// `O_CREAT | O_TRUNC`, or `O_TMPFILE`). The owner record then goes on first and nothing asks
    /// the file's attributes before the header is written: on a file system with fine-grained
    /// timestamps (ext4 since Linux 6.13) a change made after the times were looked at stamps them
    /// to the nanosecond, the kernel's next `write()` to the mount then finds them behind its own
    /// clock, and every new file cost one more SETATTR round trip when it was closed.
    func applyProtection(_ protection: Protection, classKey: ClassKey?, fd: Int32, inode: Inode?, isNew: Bool = false) throws(Errno) -> ProtectedContent? {
        func writeRecord() throws(Errno) {
            try asErrno { () throws(FormatError) in
                if let record = ownerRecord(for: protection) { try record.store(on: fd, names: storeAttributes) } else { try OwnerRecord.remove(from: fd, names: storeAttributes) }
            }
        }
        if isNew { try writeRecord() }
        var content: ProtectedContent?
        if case .encrypted(_, let protectionClass) = protection, let classKey, let engine {
            // ProtectedFile.create empties the file itself (unless it is known to be empty).
            let fileKey = try asErrno { () throws(CryptoError) in try SecretBytes.random(count: 32) }
            let duplicate = try Syscall.dup(fd)
            let file = try asErrno({ () throws(FormatError) in
                try ProtectedFile.create(on: DescriptorStorage(fd: duplicate, attributes: storeAttributes), owner: nil, protectionClass: protectionClass,
                                         classKey: classKey, fileKey: fileKey, storageIsEmpty: isNew)
            }, failed: { _ in Syscall.close(duplicate) })
            let lease = try asErrno({ () throws(EngineError) in try engine.adoptFileKey(fileKey, header: file.header) },
                                    failed: { _ in Syscall.close(duplicate) })
            content = ProtectedContent(fd: duplicate, file: file, lease: lease)
        } else if !isNew, try Syscall.fstat(fd).st_size != 0 {
            // Only when there is something to cut: on ext4 a truncate to zero marks the file for
            // writeback at close (auto_da_alloc), a disk write per new file.
            try Syscall.ftruncate(fd, 0)
        }
        if !isNew { try writeRecord() }
        if let inode {
            inode.protectionState.withLock { $0.protection = protection }
        }
        return content
    }

    // MARK: Content

    /// How much of a stored file an open asks the disk for at once (header and first data).
    static let openReadAhead: Int64 = 128 * 1024

    /// The shared decrypted view of an encrypted inode, opened (key unwrapped) by the first handle.
    func acquireContent(_ inode: Inode) throws(Errno) -> ProtectedContent {
        try inode.protectionState.withLock { (state) throws(Errno) -> ProtectedContent in
            if let content = state.content, !content.lease.isRevoked {
                // A locked class B file's shared content serves its open handles, not a new one.
                guard engine?.admitsNewHandle(content.lease) ?? true else { throw Errno.accessDenied }
                content.opens += 1
                return content
            }
            // Read-write, or read-only where the store is (a mounted backup, a snapshot, install
            // media, a store remounted read-only after an error): its files still read.
            var readOnly = false
            let fd: Int32
            do throws(Errno) {
                fd = try Syscall.open(inode.procPath, O_RDWR | O_CLOEXEC)
            } catch where error == .readOnlyFileSystem {
                fd = try Syscall.open(inode.procPath, O_RDONLY | O_CLOEXEC)
                readOnly = true
            }
            // The header is a few hundred bytes and the first read follows: fetch both (the
            // whole of most files) with one disk request instead of two.
            Syscall.willNeed(fd, offset: 0, length: Self.openReadAhead)
            do throws(Errno) {
                let storage = DescriptorStorage(fd: fd, attributes: storeAttributes)
                // The owner record says encrypted: a header that is not one is damage.
                let header = try asErrno({ () throws(FormatError) in try ProtectedFile.readHeader(from: storage) },
                                         failed: { noteTampering($0, of: inode, owner: state.protection?.owner?.canonical) })
                // The owner record names the owner too: a header of another was changed (or moved here).
                if let recorded = state.protection?.owner, let engine, Self.owners(of: header, and: recorded, differIn: engine) {
                    noteTampering(.headerAuthenticationFailed, of: inode, owner: recorded.canonical)
                    log("open refused: the header of a file of \(recorded.display) names another owner")
                    throw Errno.ioError
                }
                guard let engine else { throw Errno.notSupported }
                let lease: FileKeyLease
                do throws(EngineError) { lease = try engine.openFileKey(header) } catch {
                    log("open refused for a file of \(engine.ownerName(of: header)): \(error)")
                    if case .format(let damage) = error { noteTampering(damage, of: inode, owner: engine.ownerName(of: header)) }
                    // A wiped or unknown owner's files are as inaccessible as locked ones. An owner
                    // no account names may mean a state directory that does not match the store.
                    switch error {
                    case .unknownAccount:
                        engine.reportUnknownOwner(engine.ownerName(of: header), in: (try? Syscall.readlink(root.procPath)) ?? "a mount",
                                                  seen: "found opening one of them")
                        throw Errno.accessDenied
                    case .notEnrolled: throw Errno.accessDenied
                    default: throw error.errnoValue
                    }
                }
                let file = try asErrno({ () throws(FormatError) in try ProtectedFile(storage: storage, header: header, fileKey: lease.fileKey) },
                                       failed: { error in
                                           engine.closeFileKey(lease)
                                           noteTampering(error, of: inode, owner: engine.ownerName(of: header))
                                       })
                let content = ProtectedContent(fd: fd, file: file, lease: lease, readOnly: readOnly)
                state.content = content
                return content
            } catch {
                if state.content?.fd != fd { Syscall.close(fd) }
                throw error
            }
        }
    }

    /// Whether a header belongs to another owner than the record says: the named ones compared by
    /// name, a header that names none by the account its class key belongs to.
    static func owners(of header: FileHeader, and recorded: Owner, differIn engine: Engine) -> Bool {
        if let named = header.owner { return named.canonical != recorded.canonical }
        return (try? engine.account(of: header))?.key != (try? engine.account(recorded.canonical))?.key
    }

    /// One handle of `content` closed; the last one drops the file key.
    func releaseContent(_ content: ProtectedContent, of inode: Inode) {
        let last = inode.protectionState.withLock { state -> Bool in
            content.opens -= 1
            guard content.opens <= 0 else { return false }
            if state.content === content { state.content = nil }
            return true
        }
        if last { engine?.closeFileKey(content.lease) }
    }

    /// The handle's content, usable now: a revoked one (the identity locked) is replaced by a fresh
    /// one once the identity is unlocked again; while it is locked, EACCES.
    func liveContent(_ file: OpenFile) throws(Errno) -> ProtectedContent? {
        guard let content = file.content else { return nil }
        guard content.lease.isRevoked else { return content }
        guard let inode = file.inode else { throw Errno.accessDenied }
        let fresh = try acquireContent(inode)
        if file.replaceContent(content, with: fresh) {
            releaseContent(content, of: inode)
            return fresh
        }
        releaseContent(fresh, of: inode)
        return file.content
    }

    /// Runs `body` with the inode's content, opened just for it if no handle holds it.
    func withContent<R>(_ inode: Inode, _ body: (ProtectedContent) throws(Errno) -> R) throws(Errno) -> R {
        let content = try acquireContent(inode)
        defer { releaseContent(content, of: inode) }
        guard !content.lease.isRevoked else { throw Errno.accessDenied }
        return try body(content)
    }

    func log(_ message: String) {
        mountLogger.notice("\(message)")
    }
}
