import CFuse3
import CustodyCore
import CustodySystem
import Glibc

/// Extended attributes, passed through to the backing object (read as `backingGetxattr` says;
/// changed and listed by its /proc/self/fd path, as the xattr calls do not accept O_PATH
/// descriptors). Symlinks carry no user attributes.
///
/// The mount adds virtual attributes: `user.custody.owner` (the owner's identity),
/// `user.custody.class` (the protection class of an encrypted file) and `user.custody.encrypted`
/// (1 or 0). The backing store's own records (`trusted.custody.*`, or `user.custody.store.*`:
/// `StoreAttributes`) are neither shown nor settable.
extension MountFileSystem {
    static let virtualPrefix = "user.custody."

    /// The value of a virtual attribute, or nil when the object has none.
    func virtualAttribute(_ name: String, of inode: Inode) -> String? {
        let protection = protection(of: inode)
        switch name {
        case "user.custody.owner":
            return protection.owner?.display
        case "user.custody.class":
            if case .encrypted(_, let protectionClass) = protection { return protectionClass.description }
            return nil
        case "user.custody.encrypted":
            return inode.isRegularFile ? (protection.isEncrypted ? "1" : "0") : nil
        default:
            return nil
        }
    }

    /// The virtual attributes an object lists: the owned ones show theirs.
    func virtualAttributeNames(of inode: Inode) -> [String] {
        let protection = protection(of: inode)
        guard protection != .untracked else { return [] }
        var names = ["user.custody.owner"]
        if inode.isRegularFile { names.append("user.custody.encrypted") }
        if protection.isEncrypted { names.append("user.custody.class") }
        return names
    }

    /// A descriptor open on a regular file's backing object (an encrypted file's content, or the
    /// latest plain handle), with the object that keeps it open; nil when the file is not open.
    func openDescriptor(of inode: Inode) -> (fd: Int32, owner: AnyObject)? {
        guard inode.isRegularFile else { return nil }
        return inode.protectionState.withLock { state -> (fd: Int32, owner: AnyObject)? in
            if let content = state.content { return (content.fd, content) }
            if let handle = state.plainHandle, handle.fd >= 0 { return (handle.fd, handle) }
            return nil
        }
    }

    /// The directory and name a node was last looked up by, if the directory is still known.
    func backingEntry(of id: UInt64) -> BackingEntry? {
        guard let entry = inodes.name(of: id), let parent = try? inodes.inode(entry.parent) else { return nil }
        return BackingEntry(directory: parent, name: entry.storedName)
    }

