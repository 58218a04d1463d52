import CFuse3
import CFuseRing
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// A file's content: READ and WRITE (plain and encrypted), FLUSH, RELEASE, FSYNC, FALLOCATE,
/// LSEEK and COPY_FILE_RANGE, with the buffers reads and writes use.
extension MountFileSystem {
    func read(_ req: fuse_req_t, _ size: Int, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        let content: ProtectedContent
        do throws(Errno) {
            try checkGrant(file, write: false)
            guard let live = try liveContent(file) else {
                readPlain(req, file.fd, size, offset)
                return
            }
            content = live
        } catch {
            replyError(req, error.rawValue)
            return
        }
        func answer(from buffer: UnsafeMutableRawBufferPointer) {
            do throws(FormatError) {
                let count = try content.file.read(into: buffer, at: UInt64(offset))
                metrics?.bytesDecrypted.increment(by: Int64(count))
                fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), count)
            } catch {
                log("read of an encrypted file failed: \(error)")
                noteTampering(error, of: file.inode, owner: content.lease.identity.folded, content: content)
                replyError(req, error.errnoValue.rawValue)
            }
        }
        // On a request ring the plaintext goes straight into the ring entry (zeroed once sent).
        if let buffer = ringAnswerBuffer(size, sensitive: true) { return answer(from: buffer) }
        Self.plaintextBuffers.withBuffer(byteCount: size) { answer(from: $0) }
    }

    /// The request ring entry's payload, where a READ's answer is built and then sent without a
    /// copy; nil when the request did not come from a ring (see `RequestRings`).
    @inline(__always)
    func ringAnswerBuffer(_ size: Int, sensitive: Bool) -> UnsafeMutableRawBufferPointer? {
        guard requestRings != nil, let base = custody_fuse_ring_borrow_payload(size, sensitive ? 1 : 0) else { return nil }
        return UnsafeMutableRawBufferPointer(start: base, count: size)
    }

    /// A large plain read that took longer than this waited for the disk (1 MiB from the page
    /// cache takes about 0.2 ms here).
    static let diskWaitNanoseconds: Int64 = 1_000_000

    /// Buffers for reads of plain files (up to 1 MiB), kept for reuse; not zeroed, as the same
    /// bytes lie unencrypted in the backing file.
    static let passthroughBuffers = BufferPool(capacity: 1 << 20, keep: 2, zeroesOnReturn: false, smallLimit: 64 << 10)

    /// A plain file's bytes are read into a kept buffer and sent from there. Handing libfuse the
    /// descriptor (`fuse_reply_data`) would splice only replies of 8 KiB or more that a pipe holds
    /// whole, never a 1 MiB read without `CAP_SYS_RESOURCE`, and otherwise reads into memory
    /// allocated for each request: 256 fresh pages per MiB (see `docs/performance.md`).
    func readPlain(_ req: fuse_req_t, _ fd: Int32, _ size: Int, _ offset: off_t) {
        func answer(from buffer: UnsafeMutableRawBufferPointer) {
            do throws(Errno) {
                let large = size >= ProtectedFile.prefetchThreshold
                let start = large ? monotonicNanoseconds() : 0
                let count = try buffer.baseAddress.map { (base) throws(Errno) in try Syscall.preadAll(fd, base, size, Int64(offset)) } ?? 0
                let waited = large && monotonicNanoseconds() - start > Self.diskWaitNanoseconds
                fuse_reply_buf(req, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), count)
                // A large read that waited for the disk is part of a stream the backing file's
                // read-ahead is not keeping up with (the kernel's reads of the mount reach it
                // from two request threads, out of order, and it loses track): have the disk
                // fetch the next two stretches while the kernel takes this answer. A read the
                // read-ahead served from memory asks for nothing more.
                if waited, count == size {
                    Syscall.willNeed(fd, offset: Int64(offset) + Int64(size), length: 2 * Int64(size))
                }
            } catch {
                replyError(req, error.rawValue)
            }
        }
        if let buffer = ringAnswerBuffer(size, sensitive: false) { return answer(from: buffer) }
        Self.passthroughBuffers.withBuffer(byteCount: size) { answer(from: $0) }
    }

    /// Large writes come from the kernel's write-back of a file being streamed: start the backing
    /// file's own write-back at once, so that the disk works while more data arrives instead of
    /// all at the final fsync. Small writes (databases rewriting pages) wait for the kernel's
    /// usual write-back.
    static let writeBehindThreshold = 256 * 1024

    /// Starts the write-back before the WRITE is answered. Starting it is not always quick: a
    /// journalling store takes room in its journal first, which on a slow store waits for the
    /// store. Before the answer, that wait counts against the kernel's limit of requests nobody
    /// waits for (`MountOptions.mostBackgroundRequests`), so the write-back of one streamed file
    /// can keep at most that many threads (or ring entries) and never all of them; after the
    /// answer it counted against nothing, and with /dev/fuse the kernel sent WRITE after WRITE
    /// until every thread waited in write-back and another user's `stat` waited seconds for one.
    func writeBehind(_ fd: Int32, written: Int) {
        if written >= Self.writeBehindThreshold { Syscall.startWriteback(fd) }
    }

    /// Plaintext of one encrypted read or write (up to 1 MiB), kept for reuse and zeroed after
    /// each use (see `BufferPool`).
    static let plaintextBuffers = BufferPool(capacity: 1 << 20, keep: 2, zeroesOnReturn: true, smallLimit: 64 << 10)

    func writeBuffers(_ req: fuse_req_t, _ buffers: UnsafeMutablePointer<fuse_bufvec>, _ offset: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        let content: ProtectedContent
        do throws(Errno) {
            try checkGrant(file, write: true)
            // A write by a process without CAP_FSETID: through the page cache the kernel sends
            // it straight away with this flag, and direct writes always carry it.
            // A WRITE's answer carries no attributes: the kernel would show the old mode until
            // its attributes expire.
            if requestKillsSetIDBits(), try clearSetIDBits(file.backingFD), let inode = file.inode,
               let id = inodes.id(device: inode.device, number: inode.number) {
                storageEdges.invalidateAttributes(id)
            }
            guard let live = try liveContent(file) else {
                if let refused = refusedGap(file, at: offset) {
                    replyError(req, refused)
                    return
                }
                let written = writingAsOwner(of: file.inode) { custody_copy_bufvec_to_fd(buffers, file.fd, offset) }
                if written < 0 {
                    replyError(req, Int32(-written))
                    settleAfterFailedPlainWrite(file, at: offset, code: Int32(-written))
                    writeFailed(file.inode)
                } else {
                    writeBehind(file.fd, written: Int(written))
                    fuse_reply_write(req, Int(written))
                }
                return
            }
            content = live
        } catch {
            // Often a write-back from the kernel's cache: the writer sees it later, as EIO from
            // another call (utimensat, fsync, close), so the log is where the cause shows.
            log("write to \(file.inode.map { mountRelativePath(of: $0) } ?? "a file") refused: \(error)")
            replyError(req, error.rawValue)
            writeFailed(file.inode)
            return
        }
        let size = fuse_buf_size(buffers)
        if let memory = custody_bufvec_memory(buffers) {
            // libfuse read the request into its own buffer: encrypt straight from it, then zero it
            // as the pooled buffers are. Copying it into a pooled buffer first cost a copy per
            // request, and fresh pages whenever more writes were in flight than the pool keeps
            // buffers: 21,000–28,000 page faults per 512 MiB written, against about 2,400 now in a
            // fresh mount's first such write (the pools filling) and a few dozen after.
            writeEncrypted(content, UnsafeRawBufferPointer(start: memory, count: size), offset, req, file.inode)
            memory.initializeMemory(as: UInt8.self, repeating: 0, count: size)
            return
        }
        Self.plaintextBuffers.withBuffer(byteCount: size) { buffer in
            let copied = custody_copy_bufvec_to_memory(buffers, buffer.baseAddress, size)
            guard copied >= 0 else {
                replyError(req, Int32(-copied))
                return
            }
            writeEncrypted(content, UnsafeRawBufferPointer(rebasing: buffer[0..<Int(copied)]), offset, req, file.inode)
        }
    }

    func writeEncrypted(_ content: ProtectedContent, _ data: UnsafeRawBufferPointer, _ offset: off_t, _ req: fuse_req_t, _ inode: Inode?) {
        guard !content.readOnly else {
            replyError(req, EROFS)
            return
        }
        do throws(FormatError) {
            try writingAsOwner(of: inode) { () throws(FormatError) in
                try content.file.write(data, at: UInt64(offset))
            }
            metrics?.bytesEncrypted.increment(by: Int64(data.count))
            writeBehind(content.fd, written: data.count)
            fuse_reply_write(req, data.count)
        } catch {
            log("write to an encrypted file failed: \(error)")
            noteTampering(error, of: inode, owner: content.lease.identity.folded, content: content)
            replyError(req, error.errnoValue.rawValue)
            // The file stays a clean prefix of what was written (see ProtectedFile).
            content.file.settleAfterFailedWrite(error)
            writeFailed(inode)
        }
    }

    /// After a failed write the kernel's cache and size are ahead of the disk: drop them now,
    /// and again when the file is flushed (pages written meanwhile may have failed too).
    func writeFailed(_ inode: Inode?) {
        guard let inode, let id = inodes.id(device: inode.device, number: inode.number) else { return }
        inode.protectionState.withLock { $0.writeFailed = true }
        storageEdges.invalidate(id)
    }

    /// At flush and fsync: if a write of the file failed since the last time, drop the kernel's
    /// cache of it once more (after the reply: invalidation waits for write-back).
    func afterFlush(_ inode: Inode?) {
        guard let inode, inode.protectionState.withLock({ state in defer { state.writeFailed = false }; return state.writeFailed }),
              let id = inodes.id(device: inode.device, number: inode.number) else { return }
        storageEdges.invalidate(id)
    }

    func flush(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard servesFlush else {
            // The kernel has written the cached pages back before it asks (their errors reach
            // the caller's close without us); from now on it does not ask. The handle is taken
            // before the answer: once answered, the RELEASE may come and end it.
            let inode = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self)?.inode
            replyError(req, ENOSYS)
            afterFlush(inode)
            return
        }
        // Closing a duplicate reports deferred write errors of the backing file system (as NFS does).
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            let duplicate = try Syscall.dup(file.backingFD)
            let result = Glibc.close(duplicate)
            replyError(req, result == -1 ? errno : 0)
            afterFlush(file.inode)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func release(_ req: fuse_req_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        if fi.pointee.fh != 0 {
            // Without FLUSH this is the first word of the last close (after the write-back).
            if !servesFlush { afterFlush(HandleBox.borrow(fi.pointee.fh, as: OpenFile.self)?.inode) }
            releaseHandle(fi.pointee.fh)
        }
        replyError(req, 0)
    }

    func fsync(_ req: fuse_req_t, _ dataOnly: Bool, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if dataOnly { try Syscall.fdatasync(file.backingFD) } else { try Syscall.fsync(file.backingFD) }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
        afterFlush(file.inode)
    }

    func fallocate(_ req: fuse_req_t, _ mode: Int32, _ offset: off_t, _ length: off_t, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if let content = try liveContent(file) {
                // Encrypted: allocation means the size; holes cannot be punched into ciphertext.
                guard mode & ~Linux.FALLOC_FL_KEEP_SIZE == 0 else { throw Errno.notSupported }
                let end = UInt64(offset) + UInt64(length)
                try content.requireWritable()
                if mode & Linux.FALLOC_FL_KEEP_SIZE == 0, end > content.file.size {
                    try asOwner(of: file.inode) { () throws(Errno) in
                        try asErrno { () throws(FormatError) in try content.file.truncate(to: end) }
                    }
                }
            } else {
                try asOwner(of: file.inode) { () throws(Errno) in try Syscall.fallocate(file.fd, mode, Int64(offset), Int64(length)) }
            }
            replyError(req, 0)
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func lseek(_ req: fuse_req_t, _ offset: off_t, _ whence: Int32, _ fi: UnsafeMutablePointer<fuse_file_info>) {
        guard let file = HandleBox.borrow(fi.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        do throws(Errno) {
            if let content = file.content {
                // Encrypted files report all of their content as data (holes are not exposed).
                let size = Int64(content.file.size)
                guard offset >= 0, Int64(offset) < size || (whence != Linux.SEEK_DATA && whence != Linux.SEEK_HOLE) else { throw Errno.noSuchAddressOrDevice }
                switch whence {
                case Linux.SEEK_DATA: fuse_reply_lseek(req, offset)
                case Linux.SEEK_HOLE: fuse_reply_lseek(req, off_t(size))
                default: throw Errno.invalidArgument
                }
                return
            }
            fuse_reply_lseek(req, off_t(try Syscall.lseek(file.fd, Int64(offset), whence)))
        } catch {
            replyError(req, error.rawValue)
        }
    }

    func copyFileRange(_ req: fuse_req_t, _ inOffset: off_t, _ inFI: UnsafeMutablePointer<fuse_file_info>, _ outOffset: off_t, _ outFI: UnsafeMutablePointer<fuse_file_info>, _ length: Int, _ flags: UInt32) {
        guard let input = HandleBox.borrow(inFI.pointee.fh, as: OpenFile.self),
              let output = HandleBox.borrow(outFI.pointee.fh, as: OpenFile.self) else {
            replyError(req, EBADF)
            return
        }
        // Ciphertext cannot be copied as bytes: the kernel falls back to reading and writing.
        guard input.content == nil, output.content == nil else {
            replyError(req, EOPNOTSUPP)
            return
        }
        do throws(Errno) {
            try checkGrant(input, write: false)
            try checkGrant(output, write: true)
            var from = Int64(inOffset)
            var to = Int64(outOffset)
            let copied = try asOwner(of: output.inode) { () throws(Errno) in try Syscall.copyFileRange(input.fd, &from, output.fd, &to, length, flags) }
            fuse_reply_write(req, copied)
        } catch {
            replyError(req, error.rawValue)
        }
    }
}
