import CFuse3
import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import Glibc

/// Changing the owner of existing files and directories (setting or removing
/// `user.custody.owner`): protect, unprotect, re-own.
///
/// A file whose stored form changes (plain ↔ encrypted, or another owner's key) is rewritten
/// crash-safely: the new form goes to an anonymous `O_TMPFILE` in the same directory (gone if the
/// daemon dies), is synced, linked under a temporary name and renamed over the original; the
/// directory is synced. The kernel's node ID is then pointed at the new backing inode, so names
/// and caches stay valid. Between plain forms only the owner record changes.
extension MountFileSystem {
    static let stagingPrefix = ".custody-reprotect-"

    /// Gives `inode` (node `id`) the owner `ownerName` (nil: no owner). Directories pass it on to
    /// everything below them, and keep it as the owner of files later created in them by callers
    /// without identity.
    ///
    /// Names follow: each entry's stored name is made again with the new owner's name key (or
    /// plain), the entry's own (`entry`: its directory and stored name, else the name the kernel
    /// last looked it up by) and, for a directory, every name below it.
    func changeOwner(id: UInt64?, _ inode: Inode, to ownerName: String?, entry: (directory: Inode, stored: FileName)? = nil,
                     done: () -> Void = {}) throws(Errno) {
        if inode.isDirectory, let refused = try transferRefusal(below: inode, to: ownerName) {
            // Nothing changes when any file below may not go to the new owner.
            log("refused: \(refused.reason)")
            throw Errno.notPermitted
        }
        try changeOwnerChecked(id: id, inode, to: ownerName, done: done)
        if let entry {
            renameForOwner(entry.stored, in: entry.directory, owner: ownerName)
        } else if let id, let known = inodes.name(of: id), let directory = try? inodes.inode(known.parent) {
            renameForOwner(known.storedName, in: directory, owner: ownerName)
        }
    }

    /// The first refusal below `directory` (itself included) of giving its contents to `ownerName`.
    func transferRefusal(below directory: Inode, to ownerName: String?) throws(Errno) -> TransferDecision? {
        if let refused = refusal(protection(of: directory).owner, to: ownerName) { return refused }
        var refused: TransferDecision?
        try forEachChild(of: directory) { (child, _) throws(Errno) in
            guard refused == nil else { return }
            if child.isDirectory {
                refused = try transferRefusal(below: child, to: ownerName)
            } else {
                refused = refusal(protection(of: child).owner, to: ownerName)
            }
        }
        return refused
    }

    /// Why the data of `current` may not become `ownerName`'s (the engine's transfer rules, with
    /// no exemption: an owner change is not a process's read), or nil.
    func refusal(_ current: Owner?, to ownerName: String?) -> TransferDecision? {
        guard let engine else { return nil }
        let decision = engine.transferDecision(from: current?.display, to: ownerName, by: .ownerChange)
        return decision.allowed ? nil : decision
    }

    private func changeOwnerChecked(id: UInt64?, _ inode: Inode, to ownerName: String?, done: () -> Void) throws(Errno) {
        try checkSharing(protection(of: inode).owner, to: ownerName)
        if inode.isDirectory {
            let owner = try ownerName.map { (name) throws(Errno) -> Owner in
                do { return try Owner(name) } catch { throw Errno.invalidArgument }
            }
            let protection: Protection = owner.map { .plain($0) } ?? .untracked
            try storeRecord(for: protection, on: inode)
            inode.protectionState.withLock { $0.protection = protection }
            try forEachChild(of: inode) { (child, childID) throws(Errno) in
                try changeOwnerChecked(id: childID, child, to: ownerName, done: done)
            }
            for name in try Syscall.directoryNames(in: inode.fd) where !name.hasPrefix(Self.stagingPrefix) {
                renameForOwner(name, in: inode, owner: ownerName)
            }
        } else if inode.isRegularFile {
            let (wanted, classKey) = try plan(for: ownerName)
            try reprotect(id: id, inode, to: wanted, classKey: classKey)
        } else {
            throw Errno.notSupported
        }
        done()
    }

    /// A file goes to another identity (or to none) only as the transfer rules allow: otherwise
    /// EPERM, whoever asks.
    private func checkSharing(_ current: Owner?, to ownerName: String?) throws(Errno) {
        guard let refused = refusal(current, to: ownerName) else { return }
        log("refused: \(refused.reason)")
        throw Errno.notPermitted
    }

    /// Calls `body` for every directory and regular file directly in `directory`, with the node
    /// ID the kernel knows it by (nil when it has not looked it up).
    private func forEachChild(of directory: Inode, _ body: (Inode, UInt64?) throws(Errno) -> Void) throws(Errno) {
        let names = try Syscall.directoryNames(in: directory.fd).filter { !$0.hasPrefix(Self.stagingPrefix) }
        for name in names {
            let childFD = try Syscall.openat(directory.fd, name.cString, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC)
            let attributes: stat
            do { attributes = try Syscall.stat(of: childFD) } catch {
                Syscall.close(childFD)
                throw error
            }
            let kind = attributes.st_mode & S_IFMT
            guard kind == S_IFREG || kind == S_IFDIR else {
                Syscall.close(childFD)
                continue
            }
            if let known = inodes.known(attributes) {
                Syscall.close(childFD)
                try body(known.inode, known.id)
            } else {
                try body(Inode(fd: childFD, attributes: attributes), nil)
            }
        }
    }

