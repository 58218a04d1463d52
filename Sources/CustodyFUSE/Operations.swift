import CFuse3

/// The libfuse low-level operations table. Each entry is a non-capturing closure that finds the
/// file system object through the request's userdata and calls the matching method.
@inline(__always)
private func from(_ req: fuse_req_t?) -> MountFileSystem {
    // libfuse sets userdata for every request of the session this object was created with.
    let filesystem = Unmanaged<MountFileSystem>.fromOpaque(fuse_req_userdata(req)).takeUnretainedValue()
    filesystem.requestCount.wrappingAdd(1, ordering: .relaxed)
    filesystem.wakeBoost?.noteRequest()
    if filesystem.readAheadPending.load(ordering: .relaxed) { filesystem.applyPendingReadAhead() }
    return filesystem
}

extension MountFileSystem {

    static func operations() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, conn in
            guard let userdata, let conn else { return }
            Unmanaged<MountFileSystem>.fromOpaque(userdata).takeUnretainedValue().configure(conn)
        }
        ops.lookup = { req, parent, name in
            guard let req, let name else { return }
            from(req).serve(.lookup) { $0.lookup(req, parent, name) }
        }
        ops.forget = { req, id, count in
            from(req).serve(.forget) {
                $0.forget(id, count)
                fuse_reply_none(req)
            }
        }
        ops.forget_multi = { req, count, forgets in
            from(req).serve(.forget) { fs in
                if let forgets {
                    for item in UnsafeBufferPointer(start: forgets, count: count) {
                        fs.forget(item.ino, item.nlookup)
                    }
                }
                fuse_reply_none(req)
            }
        }
        ops.getattr = { req, id, fi in
            guard let req else { return }
            from(req).serve(.getattr) { $0.getattr(req, id, fi) }
        }
        ops.setattr = { req, id, attributes, toSet, fi in
            guard let req, let attributes else { return }
            from(req).serve(.setattr) { $0.setattr(req, id, attributes, toSet, fi) }
        }
        ops.access = { req, id, mask in
            guard let req else { return }
            from(req).serve(.access) { $0.access(req, id, mask) }
        }
        ops.readlink = { req, id in
            guard let req else { return }
            from(req).serve(.readlink) { $0.readlink(req, id) }
        }
        ops.statfs = { req, id in
            guard let req else { return }
            from(req).serve(.statfs) { $0.statfs(req, id) }
        }
        ops.mkdir = { req, parent, name, mode in
            guard let req, let name else { return }
            from(req).serve(.mkdir) { $0.mkdir(req, parent, name, mode) }
        }
        ops.mknod = { req, parent, name, mode, device in
            guard let req, let name else { return }
            from(req).serve(.mknod) { $0.mknod(req, parent, name, mode, device) }
        }
        ops.symlink = { req, target, parent, name in
            guard let req, let target, let name else { return }
            from(req).serve(.symlink) { $0.symlink(req, target, parent, name) }
        }
        ops.link = { req, id, newParent, newName in
            guard let req, let newName else { return }
            from(req).serve(.link) { $0.link(req, id, newParent, newName) }
        }
        ops.unlink = { req, parent, name in
            guard let req, let name else { return }
            from(req).serve(.unlink) { $0.unlink(req, parent, name) }
        }
        ops.rmdir = { req, parent, name in
            guard let req, let name else { return }
            from(req).serve(.rmdir) { $0.rmdir(req, parent, name) }
        }
        ops.rename = { req, parent, name, newParent, newName, flags in
            guard let req, let name, let newName else { return }
            from(req).serve(.rename) { $0.rename(req, parent, name, newParent, newName, flags) }
        }
        ops.open = { req, id, fi in
            guard let req, let fi else { return }
            from(req).serve(.open) { $0.open(req, id, fi) }
        }
        ops.create = { req, parent, name, mode, fi in
            guard let req, let name, let fi else { return }
            from(req).serve(.create) { $0.create(req, parent, name, mode, fi) }
        }
        ops.read = { req, _, size, offset, fi in
            guard let req, let fi else { return }
            from(req).serve(.read) { $0.read(req, size, offset, fi) }
        }
        ops.write_buf = { req, _, buffers, offset, fi in
            guard let req, let buffers, let fi else { return }
            from(req).serve(.write) { $0.writeBuffers(req, buffers, offset, fi) }
        }
        ops.flush = { req, _, fi in
            guard let req, let fi else { return }
            from(req).serve(.flush) { $0.flush(req, fi) }
        }
        ops.release = { req, _, fi in
            guard let req, let fi else { return }
            from(req).serve(.release) { $0.release(req, fi) }
        }
        ops.fsync = { req, _, dataOnly, fi in
            guard let req, let fi else { return }
            from(req).serve(.fsync) { $0.fsync(req, dataOnly != 0, fi) }
        }
        ops.fallocate = { req, _, mode, offset, length, fi in
            guard let req, let fi else { return }
            from(req).serve(.fallocate) { $0.fallocate(req, mode, offset, length, fi) }
        }
        ops.lseek = { req, _, offset, whence, fi in
            guard let req, let fi else { return }
            from(req).serve(.lseek) { $0.lseek(req, offset, whence, fi) }
        }
        ops.copy_file_range = { req, _, inOffset, inFI, _, outOffset, outFI, length, flags in
            guard let req, let inFI, let outFI else { return }
            from(req).serve(.copyFileRange) { $0.copyFileRange(req, inOffset, inFI, outOffset, outFI, length, UInt32(bitPattern: flags)) }
        }
        ops.opendir = { req, id, fi in
            guard let req, let fi else { return }
            from(req).serve(.opendir) { $0.opendir(req, id, fi) }
        }
        ops.readdir = { req, id, size, offset, fi in
            guard let req, let fi else { return }
            from(req).serve(.readdir) { $0.readdir(req, id, size, offset, fi, plus: false) }
        }
        ops.readdirplus = { req, id, size, offset, fi in
            guard let req, let fi else { return }
            from(req).serve(.readdirplus) { $0.readdir(req, id, size, offset, fi, plus: true) }
        }
        ops.releasedir = { req, _, fi in
            guard let req, let fi else { return }
            from(req).serve(.releasedir) { $0.releasedir(req, fi) }
        }
        ops.fsyncdir = { req, _, dataOnly, fi in
            guard let req, let fi else { return }
            from(req).serve(.fsyncdir) { $0.fsyncdir(req, dataOnly != 0, fi) }
        }
        ops.getxattr = { req, id, name, size in
            guard let req, let name else { return }
            from(req).serve(.getxattr) { $0.getxattr(req, id, name, size) }
        }
        ops.listxattr = { req, id, size in
            guard let req else { return }
            from(req).serve(.listxattr) { $0.listxattr(req, id, size) }
        }
        ops.setxattr = { req, id, name, value, size, flags in
            guard let req, let name else { return }
            from(req).serve(.setxattr) { $0.setxattr(req, id, name, value, size, flags) }
        }
        ops.removexattr = { req, id, name in
            guard let req, let name else { return }
            from(req).serve(.removexattr) { $0.removexattr(req, id, name) }
        }
        return ops
    }
}
