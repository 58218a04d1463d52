import CustodyCrypto
import CustodyFormat
import CustodySystem
import Glibc

/// What a file or directory is protected as (`protectionInfo`).
public struct FileProtectionInfo: Codable, Equatable, Sendable {
    public var path: String
    /// "file", "directory" or "other".
    public var kind: String
    /// The owner identity, as recorded (nil: no owner).
    public var owner: String?
    /// The owner is an enrolled (managed) account of this daemon.
    public var managed: Bool
    public var encrypted: Bool
    /// The protection class of an encrypted file.
    public var protectionClass: String?
    /// The size of the content (plaintext).
    public var size: UInt64
    /// The mount the path is in, if any.
    public var mountPoint: String?
    /// Why a file of a managed owner is plain (nil for every other file).
    public var plainReason: String?
}

/// Whether an identity may receive a file (`canReceiveSharedFile`), and why.
public struct SharingDecision: Codable, Equatable, Sendable {
    public var allowed: Bool
    public var reason: String
    /// For a refusal: 312 SharingNotAllowed (the owner's policy) or 313 ReceivingNotAllowed
    /// (the receiver's).
    public var code: Int?
    public var name: String?
}

/// The SDK's file protection calls on stored files: the backing file of a mount path, or a file
/// outside every mount (an export). Encrypted files are self-describing, so a copy anywhere can be
/// recognised and, while its owner's keys exist, decrypted. Every rewrite is crash-safe: the new
/// form goes to an anonymous file in the same directory (a named temporary one where the file
/// system has no anonymous files, as in a mount), is synced and renamed over the original, so a
/// failure at any point leaves the original as it was.
extension Engine {
    static let stagingPrefix = ".custody-staging-"

    public func protectionInfo(ofStoredPath path: String, shownAs shown: String? = nil, mountPoint: String? = nil) throws(EngineError) -> FileProtectionInfo {
        let attributes = try Self.lstat(path)
        var info = FileProtectionInfo(path: shown ?? path, kind: "other", owner: nil, managed: false, encrypted: false,
                                      protectionClass: nil, size: UInt64(max(0, attributes.st_size)), mountPoint: mountPoint)
        switch attributes.st_mode & S_IFMT {
        case S_IFDIR:
            info.kind = "directory"
            info.owner = try Self.ownerRecord(path).map { ownerName(of: $0) }
        case S_IFREG:
            info.kind = "file"
            if let header = try Self.header(ofFileAt: path) {
                info.owner = ownerName(of: header)
                if header.kind == .encrypted {
                    info.encrypted = true
                    info.protectionClass = header.protectionClass.description
                    info.size = (try? BlockLayout().plaintextSize(storedSize: UInt64(attributes.st_size))) ?? 0
                } else {
                    info.size = UInt64(max(0, Int(attributes.st_size) - FileHeader.length))
                }
            } else {
                info.owner = try Self.ownerRecord(path).map { ownerName(of: $0) }
            }
        default:
            break
        }
        if let owner = info.owner, let account = try? account(owner) {
            info.managed = account.isEnrolled
            if info.kind == "file", info.managed, !info.encrypted { info.plainReason = plainReason(account) }
        }
        return info
    }

    /// Why a file of the managed `account` is plain: its policy, a re-protection under way, or
    /// (neither) a file the re-protection could not reach.
    func plainReason(_ account: Account) -> String {
        if account.policy?.fileEncryptionRequired == false { return "the policy of \(account.upn) does not require encryption" }
        if account.reprotectPending {
            return "\(account.upn)'s files are being brought to its policy (a re-protection is under way, or waits for open files to close)"
        }
        return "the file was not re-protected when \(account.upn) was enrolled or its policy changed (it was open, or the re-protection failed: see the events); "
            + "custodyctl protect PATH \(account.upn) encrypts it now"
    }

    /// True when the file at `path` is in Custody's encrypted format (header intact; the content
    /// is not checked and needs no key).
    public func isFileEncrypted(storedPath path: String) throws(EngineError) -> Bool {
        let attributes = try Self.lstat(path)
        guard attributes.st_mode & S_IFMT == S_IFREG else { return false }
        return try Self.header(ofFileAt: path)?.kind == .encrypted
    }

