// One CPU's ring: an io_uring of its own, served by one thread pinned to that CPU, with several
// entries. The kernel puts each request into a free entry of the caller's CPU; the thread takes
// it, serves it or hands it off (requests that may wait, `request_kind`), and commits each
// entry's answer when it is ready, which hands the entry back for the next request.
//
// Entries. A ring starts with `entries_at_start` and registers another whenever handed-off
// requests hold so many that fewer than ENTRIES_KEPT_FREE remain (up to ENTRIES_MOST), so that
// a request that waits never holds up the requests after it. Entries are added only by the
// ring's thread and live as long as the ring.
//
// Order. One thread takes a CPU's requests in the order the kernel delivered them, as readers of
// /dev/fuse do, and serves most where they arrive. What it hands off (`request_kind`, and
// requests about a node a handed-off request is about, `node_is_busy`) is served by whichever
// worker is free, as any request is by whichever thread is free with /dev/fuse: a request nobody
// waits for (a write-back's WRITE, a close's RELEASE on a slow store) may then be overtaken.
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/// The ring the calling thread serves (set by `next`): its answers are committed directly.
static _Thread_local custody_fuse_ring *serving_ring;

// MARK: submissions

static struct io_uring_sqe *get_sqe(custody_fuse_ring *ring) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring->uring);
    if (!sqe) {   // the queue has room for one command per entry and the poll: never full
        io_uring_submit(&ring->uring);
        sqe = io_uring_get_sqe(&ring->uring);
    }
    return sqe;
}

static int arm_wake(custody_fuse_ring *ring) {
    struct io_uring_sqe *sqe = get_sqe(ring);
    if (!sqe) return -EBUSY;
    io_uring_prep_poll_multishot(sqe, ring->event_fd, POLLIN);
    sqe->user_data = TAG_WAKE;
    return 0;
}

static void prepare_command(custody_fuse_entry *entry, struct io_uring_sqe *sqe, uint32_t command_op, uint64_t commit_id) {
    custody_fuse_ring *ring = entry->ring;
    memset(sqe, 0, 2 * sizeof(*sqe));
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = ring->transport->fd;
    sqe->cmd_op = command_op;
    sqe->user_data = (uint64_t)entry->index + 1;
    struct ring_command command = { .commit_id = commit_id, .qid = (uint16_t)ring->qid };
    memcpy(sqe->cmd, &command, sizeof(command));
}

static int queue_register(custody_fuse_entry *entry) {
    struct io_uring_sqe *sqe = get_sqe(entry->ring);
    if (!sqe) return -EBUSY;
    prepare_command(entry, sqe, RING_CMD_REGISTER, 0);
    sqe->addr = (uint64_t)(uintptr_t)entry->iov;
    sqe->len = 2;
    entry->state = ENTRY_REGISTERING;
    return 0;
}

// MARK: entries

static custody_fuse_entry *add_entry(custody_fuse_ring *ring) {
    int index = atomic_load(&ring->entry_count);
    if (index >= ENTRIES_MOST) return NULL;
    custody_fuse_entry *entry = calloc(1, sizeof(*entry));
    if (!entry) return NULL;
    // The header area in a page of its own, then room for the request's headers, then the payload.
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *area = map_buffer(ring->transport, page + HEADROOM + ring->payload_size);
    if (!area) { free(entry); return NULL; }
    entry->ring = ring;
    entry->index = (unsigned)index;
    entry->header = (struct ring_request_header *)(void *)area;
    entry->payload = area + page + HEADROOM;
    entry->iov[0] = (struct iovec){ .iov_base = entry->header, .iov_len = sizeof(struct ring_request_header) };
    entry->iov[1] = (struct iovec){ .iov_base = entry->payload, .iov_len = ring->payload_size };
    ring->entries[index] = entry;
    atomic_store_explicit(&ring->entry_count, index + 1, memory_order_release);
    return entry;
}

// How many entries a ring registers at first (see ENTRIES_AT_START_LEAST).
static int entries_at_start(const custody_fuse_ring *ring) {
    int wanted = (int)atomic_load(&ring->transport->max_background) + 1 + ENTRIES_KEPT_FREE;
    if (wanted < ENTRIES_AT_START_LEAST) wanted = ENTRIES_AT_START_LEAST;
    return wanted > ENTRIES_MOST ? ENTRIES_MOST : wanted;
}