    /// Rewrites one regular file into the `wanted` form (see the type's comment); with
    /// `rewriting`, also when it has that form already (an earlier format's file, written anew
    /// in the current one).
    func reprotect(id: UInt64?, _ inode: Inode, to wanted: Protection, classKey: ClassKey?, rewriting: Bool = false) throws(Errno) {
        let current = protection(of: inode)
        guard wanted != current || rewriting else { return }
        try inode.protectionState.withLock { (state) throws(Errno) in
            if state.openHandles > 0 || state.content != nil { throw Errno.resourceBusy }
        }
        if !current.isEncrypted, !wanted.isEncrypted {
            // Between plain forms the bytes stay: only the record changes.
            try storeRecord(for: wanted, on: inode)
            inode.protectionState.withLock { $0.protection = wanted }
            return
        }
        let attributes = try Syscall.stat(of: inode.fd)
        guard attributes.st_nlink <= 1 else { throw Errno.tooManyLinks }
        let (directoryPath, name) = try backingLocation(of: inode)
        let directory = try Syscall.open(directoryPath.cString, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer { Syscall.close(directory) }

        // The new form, in an anonymous file in the same directory.
        let staging = try Syscall.openat(directory, ".", Linux.O_TMPFILE | O_RDWR | O_CLOEXEC, attributes.st_mode & 0o7777)
        defer { Syscall.close(staging) }
        try Syscall.fchownat(staging, "", attributes.st_uid, attributes.st_gid, Linux.AT_EMPTY_PATH)
        let target = try applyProtection(wanted, classKey: classKey, fd: staging, inode: nil, isNew: true)
        defer { if let target { engine?.closeFileKey(target.lease) } }

        // Copy the plaintext across.
        let source = current.isEncrypted ? try acquireContent(inode) : nil
        defer { if let source { releaseContent(source, of: inode) } }
        let plainSource = source == nil ? try Syscall.open(inode.procPath, O_RDONLY | O_CLOEXEC) : -1
        defer { if plainSource >= 0 { Syscall.close(plainSource) } }
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer {
            chunk.initializeMemory(as: UInt8.self, repeating: 0)
            chunk.deallocate()
        }
        var offset: UInt64 = 0
        while true {
            let count: Int
            if let source {
                count = try asErrno { () throws(FormatError) in try source.file.read(into: chunk, at: offset) }
            } else {
                count = try Syscall.pread(plainSource, chunk.baseAddress!, chunk.count, Int64(offset))
            }
            if count == 0 { break }
            let piece = UnsafeRawBufferPointer(rebasing: chunk[0..<count])
            if let target {
                try asErrno { () throws(FormatError) in try target.file.write(piece, at: offset) }
            } else {
                try Syscall.pwriteAll(staging, piece.baseAddress!, count, Int64(offset))
            }
            offset += UInt64(count)
        }
        try copyUserAttributes(from: inode.procPath, to: Syscall.procPath(staging))
        try Syscall.futimens(staging, [attributes.st_atim, attributes.st_mtim])
        try Syscall.fsync(staging)

        // Swap it in: link under a temporary name, rename over the original, sync the directory.
        try Syscall.publishTemporary(staging, in: directory, as: name.cString, prefix: Self.stagingPrefix)

        // The kernel's node ID now names the new backing inode. Its descriptor is opened by name
        // (one opened through the temporary file's /proc link would keep that file's anonymous
        // path), and checked to be the inode just renamed into place.
        let staged = try Syscall.fstat(staging)
        var pathFD = try Syscall.openat(directory, name.cString, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC)
        var replaced: stat
        do { replaced = try Syscall.stat(of: pathFD) } catch {
            Syscall.close(pathFD)
            throw error
        }
        if replaced.st_ino != staged.st_ino || replaced.st_dev != staged.st_dev {
            // Renamed again meanwhile: keep the inode itself.
            Syscall.close(pathFD)
            pathFD = try Syscall.open(Syscall.procPath(staging), Linux.O_PATH | O_CLOEXEC)
            replaced = staged
        }
        let replacement = Inode(fd: pathFD, device: UInt64(replaced.st_dev), number: UInt64(replaced.st_ino), fileType: S_IFREG)
        replacement.protectionState.withLock { $0.protection = wanted }
        inode.protectionState.withLock { $0.protection = wanted }
        if let id { inodes.replace(id, with: replacement) }
    }

    /// The backing directory and name of a file (from its /proc/self/fd link), byte for byte:
    /// the file is renamed over by that name.
    private func backingLocation(of inode: Inode) throws(Errno) -> (directory: FileName, name: FileName) {
        let target = try Syscall.readlinkName(inode.procPath)
        guard target.hasPrefix("/") else { throw Errno.noSuchFile }
        let (directory, name) = Syscall.split(target)
        // The link must lead to this file: an unlinked one's reads "… (deleted)", which may
        // also be a live file's name.
        let attributes = try Syscall.lstat(name.appended(to: directory).cString)
        guard UInt64(attributes.st_dev) == inode.device, UInt64(attributes.st_ino) == inode.number else { throw Errno.noSuchFile }
        return (directory, name)
    }

    /// Copies extended attributes, except Custody's own records, between two paths.
    private func copyUserAttributes(from source: String, to destination: String) throws(Errno) {
        for name in try Syscall.attributeNames(source) where !name.hasPrefix(storeAttributes.prefix) {
            let length = try Syscall.getxattr(source, name, nil, 0)
            var value = [UInt8](repeating: 0, count: max(length, 1))
            let got = try value.withMutableBytes { (b) throws(Errno) in try Syscall.getxattr(source, name, b.baseAddress, length) }
            try value.withBytes { (b) throws(Errno) in try Syscall.setxattr(destination, name, b.baseAddress, got, 0) }
        }
    }
}
