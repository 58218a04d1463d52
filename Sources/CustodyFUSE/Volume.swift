import CustodyCore
import CustodyFormat
import CustodySystem
import Glibc

/// This mount as the engine sees it (`ProtectedVolume`): the control API's owner changes (protect,
/// encrypt and decrypt in place) run here, through the same code as `setfattr` on the mount, so
/// the kernel's view of the files stays coherent.
final class MountVolume: ProtectedVolume, @unchecked Sendable {
    let mountPoint: String
    let backingDirectory: String
    let allowsOtherUsers: Bool
    private let filesystem: MountFileSystem
    private let wipe: MountWipe
    private let enforcement: LockEnforcement?
    private let reprotection: PolicyReprotection?
    let upgrade: FormatUpgrade?

    init(mountPoint: String, backingDirectory: String, allowsOtherUsers: Bool, filesystem: MountFileSystem, session: OpaquePointer?,
         enforcement: LockEnforcement? = nil, reprotection: PolicyReprotection? = nil, upgrade: FormatUpgrade? = nil) {
        self.enforcement = enforcement
        self.reprotection = reprotection
        self.upgrade = upgrade
        self.mountPoint = mountPoint
        self.backingDirectory = backingDirectory
        self.allowsOtherUsers = allowsOtherUsers
        self.filesystem = filesystem
        self.wipe = MountWipe(filesystem: filesystem, session: session, mountPoint: mountPoint)
    }

    /// Waits for the lock enforcement queue: every invalidation for locks so far has been sent.
    func settleCaches() { enforcement?.settle() }

    func lockRequested(_ account: Account) { enforcement?.classAFiles(of: account) }
    func locked(_ account: Account) { enforcement?.classAFiles(of: account) }
    func wipeStarting(_ account: Account) { enforcement?.allFiles(of: account) }
    func namesHidden(_ account: Account) { for tag in account.nameTags { wipe.hideNames(tagged: tag) } }
    func namesRevealed(_ account: Account) {
        wipe.revealNames()
        upgrade?.start(for: account)
    }

    func policyChanged(_ account: Account) {
        enforcement?.allFiles(of: account)
        reprotection?.start(for: account)
    }

    func keysRotated(_ account: Account) {
        reprotection?.start(for: account)
    }

    func unlocked(_ account: Account) {
        reprotection?.start(for: account)
    }

    func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws(Errno) {
        try wipe.wipeFiles(of: account, progress: progress)
    }

    func listOwnedObjects(of account: Account, visit: (OwnedObject) -> Bool) throws(Errno) {
        try wipe.listOwnedObjects(of: account, visit: visit)
    }

    func changeOwner(_ relativePath: String, to owner: String?, progress: (Int) -> Void) throws(EngineError) {
        let shown = relativePath.isEmpty ? mountPoint : mountPoint + "/" + relativePath
        do throws(Errno) {
            let (inode, id) = try locate(relativePath)
            waitForLastClose(inode)
            var done = 0
            try filesystem.changeOwner(id: id, inode, to: owner, entry: try? entry(of: relativePath)) {
                done += 1
                progress(done)
            }
        } catch {
            switch error {
            case .resourceBusy: throw .fileBusy(shown, reason: "a file in it is open; close it and try again")
            case .tooManyLinks: throw .fileBusy(shown, reason: "a file in it has hard links")
            case .noSuchFile: throw .invalidPath(shown, reason: "no such file or directory")
            case .notSupported: throw .invalidPath(shown, reason: "only files and directories have owners")
            case .notPermitted:
                let located = try? locate(relativePath)
                let refused = located.flatMap { (inode, _) in
                    inode.isDirectory ? (try? filesystem.transferRefusal(below: inode, to: owner)) ?? nil
                        : filesystem.refusal(filesystem.protection(of: inode).owner, to: owner)
                }
                throw .transferNotAllowed(refused ?? TransferDecision.refused("the transfer rules refuse giving it to \(owner ?? "no identity")"))
            case .invalidArgument: throw .invalidIdentity("not a valid identity: \(owner ?? "")")
            default: throw .io(file: shown, error)
            }
        }
    }

