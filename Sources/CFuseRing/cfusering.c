// FUSE over io_uring for a libfuse 3.14 session: see cfusering.h.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include "cfusering.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <limits.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

// The FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, protocol 7.42, Linux 6.14); Debian 12's
// kernel headers predate it.
#define RING_FLAG2_OVER_IO_URING (1u << (41 - 32))
#define RING_CMD_REGISTER 1u
#define RING_CMD_COMMIT_AND_FETCH 2u
#define RING_HEADER_AREA 128

struct ring_entry_in_out {
    uint64_t flags;
    uint64_t commit_id;
    uint32_t payload_sz;
    uint32_t padding;
    uint64_t reserved;
};

struct ring_request_header {
    char in_out[RING_HEADER_AREA];   // fuse_in_header in, fuse_out_header out
    char op_in[RING_HEADER_AREA];    // the operation's own header (its first argument)
    struct ring_entry_in_out entry;
};

struct ring_command {   // in the SQE's 80-byte command area
    uint64_t flags;
    uint64_t commit_id;
    uint16_t qid;
    uint8_t padding[6];
};

_Static_assert(sizeof(struct ring_request_header) == 288, "fuse_uring_req_header");
_Static_assert(sizeof(struct ring_command) == 24, "fuse_uring_cmd_req");

enum { TAG_ENTRY = 1, TAG_WAKE = 2 };

// Room in front of the payload for the request's two headers, so that a request is contiguous
// (as read from /dev/fuse) without copying its payload.
#define HEADROOM 4096
#define MAX_RINGS 1024
#define MAX_SIBLINGS 15

struct custody_fuse_transport {
    void *key;
    int fd;
    _Atomic uint64_t init_unique;    // INIT read and not answered yet (0: none)
    _Atomic int kernel_offers_rings; // the kernel's INIT carried FUSE_OVER_IO_URING
    _Atomic int offer_rings;
    _Atomic int rings_offered;
    _Atomic int kernel_offers_killpriv; // the kernel's INIT carried FUSE_HANDLE_KILLPRIV_V2
    _Atomic uint32_t max_write;
    _Atomic uint32_t max_pages;
    pthread_mutex_t lock;            // the ring list and every ring's buffers
    custody_fuse_ring *rings[MAX_RINGS];
    int ring_count;
    // Buffers outlive their rings: the kernel may write a request into a registered buffer
    // until the connection is gone, so they are unmapped only when the transport is removed.
    void *mappings[2 * MAX_RINGS];
    size_t mapping_sizes[2 * MAX_RINGS];
    int mapping_count;
    custody_fuse_transport *next;
};

struct custody_fuse_ring {
    struct io_uring uring;
    custody_fuse_transport *transport;
    unsigned qid;
    int event_fd;
    struct ring_request_header *header;
    char *payload;
    size_t payload_size;
    struct iovec iov[2];
    uint64_t commit_id;
    uint32_t request_payload;    // bytes of the request in the payload (0: its arguments are all in the headroom)
    uint32_t opcode;             // of the request being served
    size_t read_answer;          // bytes of file content the last answer left in the payload
    int borrowed;                // the handler built its answer in the payload (`borrow_payload`)
    // An answer that cannot go into the payload yet (the handler may still read the request
    // there, or another thread answered): kept here until the commit.
    char *stash;
    size_t stash_length;
    int stashed;
    _Atomic uint64_t inflight;   // unique of the request being served (0: none)
    _Atomic uint64_t waiting;    // unique of a request taken but not started yet (0: none)
    // The other rings of the same queue (found at the first request), for starting requests in
    // the order the kernel queued them.
    custody_fuse_ring *siblings[MAX_SIBLINGS];
    int sibling_count;
    int siblings_known;
    _Atomic int async_answer;    // an answer written by another thread waits to be committed
    _Atomic int stopping;
    int answered;
};

static pthread_rwlock_t transports_lock = PTHREAD_RWLOCK_INITIALIZER;
static custody_fuse_transport *transports;
static _Thread_local custody_fuse_ring *current_ring;

static void *map_buffer(custody_fuse_transport *t, size_t size);

