import CFuse3
import CustodySystem
import Glibc

/// Extended attributes, passed through to the backing object by its /proc/self/fd path
/// (the xattr calls do not accept O_PATH descriptors). Symlinks carry no user attributes.
extension PassthroughFilesystem {
    func getxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>, _ size: Int) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            guard !inode.isSymlink else { throw Errno.noData }
            if size == 0 {
                fuse_reply_xattr(req, try Syscall.getxattr(inode.procPath, name, nil, 0))
                return
            }
            let buffer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 1)
            defer { buffer.deallocate() }
            let count = try Syscall.getxattr(inode.procPath, name, buffer, size)
            fuse_reply_buf(req, buffer.assumingMemoryBound(to: CChar.self), count)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }

    func listxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ size: Int) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            guard !inode.isSymlink else {
                if size == 0 { fuse_reply_xattr(req, 0) } else { fuse_reply_buf(req, nil, 0) }
                return
            }
            if size == 0 {
                fuse_reply_xattr(req, try Syscall.listxattr(inode.procPath, nil, 0))
                return
            }
            let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: size)
            defer { buffer.deallocate() }
            let count = try Syscall.listxattr(inode.procPath, buffer, size)
            fuse_reply_buf(req, buffer, count)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }

    func setxattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>, _ value: UnsafePointer<CChar>?, _ size: Int, _ flags: Int32) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            guard !inode.isSymlink else { throw Errno.notPermitted }
            try Syscall.setxattr(inode.procPath, name, value, size, flags)
            fuse_reply_err(req, 0)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }

    func removexattr(_ req: fuse_req_t, _ id: fuse_ino_t, _ name: UnsafePointer<CChar>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            guard !inode.isSymlink else { throw Errno.notPermitted }
            try Syscall.removexattr(inode.procPath, name)
            fuse_reply_err(req, 0)
        } catch {
            fuse_reply_err(req, error.rawValue)
        }
    }
}