    func repair(_ relativePath: String) throws(EngineError) -> RepairOutcome {
        let shown = relativePath.isEmpty ? mountPoint : mountPoint + "/" + relativePath
        let (inode, id): (Inode, UInt64?)
        do throws(Errno) { (inode, id) = try locate(relativePath) } catch {
            throw error == .noSuchFile ? .invalidPath(shown, reason: "no such file") : .io(file: shown, error)
        }
        guard inode.isRegularFile else { throw .invalidPath(shown, reason: "not a regular file") }
        // An open file's content is held decrypted with its size: it must be closed first.
        waitForLastClose(inode)
        let busy = inode.protectionState.withLock { $0.openHandles > 0 || $0.content != nil }
        guard !busy else { throw .fileBusy(shown, reason: "it is open; close it and try again") }
        guard let engine = filesystem.engine else { throw .fileNotEncrypted(shown) }
        let outcome = try engine.repairFile(storedPath: storedPath(of: relativePath), shownAs: shown)
        // The kernel keeps the size it knows while it caches the inode (the writeback cache trusts
        // its own): it learns the new one from a truncation through the mount, which finds the
        // stored file already at that size and changes nothing more. Its cached pages go too.
        if outcome.repaired {
            if Glibc.truncate(shown, off_t(outcome.sizeAfter)) != 0 {
                filesystem.log("after repairing \(shown), the kernel could not be given its new size: \(Errno.current)")
            }
            if let id {
                filesystem.storageEdges.invalidate(id)
                filesystem.storageEdges.drain()
            }
        }
        return outcome
    }

    /// A file closed just before a control request is released a moment later (the kernel sends
    /// RELEASE after `close` returns, and nobody waits for it): waits up to `seconds` for a regular
    /// file's handles to go, so that `cat f; custodyctl decrypt-file f` does not find it busy.
    private func waitForLastClose(_ inode: Inode, seconds: Double = 2) {
        guard inode.isRegularFile else { return }
        let deadline = monotonicSeconds() + seconds
        while inode.protectionState.withLock({ $0.openHandles > 0 || $0.content != nil }), monotonicSeconds() < deadline {
            usleep(5_000)
        }
    }

    func storedPath(of relativePath: String) -> String {
        var path = FileName(backingDirectory)
        var directory = try? filesystem.inodes.inode(InodeTable.rootID)
        for name in relativePath.split(separator: "/") where !name.isEmpty {
            let given = FileName(String(name))
            guard let parent = directory, name != ".", name != "..",
                  let (resolved, fd) = try? filesystem.findEntry(given.cString, in: parent, probe: { (stored) throws(Errno) in
                      try Syscall.openat(parent.fd, stored, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC)
                  }) else {
                path = given.appended(to: path)
                directory = nil
                continue
            }
            path = resolved.stored.appended(to: path)
            if let attributes = try? Syscall.stat(of: fd), attributes.st_mode & S_IFMT == S_IFDIR {
                directory = Inode(fd: fd, device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino), fileType: S_IFDIR)
            } else {
                Syscall.close(fd)
                directory = nil
            }
        }
        return path.text ?? String(decoding: path.bytes, as: UTF8.self)
    }

    /// The directory holding `relativePath` and its stored name there (nil for the root).
    private func entry(of relativePath: String) throws(Errno) -> (directory: Inode, stored: FileName)? {
        let names = relativePath.split(separator: "/").filter { !$0.isEmpty }
        guard let last = names.last else { return nil }
        let (directory, _) = try locate(names.dropLast().joined(separator: "/"))
        let (resolved, _) = try filesystem.existingEntry(FileName(String(last)).cString, in: directory)
        return (directory, resolved.stored)
    }

    /// The inode at `relativePath` (the kernel's, when it knows the object) and its node ID.
    private func locate(_ relativePath: String) throws(Errno) -> (Inode, UInt64?) {
        var inode = try filesystem.inodes.inode(InodeTable.rootID)
        var id: UInt64? = InodeTable.rootID
        for name in relativePath.split(separator: "/") where !name.isEmpty {
            guard name != ".", name != ".." else { throw Errno.invalidArgument }
            let directory = inode
            let (_, fd) = try filesystem.findEntry(FileName(String(name)).cString, in: directory) { (stored) throws(Errno) in
                try Syscall.openat(directory.fd, stored, Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC)
            }
            let attributes: stat
            do { attributes = try Syscall.stat(of: fd) } catch {
                Syscall.close(fd)
                throw error
            }
            if let known = filesystem.inodes.known(attributes) {
                Syscall.close(fd)
                (inode, id) = (known.inode, known.id)
            } else {
                (inode, id) = (Inode(fd: fd, attributes: attributes), nil)
            }
        }
        return (inode, id)
    }
}