static custody_fuse_transport *find_transport(void *key) {
    custody_fuse_transport *found = NULL;
    pthread_rwlock_rdlock(&transports_lock);
    for (custody_fuse_transport *t = transports; t; t = t->next) {
        if (t->key == key) { found = t; break; }
    }
    pthread_rwlock_unlock(&transports_lock);
    return found;
}

// MARK: answers

static void queue_commit(custody_fuse_ring *ring) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->uring);
    if (!sqe) {   // the queue holds at most one commit and the poll: never full
        io_uring_submit(&ring->uring);
        sqe = io_uring_get_sqe(&ring->uring);
        if (!sqe) return;
    }
    memset(sqe, 0, 2 * sizeof(*sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = ring->transport->fd;
    sqe->cmd_op = RING_CMD_COMMIT_AND_FETCH;
    sqe->user_data = TAG_ENTRY;
    struct ring_command command = { .commit_id = ring->commit_id, .qid = (uint16_t)ring->qid };
    memcpy(sqe->cmd, &command, sizeof(command));
}

// Takes libfuse's answer (out header, then data). The data goes straight into the payload when
// the request left it empty (its arguments are all in the headroom, as for READ), else into the
// stash, copied into the payload at the commit: until the handler returns, the payload still
// holds the request (a write's data, which the handler zeroes after answering). `own`: on the
// ring's thread, which commits when the handler returns; otherwise that thread is woken to commit.
static ssize_t answer(custody_fuse_ring *ring, const struct iovec *iov, int count, int own) {
    struct fuse_out_header out;
    memcpy(&out, iov[0].iov_base, sizeof(out));
    size_t total = 0;
    for (int i = 1; i < count; i++) total += iov[i].iov_len;
    if (out.error || total > ring->payload_size) {   // larger than any request allows: refuse it
        if (!out.error) out.error = -EIO;
        total = 0;
    }
    int direct = own && ring->request_payload == 0;
    if (!direct && total > 0 && !ring->stash) {
        ring->stash = map_buffer(ring->transport, ring->payload_size);
        if (!ring->stash) { out.error = -ENOMEM; total = 0; }
    }
    char *to = direct ? ring->payload : ring->stash;
    size_t at = 0;
    for (int i = 1; i < count && at < total; i++) {
        size_t n = iov[i].iov_len;
        if (n && iov[i].iov_base != to + at) memmove(to + at, iov[i].iov_base, n);
        at += n;
    }
    // A READ answer copied in from elsewhere may be an encrypted file's plaintext: zeroed later.
    // One built in place says itself whether it is (`custody_fuse_ring_borrow_payload`).
    if (direct && ring->opcode == FUSE_READ && !ring->borrowed && total > ring->read_answer) ring->read_answer = total;
    ring->stash_length = direct ? 0 : total;
    ring->stashed = !direct && total > 0;
    out.len = (uint32_t)(sizeof(out) + total);
    memcpy(ring->header->in_out, &out, sizeof(out));
    ring->header->entry.payload_sz = (uint32_t)total;
    atomic_store_explicit(&ring->inflight, 0, memory_order_release);
    if (own) {
        // Committed when the handler returns (with the next wait), not now: committing hands the
        // entry's buffers to the next request at once.
        queue_commit(ring);
        ring->answered = 1;
    } else {
        atomic_store(&ring->async_answer, 1);
        eventfd_write(ring->event_fd, 1);
    }
    return (ssize_t)out.len;
}

// Before a commit goes out: a stashed answer moves into the payload.
static void unstash(custody_fuse_ring *ring) {
    if (!ring->stashed) return;
    memcpy(ring->payload, ring->stash, ring->stash_length);
    ring->stashed = 0;
}

// MARK: kill flags

// Whether the request this thread is serving asks the file system to clear set-user-ID and
// set-group-ID (FUSE_WRITE_KILL_SUIDGID, FATTR_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID). libfuse
// 3.14 does not pass these on, so they are read here from the request as it arrives.
static __thread int request_kills_suidgid;

int custody_fuse_request_kills_suidgid(void) {
    return request_kills_suidgid;
}

// A 32-bit field of the operation's header (the request's first argument), or 0 when the
// request is too short to hold that header.
static uint32_t header_field(const char *arguments, size_t available, size_t header_size, size_t offset) {
    uint32_t value = 0;
    if (available >= header_size) memcpy(&value, arguments + offset, sizeof(value));
    return value;
}

#define HEADER_FIELD(type, field) header_field(arguments, available, sizeof(struct type), offsetof(struct type, field))

static void note_request(const void *buffer, size_t length) {
    request_kills_suidgid = 0;
    if (length < sizeof(struct fuse_in_header)) return;
    struct fuse_in_header in;
    memcpy(&in, buffer, sizeof(in));
    const char *arguments = (const char *)buffer + sizeof(in);
    size_t available = length - sizeof(in);
    switch (in.opcode) {
    case FUSE_WRITE:
        request_kills_suidgid = (HEADER_FIELD(fuse_write_in, write_flags) & FUSE_WRITE_KILL_SUIDGID) != 0;
        break;
    case FUSE_SETATTR:
        request_kills_suidgid = (HEADER_FIELD(fuse_setattr_in, valid) & FATTR_KILL_SUIDGID) != 0;
        break;
    case FUSE_OPEN:
        request_kills_suidgid = (HEADER_FIELD(fuse_open_in, open_flags) & FUSE_OPEN_KILL_SUIDGID) != 0;
        break;
    default:
        break;   // CREATE makes a new file, which keeps the set-ID bits it is made with
    }
}

#undef HEADER_FIELD

// An answer from a thread that does not serve the ring: find the ring waiting for it.
static int answer_elsewhere(custody_fuse_transport *t, uint64_t unique, const struct iovec *iov, int count) {
    int done = 0;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->ring_count; i++) {
        custody_fuse_ring *ring = t->rings[i];
        if (ring && atomic_load(&ring->inflight) == unique) {
            answer(ring, iov, count, 0);
            done = 1;
            break;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return done;
}

// Adds FUSE_OVER_IO_URING to libfuse's INIT answer when rings were offered, and notes the sizes
// the kernel will size ring requests by.
static ssize_t write_init_answer(int fd, custody_fuse_transport *t, const struct iovec *iov, int count) {
    if (count != 2 || iov[1].iov_len < offsetof(struct fuse_init_out, flags2) + sizeof(uint32_t)) {
        return writev(fd, iov, count);
    }
    struct fuse_init_out init;
    memset(&init, 0, sizeof(init));
    size_t size = iov[1].iov_len < sizeof(init) ? iov[1].iov_len : sizeof(init);
    memcpy(&init, iov[1].iov_base, size);
    atomic_store(&t->max_write, init.max_write);
    atomic_store(&t->max_pages, init.max_pages);
    if (atomic_load(&t->offer_rings) && atomic_load(&t->kernel_offers_rings) && (init.flags & FUSE_INIT_EXT)) {
        init.flags2 |= RING_FLAG2_OVER_IO_URING;
        atomic_store(&t->rings_offered, 1);
    }
    // The file system clears set-user-ID and set-group-ID when a request says so (see
    // `note_request`) and the backing file system drops capabilities on the daemon's own writes,
    // truncations and chowns; the kernel then stops asking for security.capability before each
    // write, and for the attributes before each chown.
    if (atomic_load(&t->kernel_offers_killpriv)) init.flags |= FUSE_HANDLE_KILLPRIV_V2;
    struct iovec patched[2] = { iov[0], { .iov_base = &init, .iov_len = size } };
    return writev(fd, patched, 2);
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *key) {
    if (count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header)) return writev(fd, iov, count);
    uint64_t unique = ((const struct fuse_out_header *)iov[0].iov_base)->unique;
    if (unique != 0) {
        custody_fuse_ring *ring = current_ring;
        if (ring && ring->transport->key == key && atomic_load_explicit(&ring->inflight, memory_order_relaxed) == unique) {
            return answer(ring, iov, count, 1);
        }
        custody_fuse_transport *t = find_transport(key);
        if (t) {
            if (t->ring_count > 0 && answer_elsewhere(t, unique, iov, count)) {
                size_t total = 0;
                for (int i = 0; i < count; i++) total += iov[i].iov_len;
                return (ssize_t)total;
            }
            uint64_t init = atomic_load(&t->init_unique);
            if (init != 0 && init == unique && atomic_compare_exchange_strong(&t->init_unique, &init, 0)) {
                return write_init_answer(fd, t, iov, count);
            }
        }
    }
    return writev(fd, iov, count);
}

static ssize_t io_read(int fd, void *buffer, size_t size, void *key) {
    ssize_t n = read(fd, buffer, size);
    if (n > 0) {
        note_request(buffer, (size_t)n);
    } else {
        request_kills_suidgid = 0;
    }
    if (n >= (ssize_t)(sizeof(struct fuse_in_header) + offsetof(struct fuse_init_in, flags) + sizeof(uint32_t))) {
        const struct fuse_in_header *in = buffer;
        if (in->opcode == FUSE_INIT) {
            int saved = errno;
            custody_fuse_transport *t = find_transport(key);
            if (t) {
                const struct fuse_init_in *init = (const void *)(in + 1);
                int offers = 0;
                if ((size_t)n >= sizeof(*in) + offsetof(struct fuse_init_in, flags2) + sizeof(uint32_t)) {
                    offers = (init->flags & FUSE_INIT_EXT) && (init->flags2 & RING_FLAG2_OVER_IO_URING);
                }
                atomic_store(&t->kernel_offers_rings, offers);
                atomic_store(&t->kernel_offers_killpriv, (init->flags & FUSE_HANDLE_KILLPRIV_V2) != 0);
                atomic_store(&t->init_unique, in->unique);
            }
            errno = saved;
        }
    }
    return n;
}

// MARK: transport

custody_fuse_transport *custody_fuse_transport_install(struct fuse_session *session, void *key, int *error) {
    custody_fuse_transport *t = calloc(1, sizeof(*t));
    if (!t) { *error = ENOMEM; return NULL; }
    t->key = key;
    t->fd = fuse_session_fd(session);
    pthread_mutex_init(&t->lock, NULL);
    const struct fuse_custom_io io = { .writev = io_writev, .read = io_read };
    int rc = fuse_session_custom_io(session, &io, t->fd);
    if (rc != 0) {
        pthread_mutex_destroy(&t->lock);
        free(t);
        *error = rc < 0 ? -rc : EINVAL;
        return NULL;
    }
    pthread_rwlock_wrlock(&transports_lock);
    t->next = transports;
    transports = t;
    pthread_rwlock_unlock(&transports_lock);
    return t;
}

void custody_fuse_transport_offer_rings(custody_fuse_transport *t) { atomic_store(&t->offer_rings, 1); }

int custody_fuse_transport_rings_offered(const custody_fuse_transport *t) {
    return atomic_load(&((custody_fuse_transport *)t)->rings_offered);
}

uint32_t custody_fuse_transport_max_write(const custody_fuse_transport *t) {
    custody_fuse_transport *m = (custody_fuse_transport *)t;
    uint32_t write = atomic_load(&m->max_write);
    uint64_t pages = (uint64_t)atomic_load(&m->max_pages) * (uint64_t)sysconf(_SC_PAGESIZE);
    if (write == 0) return 0;
    return pages > write && pages <= UINT32_MAX ? (uint32_t)pages : write;
}

void custody_fuse_transport_remove(custody_fuse_transport *t) {
    if (!t) return;
    pthread_rwlock_wrlock(&transports_lock);
    for (custody_fuse_transport **p = &transports; *p; p = &(*p)->next) {
        if (*p == t) { *p = t->next; break; }
    }
    pthread_rwlock_unlock(&transports_lock);
    for (int i = 0; i < t->mapping_count; i++) munmap(t->mappings[i], t->mapping_sizes[i]);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int custody_pin_thread(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return EINVAL;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

pid_t custody_thread_id(void) { return gettid(); }

int custody_thread_set_idle_priority(pid_t thread, int idle) {
    struct sched_param param = { .sched_priority = 0 };
    return sched_setscheduler(thread, idle ? SCHED_IDLE : SCHED_OTHER, &param) == 0 ? 0 : errno;
}

int custody_fuse_possible_cpus(void) {
    // "0-1" or "0-3,8-11": the highest number plus one (queues are indexed by CPU number).
    int fd = open("/sys/devices/system/cpu/possible", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (int)sysconf(_SC_NPROCESSORS_CONF);
    char text[256];
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0) return (int)sysconf(_SC_NPROCESSORS_CONF);
    text[n] = 0;
    long highest = -1, value = -1;
    for (char *c = text; ; c++) {
        if (*c >= '0' && *c <= '9') {
            value = (value < 0 ? 0 : value * 10) + (*c - '0');
            if (value > 65536) return -1;
        } else {
            if (value > highest) highest = value;
            value = -1;
            if (*c == 0 || *c == '\n') break;
        }
    }
    return highest < 0 ? (int)sysconf(_SC_NPROCESSORS_CONF) : (int)(highest + 1);
}

// MARK: rings

static int arm_wake(custody_fuse_ring *ring) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->uring);
    if (!sqe) return -EBUSY;
    io_uring_prep_poll_multishot(sqe, ring->event_fd, POLLIN);
    sqe->user_data = TAG_WAKE;
    return 0;
}

custody_fuse_ring *custody_fuse_ring_create(custody_fuse_transport *t, unsigned qid, int *error) {
    custody_fuse_ring *ring = calloc(1, sizeof(*ring));
    if (!ring) { *error = ENOMEM; return NULL; }
    ring->transport = t;
    ring->qid = qid;
    // One issuer (this thread) lets the kernel run request delivery when the thread waits.
    // TASKRUN_FLAG shows, in shared memory, that a request waits for this thread to run
    // (`custody_fuse_ring_work_pending`).
    static const unsigned setups[] = {
        IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SQE128 | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
        IORING_SETUP_SQE128,
    };
    int rc = -EINVAL;
    for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
        struct io_uring_params params;
        memset(&params, 0, sizeof(params));
        params.flags = setups[i];
        rc = io_uring_queue_init_params(4, &ring->uring, &params);
        if (rc != -EINVAL) break;
    }
    if (rc < 0) { free(ring); *error = -rc; return NULL; }
    ring->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ring->event_fd < 0 || arm_wake(ring) < 0 || io_uring_submit(&ring->uring) < 0) {
        *error = ring->event_fd < 0 ? errno : EIO;
        if (ring->event_fd >= 0) close(ring->event_fd);
        io_uring_queue_exit(&ring->uring);
        free(ring);
        return NULL;
    }
    pthread_mutex_lock(&t->lock);
    if (t->ring_count >= MAX_RINGS) {
        pthread_mutex_unlock(&t->lock);
        close(ring->event_fd);
        io_uring_queue_exit(&ring->uring);
        free(ring);
        *error = ENOSPC;
        return NULL;
    }
    t->rings[t->ring_count++] = ring;
    pthread_mutex_unlock(&t->lock);
    return ring;
}