// Handed-off requests hold entries: register another while fewer than ENTRIES_KEPT_FREE are left
// for new requests.
static void keep_entries_free(custody_fuse_ring *ring) {
    int count = atomic_load(&ring->entry_count);
    if (ring->failed_growth || count - ring->held - ring->dead >= ENTRIES_KEPT_FREE) return;
    custody_fuse_entry *entry = add_entry(ring);
    if (!entry || queue_register(entry) != 0) ring->failed_growth = 1;
}

static void queue_commit(custody_fuse_entry *entry) {
    struct io_uring_sqe *sqe = get_sqe(entry->ring);
    if (!sqe) return;
    prepare_command(entry, sqe, RING_CMD_COMMIT_AND_FETCH, entry->commit_id);
}

// Sends an entry's answer back with the next submission. On the ring's thread only.
static void commit(custody_fuse_entry *entry) {
    custody_fuse_ring *ring = entry->ring;
    if (entry->stashed) {
        memcpy(entry->payload, entry->stash, entry->stash_length);
        // An answer may be plaintext (a READ's, an attribute's value): the copy does not stay.
        memset(entry->stash, 0, entry->stash_length);
        if (entry->opcode == FUSE_READ && entry->stash_length > entry->read_answer) entry->read_answer = entry->stash_length;
        entry->stashed = 0;
    }
    queue_commit(entry);
    entry->held = 0;
    ring->held--;
    if (entry->read_answer) ring->zero_pending = 1;
    size_t answer = entry->header->entry.payload_sz;
    if (answer > entry->resident) entry->resident = answer;
}

void entry_finished(custody_fuse_entry *entry) {
    custody_fuse_ring *ring = entry->ring;
    if (serving_ring == ring) {
        commit(entry);
        return;
    }
    atomic_store(&entry->ready, 1);
    eventfd_write(ring->event_fd, 1);
}

static void commit_ready(custody_fuse_ring *ring) {
    int count = atomic_load(&ring->entry_count);
    for (int i = 0; i < count; i++) {
        custody_fuse_entry *entry = ring->entries[i];
        if (atomic_load_explicit(&entry->ready, memory_order_relaxed) && atomic_exchange(&entry->ready, 0)) commit(entry);
    }
}

// Gives back what requests left in the entries beyond the first ENTRIES_AT_START_LEAST after a
// burst, once their answers are out and as long as no request came into them (as for zeroing,
// below: only while this thread is out of the kernel does nothing write to them).
static void release_memory(custody_fuse_ring *ring) {
    if (!(ring->uring.flags & IORING_SETUP_DEFER_TASKRUN)) return;
    io_uring_submit(&ring->uring);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int count = atomic_load(&ring->entry_count);
    for (int i = ENTRIES_AT_START_LEAST; i < count; i++) {
        custody_fuse_entry *entry = ring->entries[i];
        if (entry->held || entry->state != ENTRY_IN_USE || !entry->resident) continue;
        if (entry->header->entry.commit_id != entry->commit_id) continue;
        (void)madvise(entry->payload, (entry->resident + page - 1) / page * page, MADV_DONTNEED);
        if (entry->stash) (void)madvise(entry->stash, ring->payload_size, MADV_DONTNEED);
        entry->resident = 0;
        entry->read_answer = 0;   // the pages are gone, and with them the answer
    }
}

// Sends READ answers, then zeroes each unless the same call brought the entry its next request
// (its header then carries another ID). Nothing else writes to the buffers while this thread is
// out of the kernel: with deferred task running, the kernel copies requests in only while the
// thread waits for them. Without it, `take_request` zeroes what a request does not overwrite.
static void zero_read_answers(custody_fuse_ring *ring) {
    if (!ring->zero_pending || !(ring->uring.flags & IORING_SETUP_DEFER_TASKRUN)) return;
    io_uring_submit(&ring->uring);
    int count = atomic_load(&ring->entry_count);
    for (int i = 0; i < count; i++) {
        custody_fuse_entry *entry = ring->entries[i];
        if (entry->held || !entry->read_answer) continue;
        if (entry->header->entry.commit_id == entry->commit_id) {
            memset(entry->payload, 0, entry->read_answer);
            entry->read_answer = 0;
        }
    }
    ring->zero_pending = 0;
}

