// The custom I/O in front of a libfuse 3.14 session's /dev/fuse descriptor: it reads requests
// (noting the flags libfuse drops), patches the INIT answer, and sends each answer where its
// request came from: the ring entry being served, an entry served elsewhere, or /dev/fuse.
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_rwlock_t transports_lock = PTHREAD_RWLOCK_INITIALIZER;
static custody_fuse_transport *transports;

_Thread_local custody_fuse_entry *current_entry;
static _Thread_local int request_kills_suidgid;

static custody_fuse_transport *find_transport(void *key) {
    custody_fuse_transport *found = NULL;
    pthread_rwlock_rdlock(&transports_lock);
    for (custody_fuse_transport *t = transports; t; t = t->next) {
        if (t->key == key) { found = t; break; }
    }
    pthread_rwlock_unlock(&transports_lock);
    return found;
}

// MARK: set-ID flags

void set_request_kills_suidgid(int kills) { request_kills_suidgid = kills; }

int custody_fuse_request_kills_suidgid(void) { return request_kills_suidgid; }

// MARK: answers into ring entries

// Takes libfuse's answer (out header, then data). The data goes straight into the payload when the
// thread serving the request answers and the request left the payload empty (its arguments are
// all in the headroom, as for READ); else into the stash, copied into the payload at the commit:
// until the handler returns, the payload still holds the request (a write's data, which the
// handler zeroes after answering). The ring's thread commits the entry once the handler has
// returned too (`entry_finished`).
static ssize_t answer(custody_fuse_entry *entry, const struct iovec *iov, int count, int own) {
    struct fuse_out_header out;
    memcpy(&out, iov[0].iov_base, sizeof(out));
    size_t capacity = entry->ring->payload_size;
    size_t total = 0;
    for (int i = 1; i < count; i++) total += iov[i].iov_len;
    if (out.error || total > capacity) {   // larger than any request allows: refuse it
        if (!out.error) out.error = -EIO;
        total = 0;
    }
    int direct = own && entry->request_payload == 0;
    if (!direct && total > 0 && !entry->stash) {
        entry->stash = map_buffer(entry->ring->transport, capacity);
        if (!entry->stash) { out.error = -ENOMEM; total = 0; }
    }
    char *to = direct ? entry->payload : entry->stash;
    size_t at = 0;
    for (int i = 1; i < count && at < total; i++) {
        size_t n = iov[i].iov_len;
        if (n && iov[i].iov_base != to + at) memmove(to + at, iov[i].iov_base, n);
        at += n;
    }
    // A READ answer copied in from elsewhere may be an encrypted file's plaintext: zeroed later.
    // One built in place says itself whether it is (`custody_fuse_ring_borrow_payload`).
    if (direct && entry->opcode == FUSE_READ && !entry->borrowed && total > entry->read_answer) entry->read_answer = total;
    entry->stash_length = direct ? 0 : total;
    entry->stashed = !direct && total > 0;
    out.len = (uint32_t)(sizeof(out) + total);
    memcpy(entry->header->in_out, &out, sizeof(out));
    entry->header->entry.payload_sz = (uint32_t)total;
    atomic_store_explicit(&entry->inflight, 0, memory_order_release);
    // Answered after its handler returned (from another thread): nobody else will commit it.
    if (atomic_fetch_or(&entry->progress, ENTRY_ANSWERED) & ENTRY_RETURNED) entry_finished(entry);
    return (ssize_t)out.len;
}