void custody_fuse_ring_destroy(custody_fuse_ring *ring) {
    if (!ring) return;
    custody_fuse_transport *t = ring->transport;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->ring_count; i++) {
        if (t->rings[i] == ring) t->rings[i] = NULL;
    }
    pthread_mutex_unlock(&t->lock);
    if (current_ring == ring) current_ring = NULL;
    io_uring_queue_exit(&ring->uring);
    close(ring->event_fd);
    free(ring);
}

static void *map_buffer(custody_fuse_transport *t, size_t size) {
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return NULL;
    (void)madvise(memory, size, MADV_DONTDUMP);   // requests and answers hold plaintext
    pthread_mutex_lock(&t->lock);
    if (t->mapping_count >= 2 * MAX_RINGS) {
        pthread_mutex_unlock(&t->lock);
        munmap(memory, size);
        return NULL;
    }
    t->mappings[t->mapping_count] = memory;
    t->mapping_sizes[t->mapping_count] = size;
    t->mapping_count++;
    pthread_mutex_unlock(&t->lock);
    return memory;
}

int custody_fuse_ring_register(custody_fuse_ring *ring, size_t payload_size) {
    custody_fuse_transport *t = ring->transport;
    if (!ring->header) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (payload_size < 8192) payload_size = 8192;
        payload_size = (payload_size + page - 1) / page * page;
        void *header = map_buffer(t, page);
        char *area = header ? map_buffer(t, HEADROOM + payload_size) : NULL;
        if (!header || !area) return -ENOMEM;
        ring->header = header;
        ring->payload = area + HEADROOM;
        ring->payload_size = payload_size;
        ring->iov[0] = (struct iovec){ .iov_base = header, .iov_len = sizeof(struct ring_request_header) };
        ring->iov[1] = (struct iovec){ .iov_base = ring->payload, .iov_len = payload_size };
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->uring);
    if (!sqe) return -EBUSY;
    memset(sqe, 0, 2 * sizeof(*sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = t->fd;
    sqe->cmd_op = RING_CMD_REGISTER;
    sqe->addr = (uint64_t)(uintptr_t)ring->iov;
    sqe->len = 2;
    sqe->user_data = TAG_ENTRY;
    struct ring_command command = { .qid = (uint16_t)ring->qid };
    memcpy(sqe->cmd, &command, sizeof(command));
    int rc = io_uring_submit(&ring->uring);
    return rc < 0 ? rc : 0;
}

// Lays the request out as /dev/fuse would have delivered it: in header, the operation's header,
// then the payload, which is already in place after the headroom.
static int take_request(custody_fuse_ring *ring, void **request, size_t *length) {
    struct fuse_in_header in;
    memcpy(&in, ring->header->in_out, sizeof(in));
    uint32_t payload = ring->header->entry.payload_sz;
    ring->commit_id = ring->header->entry.commit_id;
    size_t header = sizeof(in);
    if (in.len < header || payload > ring->payload_size || in.len - header < payload ||
        in.len - header - payload > RING_HEADER_AREA) {
        return -EPROTO;
    }
    size_t operation = in.len - header - payload;
    char *start = ring->payload - header - operation;
    memcpy(start, &in, header);
    memcpy(start + header, ring->header->op_in, operation);
    // A READ's answer (a file's plaintext, for an encrypted file) does not stay in memory past
    // the commit: what the next request does not overwrite is zeroed.
    if (ring->read_answer > payload) memset(ring->payload + payload, 0, ring->read_answer - payload);
    ring->read_answer = 0;
    ring->borrowed = 0;
    ring->request_payload = payload;
    ring->opcode = in.opcode;
    atomic_store_explicit(&ring->inflight, in.unique, memory_order_relaxed);
    ring->answered = 0;
    current_ring = ring;
    note_request(start, in.len);
    *request = start;
    *length = in.len;
    return CUSTODY_RING_REQUEST;
}

static void find_siblings(custody_fuse_ring *ring) {
    custody_fuse_transport *t = ring->transport;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->ring_count && ring->sibling_count < MAX_SIBLINGS; i++) {
        custody_fuse_ring *other = t->rings[i];
        if (other && other != ring && other->qid == ring->qid) ring->siblings[ring->sibling_count++] = other;
    }
    pthread_mutex_unlock(&t->lock);
    ring->siblings_known = 1;
}

