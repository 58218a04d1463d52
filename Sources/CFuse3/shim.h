// libfuse3 low-level API for Swift. FUSE_USE_VERSION 312: fuse_session_loop_mt takes an opaque
// fuse_loop_config. Function-like macros are wrapped here because Swift cannot see them.
#ifndef CUSTODY_CFUSE3_SHIM_H
#define CUSTODY_CFUSE3_SHIM_H

#define FUSE_USE_VERSION 312
#include <stddef.h>
#include <fuse3/fuse_lowlevel.h>

/// Copies a write request's buffers (memory or a pipe) into `fd` at `pos`.
static inline ssize_t custody_copy_bufvec_to_fd(struct fuse_bufvec *in, int fd, off_t pos) {
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
    out.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    out.buf[0].fd = fd;
    out.buf[0].pos = pos;
    return fuse_buf_copy(&out, in, (enum fuse_buf_copy_flags)0);
}

/// Copies a write request's buffers into memory.
static inline ssize_t custody_copy_bufvec_to_memory(struct fuse_bufvec *in, void *mem, size_t size) {
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(size);
    out.buf[0].mem = mem;
    return fuse_buf_copy(&out, in, (enum fuse_buf_copy_flags)0);
}

/// The bytes of a write request that libfuse received into its own memory (one buffer, none of it
/// consumed yet), or NULL when they are in a pipe or spread over several buffers.
static inline void *custody_bufvec_memory(const struct fuse_bufvec *in) {
    if (in->count != 1 || in->idx != 0 || in->off != 0) return NULL;
    if (in->buf[0].flags & FUSE_BUF_IS_FD) return NULL;
    return in->buf[0].mem;
}

static const int custody_SET_ATTR_MODE = FUSE_SET_ATTR_MODE;
static const int custody_SET_ATTR_UID = FUSE_SET_ATTR_UID;
static const int custody_SET_ATTR_GID = FUSE_SET_ATTR_GID;
static const int custody_SET_ATTR_SIZE = FUSE_SET_ATTR_SIZE;
static const int custody_SET_ATTR_ATIME = FUSE_SET_ATTR_ATIME;
static const int custody_SET_ATTR_MTIME = FUSE_SET_ATTR_MTIME;
static const int custody_SET_ATTR_ATIME_NOW = FUSE_SET_ATTR_ATIME_NOW;
static const int custody_SET_ATTR_MTIME_NOW = FUSE_SET_ATTR_MTIME_NOW;

#endif