// An answer from a thread that does not serve the request: find the entry waiting for it. Under
// the transport's lock, which a ring takes to leave the list before it is freed.
static int answer_elsewhere(custody_fuse_transport *t, uint64_t unique, const struct iovec *iov, int count) {
    int done = 0;
    pthread_mutex_lock(&t->lock);
    int rings = atomic_load(&t->ring_count);
    for (int r = 0; r < rings && !done; r++) {
        custody_fuse_ring *ring = t->rings[r];
        if (!ring) continue;
        int entries = atomic_load_explicit(&ring->entry_count, memory_order_acquire);
        for (int i = 0; i < entries; i++) {
            custody_fuse_entry *entry = ring->entries[i];
            if (atomic_load(&entry->inflight) == unique) {
                answer(entry, iov, count, 0);
                done = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&t->lock);
    return done;
}

void *custody_fuse_ring_borrow_payload(size_t size, int sensitive) {
    custody_fuse_entry *entry = current_entry;
    if (!entry || entry->request_payload != 0 || size > entry->ring->payload_size ||
        atomic_load_explicit(&entry->inflight, memory_order_relaxed) == 0) {
        return NULL;
    }
    entry->borrowed = 1;
    if (sensitive && size > entry->read_answer) entry->read_answer = size;
    return entry->payload;
}

// MARK: INIT

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
    atomic_store(&t->max_background, init.max_background);
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

static void note_init(custody_fuse_transport *t, const struct fuse_in_header *in, size_t length) {
    const struct fuse_init_in *init = (const void *)(in + 1);
    int offers = 0;
    if (length >= sizeof(*in) + offsetof(struct fuse_init_in, flags2) + sizeof(uint32_t)) {
        offers = (init->flags & FUSE_INIT_EXT) && (init->flags2 & RING_FLAG2_OVER_IO_URING);
    }
    atomic_store(&t->kernel_offers_rings, offers);
    atomic_store(&t->kernel_offers_killpriv, (init->flags & FUSE_HANDLE_KILLPRIV_V2) != 0);
    atomic_store(&t->init_unique, in->unique);
}

// MARK: the custom I/O

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *key) {
    if (count < 1 || iov[0].iov_len < sizeof(struct fuse_out_header)) return writev(fd, iov, count);
    uint64_t unique = ((const struct fuse_out_header *)iov[0].iov_base)->unique;
    if (unique == 0) return writev(fd, iov, count);   // a notification
    custody_fuse_entry *entry = current_entry;
    if (entry && entry->ring->transport->key == key &&
        atomic_load_explicit(&entry->inflight, memory_order_relaxed) == unique) {
        return answer(entry, iov, count, 1);
    }
    custody_fuse_transport *t = find_transport(key);
    if (t) {
        if (atomic_load(&t->ring_count) > 0 && answer_elsewhere(t, unique, iov, count)) {
            size_t total = 0;
            for (int i = 0; i < count; i++) total += iov[i].iov_len;
            return (ssize_t)total;
        }
        uint64_t init = atomic_load(&t->init_unique);
        if (init != 0 && init == unique && atomic_compare_exchange_strong(&t->init_unique, &init, 0)) {
            return write_init_answer(fd, t, iov, count);
        }
    }
    return writev(fd, iov, count);
}

static ssize_t io_read(int fd, void *buffer, size_t size, void *key) {
    ssize_t n = read(fd, buffer, size);
    set_request_kills_suidgid(n > 0 ? request_kills_suidgid_flag(buffer, (size_t)n) : 0);
    if (n >= (ssize_t)(sizeof(struct fuse_in_header) + offsetof(struct fuse_init_in, flags) + sizeof(uint32_t))) {
        const struct fuse_in_header *in = buffer;
        if (in->opcode == FUSE_INIT) {
            int saved = errno;
            custody_fuse_transport *t = find_transport(key);
            if (t) note_init(t, in, (size_t)n);
            errno = saved;
        }
    }
    return n;
}

// MARK: the transport

custody_fuse_transport *custody_fuse_transport_install(struct fuse_session *session, void *key, int workers, int *error) {
    custody_fuse_transport *t = calloc(1, sizeof(*t));
    if (!t) { *error = ENOMEM; return NULL; }
    t->key = key;
    t->fd = fuse_session_fd(session);
    t->most_workers = workers > 0 ? workers : 1;
    if (sched_getaffinity(0, sizeof(t->cpus), &t->cpus) != 0) {
        CPU_ZERO(&t->cpus);
        for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) CPU_SET(cpu, &t->cpus);
    }
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->mappings_lock, NULL);
    pthread_mutex_init(&t->handoff_lock, NULL);
    pthread_cond_init(&t->handoff_ready, NULL);
    const struct fuse_custom_io io = { .writev = io_writev, .read = io_read };
    int rc = fuse_session_custom_io(session, &io, t->fd);
    if (rc != 0) {
        pthread_cond_destroy(&t->handoff_ready);
        pthread_mutex_destroy(&t->handoff_lock);
        pthread_mutex_destroy(&t->mappings_lock);
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

void *map_buffer(custody_fuse_transport *t, size_t size) {
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return NULL;
    (void)madvise(memory, size, MADV_DONTDUMP);   // requests and answers hold plaintext
    pthread_mutex_lock(&t->mappings_lock);
    if (t->mapping_count == t->mapping_capacity) {
        size_t capacity = t->mapping_capacity ? 2 * t->mapping_capacity : 64;
        void **mappings = realloc(t->mappings, capacity * sizeof(*mappings));
        if (mappings) t->mappings = mappings;
        size_t *sizes = mappings ? realloc(t->mapping_sizes, capacity * sizeof(*sizes)) : NULL;
        if (sizes) t->mapping_sizes = sizes;
        if (!mappings || !sizes) {
            pthread_mutex_unlock(&t->mappings_lock);
            munmap(memory, size);
            return NULL;
        }
        t->mapping_capacity = capacity;
    }
    t->mappings[t->mapping_count] = memory;
    t->mapping_sizes[t->mapping_count] = size;
    t->mapping_count++;
    pthread_mutex_unlock(&t->mappings_lock);
    return memory;
}

void custody_fuse_transport_remove(custody_fuse_transport *t) {
    if (!t) return;
    pthread_rwlock_wrlock(&transports_lock);
    for (custody_fuse_transport **p = &transports; *p; p = &(*p)->next) {
        if (*p == t) { *p = t->next; break; }
    }
    pthread_rwlock_unlock(&transports_lock);
    for (size_t i = 0; i < t->mapping_count; i++) munmap(t->mappings[i], t->mapping_sizes[i]);
    free(t->mappings);
    free(t->mapping_sizes);
    pthread_cond_destroy(&t->handoff_ready);
    pthread_mutex_destroy(&t->handoff_lock);
    pthread_mutex_destroy(&t->mappings_lock);
    pthread_mutex_destroy(&t->lock);
    free(t);
}