    /// Attribute `name` of an inode's backing object. The xattr calls take no O_PATH descriptor,
    /// and its /proc path costs a walk of /proc (5 µs, 10–20 under load) per call, so in order:
    /// the root's directory descriptor; an open handle's descriptor (the kernel asks for
    /// `security.capability` before a file's first write, with the file open); the name it was
    /// looked up by, if that still leads to it (`ls -l` asks every file for its ACL and security
    /// label right after listing it); the /proc path.
    func backingGetxattr(_ inode: Inode, lookedUpAs entry: BackingEntry?, _ name: UnsafePointer<CChar>,
                         _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int {
        if inode === root, rootDirectory >= 0 { return try Syscall.fgetxattr(rootDirectory, name, buffer, size) }
        if let open = openDescriptor(of: inode) {
            return try withExtendedLifetime(open.owner) { () throws(Errno) in try Syscall.fgetxattr(open.fd, name, buffer, size) }
        }
        if let entry, let count = try withExtendedLifetime(entry.directory, { () throws(Errno) in
            try Syscall.getxattr(in: entry.directory.fd, entry.name.cString, ifStill: inode.device, inode.number, name, buffer, size)
        }) {
            return count
        }
        return try Syscall.getxattr(inode.procPath, name, buffer, size)
    }

    func getxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>, _ size: Int) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let attribute = String(cString: name)
            if attribute.hasPrefix(storeAttributes.prefix) { throw Errno.noData }
            if attribute.hasPrefix(Self.virtualPrefix) {
                guard let value = virtualAttribute(attribute, of: inode) else { throw Errno.noData }
                let bytes = Array(value.utf8)
                if size == 0 {
                    fuse_reply_xattr(req, bytes.count)
                } else if size < bytes.count {
                    throw Errno.rangeError
                } else {
                    bytes.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count) }
                }
                return
            }
            guard !inode.isSymlink else { throw Errno.noData }
            let buffer = size == 0 ? nil : UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 1)
            defer { buffer?.deallocate() }
            let count = try backingGetxattr(inode, lookedUpAs: backingEntry(of: UInt64(id)), name, buffer, size)
            if let buffer {
                fuse_reply_buf(req, buffer.assumingMemoryBound(to: CChar.self), count)
            } else {
                fuse_reply_xattr(req, count)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func listxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ size: Int) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            guard !inode.isSymlink else {
                if size == 0 { fuse_reply_xattr(req, 0) } else { fuse_reply_buf(req, nil, 0) }
                return
            }
            // The real names without the hidden records, then the virtual ones.
            var names: [UInt8] = []
            for name in try Syscall.attributeNames(inode.procPath) where !name.hasPrefix(storeAttributes.prefix) {
                names += Array(name.utf8) + [0]
            }
            for name in virtualAttributeNames(of: inode) { names += Array(name.utf8) + [0] }
            if size == 0 {
                fuse_reply_xattr(req, names.count)
            } else if size < names.count {
                throw Errno.rangeError
            } else {
                names.withUnsafeBytes { _ = fuse_reply_buf(req, $0.baseAddress?.assumingMemoryBound(to: CChar.self), names.count) }
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func setxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>, _ value: UnsafePointer<CChar>?, _ size: Int, _ flags: Int32) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let attribute = String(cString: name)
            if attribute.hasPrefix(storeAttributes.prefix) { throw Errno.notPermitted }
            if attribute.hasPrefix(Self.virtualPrefix) {
                let given = value.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: size), as: UTF8.self) } ?? ""
                if attribute == "user.custody.owner" {
                    // Protect (or re-own): the file or directory becomes `given`'s; empty unprotects.
                    guard engine != nil else { throw Errno.notSupported }
                    let owner = given.trimmingWhitespace()
                    try asCaller(req) { () throws(Errno) in try changeOwner(id: UInt64(id), inode, to: owner.isEmpty ? nil : owner) }
                    replyError(req, 0)
                    return
                }
                // The class and encryption flag follow from the owner's policy; setting the
                // current value succeeds (cp -a between owned files), other values cannot be set.
                guard let current = virtualAttribute(attribute, of: inode), current == given.trimmingWhitespace() else { throw Errno.notSupported }
                replyError(req, 0)
                return
            }
            guard !inode.isSymlink else { throw Errno.notPermitted }
            try creatingAsCaller(req, on: inode.device) { () throws(Errno) in try Syscall.setxattr(inode.procPath, name, value, size, flags) }
            if attribute == Self.accessACL { try dropSetGroupIDAfterACL(req, inode) }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    static let accessACL = "system.posix_acl_access"

    /// A file's set-group-ID bit goes when a caller outside its group sets its access ACL, as on
    /// a local file system (which would otherwise let the ACL's mode keep a group's set-ID bit for
    /// someone not in that group). The backing file system sees the daemon, which may keep it;
    /// the kernel leaves this to the daemon. A caller keeps it when the file's group is one of
    /// its groups or it holds CAP_FSETID (root, or a process given that capability), as the
    /// kernel decides for a local file system.
    private func dropSetGroupIDAfterACL(_ req: fuse_req_t, _ inode: Inode) throws(Errno) {
        let attributes = try Syscall.stat(of: inode.fd)
        guard attributes.st_mode & S_ISGID != 0, let context = fuse_req_ctx(req)?.pointee,
              !Self.caller(req, context, isInGroup: attributes.st_gid),
              !CallerCapabilities.has(CallerCapabilities.setID, thread: context.pid) else { return }
        try Syscall.chmod(of: inode.fd, attributes.st_mode & 0o7777 & ~S_ISGID)
    }

    /// Whether the caller's group or one of its supplementary groups is `group`.
    static func caller(_ req: fuse_req_t, _ context: fuse_ctx, isInGroup group: gid_t) -> Bool {
        if context.gid == group { return true }
        var groups = [gid_t](repeating: 0, count: 64)
        var count = fuse_req_getgroups(req, Int32(groups.count), &groups)
        if count > Int32(groups.count) {
            groups = [gid_t](repeating: 0, count: Int(count))
            count = fuse_req_getgroups(req, Int32(groups.count), &groups)
        }
        guard count > 0 else { return false }
        return groups.prefix(min(Int(count), groups.count)).contains(group)
    }

    func removexattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let attribute = String(cString: name)
            if attribute.hasPrefix(storeAttributes.prefix) { throw Errno.notPermitted }
            if attribute == "user.custody.owner", engine != nil {
                // Unprotect: plain and untracked again (recursively for a directory).
                try asCaller(req) { () throws(Errno) in try changeOwner(id: UInt64(id), inode, to: nil) }
                replyError(req, 0)
                return
            }
            if attribute.hasPrefix(Self.virtualPrefix) { throw Errno.notSupported }
            guard !inode.isSymlink else { throw Errno.notPermitted }
            try Syscall.removexattr(inode.procPath, name)
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }
}