    /// Encrypts the plain file at `path` in place for `identity` (an enrolled account), with the
    /// class of its policy (capped by MaxFileProtectionLevel).
    public func encryptFile(storedPath path: String, for identity: String) throws(EngineError) {
        let account = try self.account(identity)
        guard let policy = account.policy else { throw .identityNotManaged(account.upn) }
        let protectionClass = min(policy.protectionLevel, settings.maxFileProtectionLevel)
        let classKey = try self.classKey(for: account.id, protectionClass, purpose: .create)
        // The header names no owner (format 3), but the account's name must still be one an
        // owner record can hold.
        do { _ = try Owner(registeredName(account.upn)) } catch { throw .invalidIdentity("\(error)") }

        let source = try Self.openRegularFile(path)
        defer { Syscall.close(source.fd) }
        if try Self.header(of: source.fd, path: path)?.kind == .encrypted { throw .fileAlreadyEncrypted(path) }
        guard source.attributes.st_nlink <= 1 else { throw .fileBusy(path, reason: "it has \(source.attributes.st_nlink) hard links; the others would keep the plaintext") }

        try Self.rewrite(path, as: path, from: source) { (staging) throws(EngineError) in
            let fileKey: SecretBytes
            do throws(CryptoError) { fileKey = try SecretBytes.random(count: 32) } catch { throw .crypto(error) }
            let target: ProtectedFile
            do {
                target = try ProtectedFile.create(on: DescriptorStorage(fd: staging), owner: nil, protectionClass: protectionClass,
                                                  classKey: classKey, fileKey: fileKey)
            } catch {
                throw .failedToEncryptFile(path, reason: "\(error)")
            }
            try Self.copy(from: { (buffer, offset) throws(EngineError) in
                do throws(Errno) { return try Syscall.pread(source.fd, buffer.baseAddress!, buffer.count, Int64(offset)) } catch { throw .io(file: path, error) }
            }, to: { (piece, offset) throws(EngineError) in
                do { try target.write(piece, at: offset) } catch { throw .failedToEncryptFile(path, reason: "\(error)") }
            })
        }
    }

    /// Decrypts the encrypted file at `path` into `copyPath` (a new or replaced file), or in place
    /// when `copyPath` is nil. The file's owner must still have its keys (a wiped identity's files
    /// fail with `FailedToDecryptFile`) and they must be unlocked for its class.
    public func decryptFile(storedPath path: String, toCopyPath copyPath: String? = nil) throws(EngineError) {
        let source = try Self.openRegularFile(path)
        defer { Syscall.close(source.fd) }
        guard let header = try Self.header(of: source.fd, path: path), header.kind == .encrypted else { throw .fileNotEncrypted(path) }
        if copyPath == nil, source.attributes.st_nlink > 1 {
            throw .fileBusy(path, reason: "it has \(source.attributes.st_nlink) hard links")
        }
        let lease: FileKeyLease
        do {
            lease = try openFileKey(header)
        } catch {
            switch error {
            case .unknownAccount, .notEnrolled:
                throw .failedToDecryptFile(path, reason: "no keys for its owner \(ownerName(of: header)) (wiped, or never enrolled here)")
            case .locked: throw error
            default: throw .failedToDecryptFile(path, reason: "\(error)")
            }
        }
        defer { closeFileKey(lease) }
        let file: ProtectedFile
        do {
            file = try ProtectedFile(storage: DescriptorStorage(fd: source.fd), header: header, fileKey: lease.fileKey)
        } catch {
            throw .failedToDecryptFile(path, reason: "\(error)")
        }
        try Self.rewrite(copyPath ?? path, as: path, from: source) { (staging) throws(EngineError) in
            try Self.copy(from: { (buffer, offset) throws(EngineError) in
                do { return try file.read(into: buffer, at: offset) } catch { throw .failedToDecryptFile(path, reason: "\(error)") }
            }, to: { (piece, offset) throws(EngineError) in
                do throws(Errno) { try Syscall.pwriteAll(staging, piece.baseAddress!, piece.count, Int64(offset)) } catch { throw .io(file: copyPath ?? path, error) }
            })
        }
    }

