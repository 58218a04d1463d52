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
    private let filesystem: PassthroughFilesystem
    private let wipe: MountWipe
    private let enforcement: LockEnforcement?

    init(mountPoint: String, backingDirectory: String, allowsOtherUsers: Bool, filesystem: PassthroughFilesystem, session: OpaquePointer?,
         enforcement: LockEnforcement? = nil) {
        self.enforcement = enforcement
        self.mountPoint = mountPoint
        self.backingDirectory = backingDirectory
        self.allowsOtherUsers = allowsOtherUsers
        self.filesystem = filesystem
        self.wipe = MountWipe(filesystem: filesystem, session: session)
    }

    /// Waits for the lock enforcement queue: every invalidation for locks so far has been sent.
    func settleCaches() { enforcement?.settle() }

    func wipeFiles(of account: Account, progress: (Int, Int, UInt64) -> Void) throws {
        try wipe.wipeFiles(of: account, progress: progress)
    }

    func changeOwner(_ relativePath: String, to owner: String?, progress: (Int) -> Void) throws(EngineError) {
        let shown = relativePath.isEmpty ? mountPoint : mountPoint + "/" + relativePath
        do throws(Errno) {
            let (inode, id) = try locate(relativePath)
            var done = 0
            try filesystem.changeOwner(id: id, inode, to: owner) {
                done += 1
                progress(done)
            }
        } catch {
            switch error {
            case Errno(EBUSY): throw .fileBusy(shown, reason: "a file in it is open; close it and try again")
            case .tooManyLinksToFile: throw .fileBusy(shown, reason: "a file in it has hard links")
            case .noSuchFile: throw .invalidPath(shown, reason: "no such file or directory")
            case .notSupported: throw .invalidPath(shown, reason: "only files and directories have owners")
            case Errno(EPERM):
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

    /// The inode at `relativePath` (the kernel's, when it knows the object) and its node ID.
    private func locate(_ relativePath: String) throws(Errno) -> (Inode, UInt64?) {
        var inode = try filesystem.inodes.inode(InodeTable.rootID)
        var id: UInt64? = InodeTable.rootID
        for name in relativePath.split(separator: "/") where !name.isEmpty {
            guard name != ".", name != ".." else { throw Errno.invalidArgument }
            let fd = try Syscall.openat(inode.fd, String(name), Linux.O_PATH | O_NOFOLLOW | O_CLOEXEC)
            let attributes: stat
            do { attributes = try Syscall.stat(of: fd) } catch {
                Syscall.close(fd)
                throw error
            }
            if let known = filesystem.inodes.id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)),
               let existing = try? filesystem.inodes.inode(known) {
                Syscall.close(fd)
                (inode, id) = (existing, known)
            } else {
                (inode, id) = (Inode(fd: fd, device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino), fileType: attributes.st_mode & S_IFMT), nil)
            }
        }
        return (inode, id)
    }
}