// Starts requests of one queue in the order the kernel queued them, as threads reading /dev/fuse
// do: a close's RELEASE (which nobody waits for) must not be overtaken by the caller's next
// request from the same CPU. The kernel numbers requests in order; a sibling that holds an older
// request not started yet, or has one it has not taken yet (which may be older), goes first.
// Siblings run on the same CPU, so yielding hands it to them. Bounded (a starved sibling is the
// guard's to raise), so an ordering is never waited for longer than about a millisecond.
static void wait_turn(custody_fuse_ring *ring, uint64_t unique) {
    if (!ring->siblings_known) find_siblings(ring);
    if (ring->sibling_count == 0) return;
    for (int round = 0; round < 1000; round++) {
        int older = 0;
        for (int i = 0; i < ring->sibling_count && !older; i++) {
            custody_fuse_ring *sibling = ring->siblings[i];
            uint64_t theirs = atomic_load_explicit(&sibling->waiting, memory_order_acquire);
            older = (theirs != 0 && theirs < unique) ||
                (IO_URING_READ_ONCE(*sibling->uring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
        }
        if (!older) return;
        sched_yield();
    }
}

// Answers a request that cannot be handed to libfuse (it was malformed) with EIO.
static void refuse(custody_fuse_ring *ring) {
    struct fuse_out_header out = { .len = sizeof(out), .error = -EIO, .unique = ring->commit_id };
    memcpy(ring->header->in_out, &out, sizeof(out));
    ring->header->entry.payload_sz = 0;
    ring->stashed = 0;
    atomic_store(&ring->inflight, 0);
    queue_commit(ring);
}

int custody_fuse_ring_next(custody_fuse_ring *ring, void **request, size_t *length) {
    current_ring = ring;
    for (;;) {
        if (atomic_load(&ring->stopping)) {
            unstash(ring);
            io_uring_submit(&ring->uring);   // an answer already queued still goes out
            return CUSTODY_RING_STOPPED;
        }
        unstash(ring);
        if (ring->read_answer && (ring->uring.flags & IORING_SETUP_DEFER_TASKRUN)) {
            // Send the READ's answer, then zero it unless the same call brought the next request
            // (its header then carries another ID). Nothing else writes to the buffers while this
            // thread is out of the kernel: with deferred task running, the kernel copies requests
            // in only while the thread waits for them.
            io_uring_submit(&ring->uring);
            if (ring->header->entry.commit_id == ring->commit_id) {
                memset(ring->payload, 0, ring->read_answer);
                ring->read_answer = 0;
            }
        }
        int rc = io_uring_submit_and_wait(&ring->uring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) return rc;
        struct io_uring_cqe *cqe = NULL;
        while (io_uring_peek_cqe(&ring->uring, &cqe) == 0 && cqe) {
            uint64_t tag = cqe->user_data;
            int result = cqe->res;
            unsigned flags = cqe->flags;
            io_uring_cqe_seen(&ring->uring, cqe);
            if (tag == TAG_WAKE) {
                eventfd_t value;
                (void)eventfd_read(ring->event_fd, &value);
                if (!(flags & IORING_CQE_F_MORE)) arm_wake(ring);
                if (atomic_exchange(&ring->async_answer, 0)) queue_commit(ring);
                unstash(ring);
                continue;
            }
            if (result < 0) return result;
            int taken = take_request(ring, request, length);
            if (taken == CUSTODY_RING_REQUEST) {
                uint64_t unique = ((const struct fuse_in_header *)*request)->unique;
                atomic_store_explicit(&ring->waiting, unique, memory_order_release);
                wait_turn(ring, unique);
                atomic_store_explicit(&ring->waiting, 0, memory_order_release);
                return taken;
            }
            refuse(ring);
        }
    }
}

int custody_fuse_ring_answered(const custody_fuse_ring *ring) {
    return ring->answered || atomic_load(&((custody_fuse_ring *)ring)->inflight) == 0;
}

void *custody_fuse_ring_borrow_payload(size_t size, int sensitive) {
    custody_fuse_ring *ring = current_ring;
    if (!ring || ring->request_payload != 0 || size > ring->payload_size ||
        atomic_load_explicit(&ring->inflight, memory_order_relaxed) == 0) {
        return NULL;
    }
    ring->borrowed = 1;
    if (sensitive && size > ring->read_answer) ring->read_answer = size;
    return ring->payload;
}

int custody_fuse_ring_reports_pending(const custody_fuse_ring *ring) {
    return (ring->uring.flags & IORING_SETUP_TASKRUN_FLAG) != 0;
}

int custody_fuse_ring_work_pending(const custody_fuse_ring *ring) {
    return (IO_URING_READ_ONCE(*ring->uring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
}

void custody_fuse_ring_stop(custody_fuse_ring *ring) {
    atomic_store(&ring->stopping, 1);
    eventfd_write(ring->event_fd, 1);
}
