import CFuse3

/// The libfuse low-level operations table. Each entry is a non-capturing closure that finds the
/// file system object through the request's userdata and calls the matching method.
@inline(__always)
private func from(_ req: fuse_req_t?) -> PassthroughFilesystem {
    // libfuse sets userdata for every request of the session this object was created with.
    let filesystem = Unmanaged<PassthroughFilesystem>.fromOpaque(fuse_req_userdata(req)).takeUnretainedValue()
    filesystem.requestCount.wrappingAdd(1, ordering: .relaxed)
    filesystem.wakeBoost?.noteRequest()
    if filesystem.readAheadPending.load(ordering: .relaxed) { filesystem.applyPendingReadAhead() }
    return filesystem
}

extension PassthroughFilesystem {

    static func operations() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, conn in
            guard let userdata, let conn else { return }
            Unmanaged<PassthroughFilesystem>.fromOpaque(userdata).takeUnretainedValue().configure(conn)
        }
        ops.lookup = { req, parent, name in
            guard let req, let name else { return }
            from(req).lookup(req, parent, name)
        }
        ops.forget = { req, id, count in
            from(req).forget(id, count)
            fuse_reply_none(req)
        }
        ops.forget_multi = { req, count, forgets in
            let fs = from(req)
            if let forgets {
                for item in UnsafeBufferPointer(start: forgets, count: count) {
                    fs.forget(item.ino, item.nlookup)
                }
            }
            fuse_reply_none(req)
        }
        ops.getattr = { req, id, fi in
            guard let req else { return }
            from(req).getattr(req, id, fi)
        }
        ops.setattr = { req, id, attributes, toSet, fi in
            guard let req, let attributes else { return }
            from(req).setattr(req, id, attributes, toSet, fi)
        }
        ops.access = { req, id, mask in
            guard let req else { return }
            from(req).access(req, id, mask)
        }
        ops.readlink = { req, id in
            guard let req else { return }
            from(req).readlink(req, id)
        }
        ops.statfs = { req, id in
            guard let req else { return }
            from(req).statfs(req, id)
        }
        ops.mkdir = { req, parent, name, mode in
            guard let req, let name else { return }
            from(req).mkdir(req, parent, name, mode)
        }
        ops.mknod = { req, parent, name, mode, device in
            guard let req, let name else { return }
            from(req).mknod(req, parent, name, mode, device)
        }
        ops.symlink = { req, target, parent, name in
            guard let req, let target, let name else { return }
            from(req).symlink(req, target, parent, name)
        }
        ops.link = { req, id, newParent, newName in
            guard let req, let newName else { return }
            from(req).link(req, id, newParent, newName)
        }
        ops.unlink = { req, parent, name in
            guard let req, let name else { return }
            from(req).unlink(req, parent, name)
        }
        ops.rmdir = { req, parent, name in
            guard let req, let name else { return }
            from(req).rmdir(req, parent, name)
        }
        ops.rename = { req, parent, name, newParent, newName, flags in
            guard let req, let name, let newName else { return }
            from(req).rename(req, parent, name, newParent, newName, flags)
        }
        ops.open = { req, id, fi in
            guard let req, let fi else { return }
            from(req).open(req, id, fi)
        }
        ops.create = { req, parent, name, mode, fi in
            guard let req, let name, let fi else { return }
            from(req).create(req, parent, name, mode, fi)
        }
        ops.read = { req, _, size, offset, fi in
            guard let req, let fi else { return }
            from(req).read(req, size, offset, fi)
        }
        ops.write_buf = { req, _, buffers, offset, fi in
            guard let req, let buffers, let fi else { return }
            from(req).writeBuffers(req, buffers, offset, fi)
        }
        ops.flush = { req, _, fi in
            guard let req, let fi else { return }
            from(req).flush(req, fi)
        }
        ops.release = { req, _, fi in
            guard let req, let fi else { return }
            from(req).release(req, fi)
        }
        ops.fsync = { req, _, dataOnly, fi in
            guard let req, let fi else { return }
            from(req).fsync(req, dataOnly != 0, fi)
        }
        ops.fallocate = { req, _, mode, offset, length, fi in
            guard let req, let fi else { return }
            from(req).fallocate(req, mode, offset, length, fi)
        }
        ops.lseek = { req, _, offset, whence, fi in
            guard let req, let fi else { return }
            from(req).lseek(req, offset, whence, fi)
        }
        ops.copy_file_range = { req, _, inOffset, inFI, _, outOffset, outFI, length, flags in
            guard let req, let inFI, let outFI else { return }
            from(req).copyFileRange(req, inOffset, inFI, outOffset, outFI, length, UInt32(bitPattern: flags))
        }
        ops.opendir = { req, id, fi in
            guard let req, let fi else { return }
            from(req).opendir(req, id, fi)
        }
        ops.readdir = { req, id, size, offset, fi in
            guard let req, let fi else { return }
            from(req).readdir(req, id, size, offset, fi, plus: false)
        }
        ops.readdirplus = { req, id, size, offset, fi in
            guard let req, let fi else { return }
            from(req).readdir(req, id, size, offset, fi, plus: true)
        }
        ops.releasedir = { req, _, fi in
            guard let req, let fi else { return }
            from(req).releasedir(req, fi)
        }
        ops.fsyncdir = { req, _, dataOnly, fi in
            guard let req, let fi else { return }
            from(req).fsyncdir(req, dataOnly != 0, fi)
        }
        ops.getxattr = { req, id, name, size in
            guard let req, let name else { return }
            from(req).getxattr(req, id, name, size)
        }
        ops.listxattr = { req, id, size in
            guard let req else { return }
            from(req).listxattr(req, id, size)
        }
        ops.setxattr = { req, id, name, value, size, flags in
            guard let req, let name else { return }
            from(req).setxattr(req, id, name, value, size, flags)
        }
        ops.removexattr = { req, id, name in
            guard let req, let name else { return }
            from(req).removexattr(req, id, name)
        }
        return ops
    }
}