// Lays the request out as /dev/fuse would have delivered it: in header, the operation's header,
// then the payload, which is already in place after the headroom.
static int take_request(custody_fuse_entry *entry) {
    custody_fuse_ring *ring = entry->ring;
    struct fuse_in_header in;
    memcpy(&in, entry->header->in_out, sizeof(in));
    uint32_t payload = entry->header->entry.payload_sz;
    entry->commit_id = entry->header->entry.commit_id;
    entry->held = 1;
    ring->held++;
    entry->stashed = 0;
    atomic_store(&entry->progress, 0);
    atomic_store(&entry->ready, 0);
    size_t header = sizeof(in);
    if (in.len < header || payload > ring->payload_size || in.len - header < payload ||
        in.len - header - payload > RING_HEADER_AREA) {
        return -EPROTO;
    }
    size_t operation = in.len - header - payload;
    char *start = entry->payload - header - operation;
    memcpy(start, &in, header);
    memcpy(start + header, entry->header->op_in, operation);
    // A READ's answer (a file's plaintext, for an encrypted file) does not stay in memory past
    // the commit: what the next request does not overwrite is zeroed.
    if (entry->read_answer > payload) memset(entry->payload + payload, 0, entry->read_answer - payload);
    entry->read_answer = 0;
    entry->borrowed = 0;
    entry->request_payload = payload;
    if (payload > entry->resident) entry->resident = payload;
    entry->opcode = in.opcode;
    entry->kills_suidgid = request_kills_suidgid_flag(start, in.len);
    entry->request = start;
    entry->request_length = in.len;
    entry->kind = request_kind(&in, start + header, operation, entry->payload, payload);
    entry->nodeid = in.nodeid;
    entry->marks_busy = 0;
    atomic_store_explicit(&entry->inflight, in.unique, memory_order_release);
    return 0;
}

// Answers a request that cannot be handed to libfuse (it was malformed) with EIO.
static void refuse(custody_fuse_entry *entry) {
    struct fuse_out_header out = { .len = sizeof(out), .error = -EIO, .unique = entry->commit_id };
    memcpy(entry->header->in_out, &out, sizeof(out));
    entry->header->entry.payload_sz = 0;
    atomic_store(&entry->inflight, 0);
    atomic_store(&entry->progress, ENTRY_ANSWERED | ENTRY_RETURNED);
    commit(entry);
}

// MARK: the ring

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
        // Room for a command of every entry and the wake-up poll.
        rc = io_uring_queue_init_params(2 * ENTRIES_MOST, &ring->uring, &params);
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
    int count = atomic_load(&t->ring_count);
    if (count >= MAX_RINGS) {
        pthread_mutex_unlock(&t->lock);
        close(ring->event_fd);
        io_uring_queue_exit(&ring->uring);
        free(ring);
        *error = ENOSPC;
        return NULL;
    }
    t->rings[count] = ring;
    atomic_store(&t->ring_count, count + 1);
    pthread_mutex_unlock(&t->lock);
    return ring;
}

int custody_fuse_ring_register(custody_fuse_ring *ring, size_t payload_size) {
    if (ring->payload_size == 0) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (payload_size < 8192) payload_size = 8192;
        ring->payload_size = (payload_size + page - 1) / page * page;
        for (int i = 0, wanted = entries_at_start(ring); i < wanted; i++) {
            if (!add_entry(ring)) return -ENOMEM;
        }
    }
    int count = atomic_load(&ring->entry_count);
    for (int i = 0; i < count; i++) {
        custody_fuse_entry *entry = ring->entries[i];
        if (entry->state == ENTRY_NEW && queue_register(entry) != 0) return -EBUSY;
    }
    int rc = io_uring_submit(&ring->uring);
    return rc < 0 ? rc : 0;
}

