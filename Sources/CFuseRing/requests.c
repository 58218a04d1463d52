// What a request asks for, read from its bytes: the set-ID flags libfuse 3.14 does not pass on,
// and whether serving it may take long.
#include "internal.h"

#include <fcntl.h>
#include <string.h>

// A 32-bit field of the operation's header (the request's first argument), or 0 when the
// request is too short to hold that header.
static uint32_t header_field(const char *arguments, size_t available, size_t header_size, size_t offset) {
    uint32_t value = 0;
    if (available >= header_size) memcpy(&value, arguments + offset, sizeof(value));
    return value;
}

#define HEADER_FIELD(type, field) header_field(arguments, available, sizeof(struct type), offsetof(struct type, field))

// Whether a request (laid out as /dev/fuse delivers it) asks the file system to clear set-user-ID
// and set-group-ID (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID).
int request_kills_suidgid_flag(const void *request, size_t length) {
    if (length < sizeof(struct fuse_in_header)) return 0;
    struct fuse_in_header in;
    memcpy(&in, request, sizeof(in));
    const char *arguments = (const char *)request + sizeof(in);
    size_t available = length - sizeof(in);
    switch (in.opcode) {
    case FUSE_WRITE:
        return (HEADER_FIELD(fuse_write_in, write_flags) & FUSE_WRITE_KILL_SUIDGID) != 0;
    case FUSE_SETATTR:
        return (HEADER_FIELD(fuse_setattr_in, valid) & FATTR_KILL_SUIDGID) != 0;
    case FUSE_OPEN:
        return (HEADER_FIELD(fuse_open_in, open_flags) & FUSE_OPEN_KILL_SUIDGID) != 0;
    default:
        return 0;   // CREATE makes a new file, which keeps the set-ID bits it is made with
    }
}

// The prefix of the mount's own attributes: setting or removing `user.custody.owner` re-protects
// a file (a synced copy) or a whole directory tree.
static const char custody_attributes[] = "user.custody.";

// Requests served on a ring's thread hold up every request after them from the same CPU, so the
// ones that may wait go to the workers (REQUEST_WAITS): those that wait for the disk by their
// nature (fsync, allocation, copies, truncation, which waits for the truncated pages'
// write-back), those that move a lot of data (on a slow or throttled store a large write or read
// takes as long as the store needs), a close where the store reports errors at close (served
// FLUSH: network file systems), blocking locks, and re-protection.
//
// Requests that change the store (REQUEST_CHANGES: a create, a rename, a small write, a
// timestamp …) take microseconds on a store that keeps up, but on one that does not they wait
// for it too: a journalling file system makes each change wait for room in its journal, which
// only the slow write-back frees. They are served where they arrive until the store shows itself
// slow, and then by workers (`store_is_slow`). What only reads (lookups, attributes, directory
// listings, small reads) is served where it arrived.
int request_kind(const struct fuse_in_header *in, const void *operation, size_t operation_size,
                 const char *payload, size_t payload_size) {
    const char *arguments = operation;
    size_t available = operation_size;
    switch (in->opcode) {
    case FUSE_FSYNC:
    case FUSE_FSYNCDIR:
    case FUSE_FALLOCATE:
    case FUSE_COPY_FILE_RANGE:
    case FUSE_FLUSH:
    case FUSE_SETLKW:
        return REQUEST_WAITS;
    case FUSE_SETATTR:
        return (HEADER_FIELD(fuse_setattr_in, valid) & FATTR_SIZE) ? REQUEST_WAITS : REQUEST_CHANGES;
    case FUSE_OPEN:
        return (HEADER_FIELD(fuse_open_in, flags) & O_TRUNC) ? REQUEST_WAITS : REQUEST_QUICK;
    case FUSE_READ:
        return HEADER_FIELD(fuse_read_in, size) >= LARGE_IO ? REQUEST_WAITS : REQUEST_QUICK;
    case FUSE_WRITE:
        return HEADER_FIELD(fuse_write_in, size) >= LARGE_IO ? REQUEST_WAITS : REQUEST_CHANGES;
    case FUSE_SETXATTR:
    case FUSE_REMOVEXATTR:
        if (payload_size >= sizeof(custody_attributes) - 1 &&
            memcmp(payload, custody_attributes, sizeof(custody_attributes) - 1) == 0) return REQUEST_WAITS;
        return REQUEST_CHANGES;
    case FUSE_CREATE:
    case FUSE_MKNOD:
    case FUSE_MKDIR:
    case FUSE_SYMLINK:
    case FUSE_LINK:
    case FUSE_UNLINK:
    case FUSE_RMDIR:
    case FUSE_RENAME:
    case FUSE_RENAME2:
    case FUSE_RELEASE:   // the last close of a file written lets the store allocate its blocks
        return REQUEST_CHANGES;
    default:
        return REQUEST_QUICK;
    }
}

// How long the store took: a change, or a large read or write, that took SLOW_NANOSECONDS or
// more (wherever it was served) marks the store slow for SLOW_STORE_SECONDS.
int request_is_timed(const custody_fuse_entry *entry) {
    if (entry->kind == REQUEST_CHANGES) return 1;
    return entry->kind == REQUEST_WAITS && (entry->opcode == FUSE_READ || entry->opcode == FUSE_WRITE);
}

#undef HEADER_FIELD
