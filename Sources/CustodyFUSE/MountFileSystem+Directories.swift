import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Directories: OPENDIR, RELEASEDIR, FSYNCDIR, READDIR and READDIRPLUS.
extension MountFileSystem {
    func opendir(_ req: fuse_req_t, _ id: fuse_ino_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        do throws(Errno) {
            let inode = try inodes.inode(UInt64(id))
            let fd = try withDescriptor { () throws(Errno) in try Syscall.openat(inode.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
            guard let dir = fdopendir(fd) else {
                let error = Errno.current
                Syscall.close(fd)
                throw error
            }
            fi.pointee.fh = HandleBox.store(OpenDirectory(dir: dir))
            fi.pointee.cache_readdir = options.sharedStore ? 0 : 1
            if fuse_reply_open(req, fi) != 0 {
                HandleBox.release(fi.pointee.fh, as: OpenDirectory.self)
            }
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func releasedir(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        if fi.pointee.fh != 0 {
            HandleBox.release(fi.pointee.fh, as: OpenDirectory.self)
        }
        replyError(req, 0)
    }

    func fsyncdir(_ req: fuse_req_t, _ dataOnly: Bool, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let dir = HandleBox.borrow(fi.pointee.fh, as: OpenDirectory.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if dataOnly { try Syscall.fdatasync(dir.fd) } else { try Syscall.fsync(dir.fd) }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    static let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name) ?? 19

    /// Lists entries from `offset`, as many as fit in `size` bytes. With `plus`, each entry
    /// (but . and ..) is looked up too, so the kernel needs no separate lookup per name.
    func readdir(_ req: fuse_req_t, _ id: fuse_ino_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>, plus: Bool) {
        guard let directory = HandleBox.borrow(fi.pointee.fh, as: OpenDirectory.self) else {
            replyError(req, EBADF)
            return
        }
        let parent: Inode
        do { parent = try inodes.inode(UInt64(id)) } catch {
            replyError(req, error.rawValue)
            return
        }
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: max(size, 1), alignment: 8)
        defer { buffer.deallocate() }
        // The regular files listed, in order, for read-ahead across them.
        var files: [UInt64] = []
        let (used, failure) = directory.stream.withLock { stream -> (Int, Int32) in
            let listing = nameListing(of: parent, readable: dirfd(stream.dir))
            if stream.offset != Int64(offset) {
                seekdir(stream.dir, Int(offset))
                stream.offset = Int64(offset)
            }
            var used = 0
            while true {
                errno = 0
                guard let record = Glibc.readdir(stream.dir) else {
                    return (used, used == 0 ? errno : 0)
                }
                let storedName = (UnsafeRawPointer(record) + Self.nameOffset).assumingMemoryBound(to: CChar.self)
                let next = Int64(record.pointee.d_off)
                let remaining = size - used
                let needed: Int
                // An encrypted name is listed decrypted when its key is held.
                let shown: FileName?
                if plus {
                    var entry: fuse_entry_param
                    if Self.isDotOrDotDot(storedName) || underInodePressure {
                        // Names only (no inode for the kernel) for dot entries, and while the
                        // kernel holds too many inodes: it looks them up when it needs them.
                        shown = shownName(storedName, in: parent, listing: listing)
                        entry = fuse_entry_param()
                        entry.attr.st_ino = record.pointee.d_ino
                        entry.attr.st_mode = mode_t(record.pointee.d_type) << 12
                    } else {
                        do {
                            (shown, entry) = try listedEntry(storedName, in: parent, UInt64(id), listing: listing)
                        } catch {
                            // Removed since the listing was read: skip it.
                            stream.offset = next
                            continue
                        }
                    }
                    needed = shown?.cString.withUnsafeBufferPointer { fuse_add_direntry_plus(req, buffer + used, remaining, $0.baseAddress, &entry, off_t(next)) }
                        ?? fuse_add_direntry_plus(req, buffer + used, remaining, storedName, &entry, off_t(next))
                    if needed > remaining, entry.ino != 0 {
                        inodes.forget(UInt64(entry.ino), count: 1)
                    } else if entry.ino != 0, entry.attr.st_mode & S_IFMT == S_IFREG {
                        files.append(UInt64(entry.ino))
                    }
                } else {
                    shown = shownName(storedName, in: parent, listing: listing)
                    var attributes = stat()
                    attributes.st_ino = record.pointee.d_ino
                    attributes.st_mode = mode_t(record.pointee.d_type) << 12
                    needed = shown?.cString.withUnsafeBufferPointer { fuse_add_direntry(req, buffer + used, remaining, $0.baseAddress, &attributes, off_t(next)) }
                        ?? fuse_add_direntry(req, buffer + used, remaining, storedName, &attributes, off_t(next))
                }
                if needed > remaining {
                    // Did not fit: the next call starts again with this entry.
                    seekdir(stream.dir, Int(stream.offset))
                    return (used, 0)
                }
                used += needed
                stream.offset = next
            }
        }
        if failure != 0 {
            replyError(req, failure)
        } else {
            // Recorded before the answer: once answered, the program may open the first file,
            // on another thread, and that open looks for this listing.
            if plus { directoryReadAhead.listed(files, in: UInt64(id), fromStart: offset == 0) }
            fuse_reply_buf(req, buffer.assumingMemoryBound(to: CChar.self), used)
        }
    }

    /// Looks up the entry a READDIRPLUS lists by its stored name `stored`, and the name it is
    /// shown by (nil: as stored).
    private func listedEntry(_ stored: UnsafePointer<CChar>, in parent: Inode, _ parentID: UInt64,
                             listing: NameListing?) throws(Errno) -> (FileName?, fuse_entry_param) {
        let fd = try openPath(parent.fd, stored)
        let attributes: stat
        do { attributes = try Syscall.stat(of: fd) } catch {
            Syscall.close(fd)
            throw error
        }
        let shown = shownName(stored, in: parent, listing: listing, known: (parentID, attributes))
        let name = EntryName(parent: parentID, name: shown ?? FileName(cString: stored), stored: shown.map { _ in FileName(cString: stored) })
        return (shown, try rememberEntry(pathFD: fd, name: name, in: parent, stated: attributes))
    }

    static func isDotOrDotDot(_ name: UnsafePointer<CChar>) -> Bool {
        name[0] == 0x2E && (name[1] == 0 || (name[1] == 0x2E && name[2] == 0))
    }
}