int custody_fuse_ring_next(custody_fuse_ring *ring, void **request, size_t *length, custody_fuse_entry **taken) {
    serving_ring = ring;
    current_entry = NULL;
    for (;;) {
        commit_ready(ring);
        if (atomic_load_explicit(&ring->release_memory, memory_order_relaxed) && atomic_exchange(&ring->release_memory, 0)) {
            release_memory(ring);
        }
        if (atomic_load(&ring->stopping)) {
            io_uring_submit(&ring->uring);   // answers already queued still go out
            return CUSTODY_RING_STOPPED;
        }
        zero_read_answers(ring);
        // Send what is queued and wait, unless a completion is already there to take.
        struct io_uring_cqe *cqe = NULL;
        if (io_uring_sq_ready(&ring->uring) > 0 || io_uring_peek_cqe(&ring->uring, &cqe) != 0 || !cqe) {
            int rc = io_uring_submit_and_wait(&ring->uring, 1);
            if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) return rc;
            cqe = NULL;
            if (io_uring_peek_cqe(&ring->uring, &cqe) != 0 || !cqe) continue;
        }
        uint64_t tag = cqe->user_data;
        int result = cqe->res;
        unsigned flags = cqe->flags;
        io_uring_cqe_seen(&ring->uring, cqe);
        if (tag == TAG_WAKE) {
            eventfd_t value;
            (void)eventfd_read(ring->event_fd, &value);
            if (!(flags & IORING_CQE_F_MORE)) arm_wake(ring);
            continue;   // answers from other threads are committed at the top
        }
        int count = atomic_load(&ring->entry_count);
        if (tag == 0 || tag > (uint64_t)count) continue;
        custody_fuse_entry *entry = ring->entries[tag - 1];
        if (result < 0) {
            if (result == -EAGAIN && entry->state == ENTRY_REGISTERING) {
                entry->state = ENTRY_NEW;   // registered before INIT was answered: again later
                return -EAGAIN;
            }
            // The connection is gone: the thread's work is over.
            if (result == -ENOTCONN || result == -ECONNABORTED || result == -ENODEV || result == -ECANCELED) return result;
            // The kernel refused this entry (a registration, or a commit it no longer knew): go on
            // with the others, and with none left, give up (the kernel then serves /dev/fuse).
            if (entry->held) {
                entry->held = 0;
                ring->held--;
            }
            entry->state = ENTRY_DEAD;
            ring->dead++;
            ring->failed_growth = 1;
            if (ring->dead >= count) return result;
            continue;
        }
        entry->state = ENTRY_IN_USE;
        if (take_request(entry) != 0) {
            refuse(entry);
            continue;
        }
        *request = entry->request;
        *length = entry->request_length;
        *taken = entry;
        int hand_off = entry->kind == REQUEST_WAITS || (entry->kind == REQUEST_CHANGES && store_is_slow(ring->transport)) ||
            node_is_busy(ring->transport, entry->nodeid);
        if (!hand_off) return CUSTODY_RING_REQUEST;
        mark_busy(ring->transport, entry);
        int wants_worker = handoff_push(ring->transport, entry);
        keep_entries_free(ring);
        return wants_worker ? CUSTODY_RING_WANTS_WORKER : CUSTODY_RING_HANDED_OFF;
    }
}

void custody_fuse_ring_release_memory(custody_fuse_ring *ring) {
    atomic_store(&ring->release_memory, 1);
    eventfd_write(ring->event_fd, 1);
}

void custody_fuse_ring_stop(custody_fuse_ring *ring) {
    atomic_store(&ring->stopping, 1);
    eventfd_write(ring->event_fd, 1);
}

void custody_fuse_ring_destroy(custody_fuse_ring *ring) {
    if (!ring) return;
    custody_fuse_transport *t = ring->transport;
    // Out of the list first: answers from other threads search it under the lock.
    pthread_mutex_lock(&t->lock);
    int rings = atomic_load(&t->ring_count);
    for (int i = 0; i < rings; i++) {
        if (t->rings[i] == ring) t->rings[i] = NULL;
    }
    pthread_mutex_unlock(&t->lock);
    if (serving_ring == ring) serving_ring = NULL;
    io_uring_queue_exit(&ring->uring);
    close(ring->event_fd);
    int count = atomic_load(&ring->entry_count);
    for (int i = 0; i < count; i++) free(ring->entries[i]);
    free(ring);
}

int custody_fuse_ring_entries(const custody_fuse_ring *ring) {
    return atomic_load(&((custody_fuse_ring *)ring)->entry_count);
}

int custody_fuse_ring_reports_pending(const custody_fuse_ring *ring) {
    return (ring->uring.flags & IORING_SETUP_TASKRUN_FLAG) != 0;
}

int custody_fuse_ring_work_pending(const custody_fuse_ring *ring) {
    return (IO_URING_READ_ONCE(*ring->uring.sq.kflags) & IORING_SQ_TASKRUN) != 0;
}

// MARK: serving one request

void custody_fuse_entry_begin(custody_fuse_entry *entry) {
    current_entry = entry;
    set_request_kills_suidgid(entry->kills_suidgid);
    if (request_is_timed(entry)) entry->started = monotonic_ns();
}

int custody_fuse_entry_end(custody_fuse_entry *entry) {
    current_entry = NULL;
    set_request_kills_suidgid(0);
    int slow = request_is_timed(entry) && note_store_time(entry->ring->transport, monotonic_ns() - entry->started);
    unmark_busy(entry->ring->transport, entry);
    // Not answered yet (the answer comes from another thread later): that thread finishes it.
    if (atomic_fetch_or(&entry->progress, ENTRY_RETURNED) & ENTRY_ANSWERED) entry_finished(entry);
    return slow;
}