    /// Cuts the encrypted file at `path` (outside a mount, or a mount's stored file) back to its
    /// last authentic block (`ProtectedFile.repair`): for a file a write cut short when the daemon
    /// stopped uncleanly, or damage, left unreadable past some point. Needs the owner's keys.
    /// A repair that changed the file is an event (`fileRepaired`) and a log line; `shownAs` is the
    /// path as the caller named it.
    @discardableResult
    public func repairFile(storedPath path: String, shownAs shown: String? = nil) throws(EngineError) -> RepairOutcome {
        let shown = shown ?? path
        let fd: Int32
        do { fd = try Syscall.open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC) } catch {
            switch error {
            case .noSuchFile: throw .pathNotFound(shown, reason: "no such file")
            case .tooManySymbolicLinkLevels: throw .invalidPath(shown, reason: "a symbolic link, not a file")
            case .isDirectory: throw .invalidPath(shown, reason: "not a regular file")
            default: throw .io(file: shown, error)
            }
        }
        defer { Syscall.close(fd) }
        let attributes: stat
        do { attributes = try Syscall.fstat(fd) } catch { throw .io(file: shown, error) }
        guard attributes.st_mode & S_IFMT == S_IFREG else { throw .invalidPath(shown, reason: "not a regular file") }
        guard let header = try Self.header(of: fd, path: shown), header.kind == .encrypted else { throw .fileNotEncrypted(shown) }
        let lease: FileKeyLease
        do { lease = try openFileKey(header) } catch {
            switch error {
            case .unknownAccount, .notEnrolled:
                throw .failedToDecryptFile(shown, reason: "no keys for its owner \(ownerName(of: header)) (wiped, or never enrolled here)")
            case .format(let damage):
                throw .failedToDecryptFile(shown, reason: "its header cannot be used (\(damage)); a header is not repaired")
            default: throw error
            }
        }
        defer { closeFileKey(lease) }
        let outcome: RepairOutcome
        do { outcome = try ProtectedFile.repair(DescriptorStorage(fd: fd), header: header, fileKey: lease.fileKey) } catch {
            if case .io(let errno) = error { throw .io(file: shown, errno) }
            throw .failedToDecryptFile(shown, reason: "\(error)")
        }
        guard outcome.repaired else { return outcome }
        let owner = ownerName(of: header)
        var details = ["path": scrubbedPath(shown), "sizeAfter": "\(outcome.sizeAfter)"]
        if let size = outcome.sizeBefore { details["sizeBefore"] = "\(size)" }
        if let block = outcome.firstDamagedBlock { details["firstDamagedBlock"] = "\(block)" }
        let before = outcome.sizeBefore.map { "\($0) bytes" } ?? "a length no file can have"
        events.emit(.fileRepaired, identity: owner,
                    "repaired \(owner)'s encrypted file \(details["path"] ?? ""): cut back to its last authentic block, \(before) → \(outcome.sizeAfter) bytes"
                        + (outcome.firstDamagedBlock.map { " (block \($0) was the first damaged)" } ?? ""),
                    details: details)
        return outcome
    }

    /// May `identity` receive the file at `path` (`canReceiveSharedFile`)? The transfer rules
    /// decide, as in the mount: the owner's `sendToOtherIdentities`, then the receiver's
    /// `receiveFromOtherIdentities` (see docs/identity.md).
    public func canReceiveSharedFile(storedPath path: String, identity: String) throws(EngineError) -> SharingDecision {
        let identity = try Account.checkedName(identity)
        let info = try protectionInfo(ofStoredPath: path)
        let decision = transferDecision(from: info.owner, to: identity, by: .ownerChange)
        return SharingDecision(allowed: decision.allowed, reason: decision.reason, code: decision.code, name: decision.name)
    }

    // MARK: Pieces

    static func lstat(_ path: String) throws(EngineError) -> stat {
        do { return try Syscall.lstat(path) } catch {
            if error == .noSuchFile { throw .pathNotFound(path, reason: "no such file or directory") }
            throw .io(file: path, error)
        }
    }

    static func openRegularFile(_ path: String) throws(EngineError) -> (fd: Int32, attributes: stat) {
        let fd: Int32
        do { fd = try Syscall.open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) } catch {
            switch error {
            case .noSuchFile: throw .pathNotFound(path, reason: "no such file")
            case .tooManySymbolicLinkLevels: throw .invalidPath(path, reason: "a symbolic link, not a file")
            default: throw .io(file: path, error)
            }
        }
        let attributes: stat
        do { attributes = try Syscall.fstat(fd) } catch {
            Syscall.close(fd)
            throw .io(file: path, error)
        }
        guard attributes.st_mode & S_IFMT == S_IFREG else {
            Syscall.close(fd)
            throw .invalidPath(path, reason: "not a regular file")
        }
        return (fd, attributes)
    }

    /// The header of a stored file, nil when it does not start with the format's magic.
    static func header(ofFileAt path: String) throws(EngineError) -> FileHeader? {
        let fd: Int32
        do { fd = try Syscall.open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) } catch { throw .io(file: path, error) }
        defer { Syscall.close(fd) }
        return try header(of: fd, path: path)
    }

    /// The header of the open stored file `fd` (named `path` in errors).
    static func header(of fd: Int32, path: String) throws(EngineError) -> FileHeader? {
        var bytes = [UInt8](repeating: 0, count: FileHeader.length)
        let count: Int
        do {
            count = try bytes.withMutableBytes { (buffer) throws(Errno) in try Syscall.preadAll(fd, buffer.baseAddress!, buffer.count, 0) }
        } catch {
            throw .io(file: path, error)
        }
        do {
            return try ProtectedData.header(of: Array(bytes[0..<count]))
        } catch {
            throw .failedToDecryptFile(path, reason: "\(error)")
        }
    }

    static func ownerRecord(_ path: String) throws(EngineError) -> OwnerRecord? {
        do { return try OwnerRecord.load(from: path) } catch {
            if case .io(let errno) = error, errno == .notSupported || errno == .notPermitted { return nil }
            throw .format(error)
        }
    }

    /// Writes `destination` anew: `fill` writes the content into an anonymous file in its
    /// directory, which takes the mode, owner and times of `source` and is renamed into place.
    static func rewrite(_ destination: String, as sourcePath: String, from source: (fd: Int32, attributes: stat),
                        _ fill: (Int32) throws(EngineError) -> Void) throws(EngineError) {
        let (directoryPath, name) = Syscall.split(destination)
        guard !name.isEmpty, name != ".", name != ".." else { throw .invalidPath(destination, reason: "not a file name") }
        func system<T>(_ body: () throws(Errno) -> T) throws(EngineError) -> T {
            do { return try body() } catch {
                switch error {
                case .noSuchFile: throw .pathNotFound(destination, reason: "its directory does not exist")
                case .notDirectory: throw .invalidPath(destination, reason: "its directory is not a directory")
                default: throw .io(file: destination, error)
                }
            }
        }
        let directory = try system { () throws(Errno) in try Syscall.open(directoryPath, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        defer { Syscall.close(directory) }
        let staging = try system { () throws(Errno) in
            try Syscall.createStaging(in: directory, mode: source.attributes.st_mode & 0o7777, prefix: stagingPrefix)
        }
        defer { Syscall.close(staging.fd) }
        var published = false
        defer { if !published { Syscall.discardStaging(staging, in: directory) } }
        if destination == sourcePath {
            // Same place, same owner (root may give it; anyone else already is it).
            try? Syscall.fchownat(staging.fd, "", source.attributes.st_uid, source.attributes.st_gid, Linux.AT_EMPTY_PATH)
        }
        try fill(staging.fd)
        try system { () throws(Errno) in
            try Syscall.futimens(staging.fd, [source.attributes.st_atim, source.attributes.st_mtim])
            try Syscall.fsync(staging.fd)
            try Syscall.publishStaging(staging, in: directory, as: name, prefix: stagingPrefix)
        }
        published = true
    }

    /// Copies content in 1 MiB pieces until `read` returns 0; the buffer is zeroed afterwards.
    static func copy(from read: (UnsafeMutableRawBufferPointer, UInt64) throws(EngineError) -> Int,
                     to write: (UnsafeRawBufferPointer, UInt64) throws(EngineError) -> Void) throws(EngineError) {
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer {
            chunk.initializeMemory(as: UInt8.self, repeating: 0)
            chunk.deallocate()
        }
        var offset: UInt64 = 0
        while true {
            let count = try read(chunk, offset)
            if count == 0 { return }
            try write(UnsafeRawBufferPointer(rebasing: chunk[0..<count]), offset)
            offset += UInt64(count)
        }
    }
}
