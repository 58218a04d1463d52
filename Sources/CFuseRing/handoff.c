// Requests that may wait (`request_kind`), handed off by the rings' threads to workers, so a
// CPU's ring goes on taking requests while one waits for the disk. The queue is shared by every
// ring of the mount and served in order; workers are started as needed (the ring's thread is
// asked to, CUSTODY_RING_WANTS_WORKER) up to the transport's most, and each answer goes back into
// its entry, which the entry's ring commits (`entry_finished`).
#include "internal.h"

#include <errno.h>
#include <time.h>

static custody_fuse_entry *pop(custody_fuse_transport *t) {
    custody_fuse_entry *entry = t->handoff_head;
    if (!entry) return NULL;
    t->handoff_head = entry->next_handoff;
    if (!t->handoff_head) t->handoff_tail = NULL;
    entry->next_handoff = NULL;
    t->queued--;
    return entry;
}

uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

// The store is slow while timed requests (`request_is_timed`) keep taking SLOW_NANOSECONDS or
// more: SLOW_REQUESTS of them within SLOW_WITHIN_SECONDS, the last less than SLOW_STORE_SECONDS
// ago. A store that made requests wait so will likely make the next ones wait too, and the
// ring's thread must not be the one waiting.
int store_is_slow(custody_fuse_transport *t) {
    uint64_t until = atomic_load_explicit(&t->slow_until, memory_order_relaxed);
    return until != 0 && monotonic_ns() < until;
}

int note_store_time(custody_fuse_transport *t, uint64_t nanoseconds) {
    if (nanoseconds < SLOW_NANOSECONDS) return 0;
    uint64_t now = monotonic_ns();
    pthread_mutex_lock(&t->handoff_lock);
    t->slow_seen[t->slow_next] = now;
    t->slow_next = (t->slow_next + 1) % SLOW_REQUESTS;
    // The oldest of the last SLOW_REQUESTS slow requests (0: fewer so far).
    uint64_t oldest = t->slow_seen[t->slow_next];
    int persistent = oldest != 0 && now - oldest <= SLOW_WITHIN_SECONDS * 1000000000ull;
    pthread_mutex_unlock(&t->handoff_lock);
    if (persistent) atomic_store_explicit(&t->slow_until, now + SLOW_STORE_SECONDS * 1000000000ull, memory_order_relaxed);
    return 1;
}

// A request about a node that a handed-off request is about may wait for it: a journalling store
// locks a file while it writes to it (and may then wait for the store), so a change of its times
// or mode waits as long as the write. Such a request goes to the workers too, whatever its kind,
// and requests of other nodes stay where they arrive. Checked without the lock while nothing is
// handed off (the common case costs one atomic load).
int node_is_busy(custody_fuse_transport *t, uint64_t nodeid) {
    if (atomic_load_explicit(&t->busy_requests, memory_order_relaxed) == 0) return 0;
    int busy = 0;
    pthread_mutex_lock(&t->handoff_lock);
    for (int i = 0; i < BUSY_NODES && !busy; i++) busy = t->busy[i].count > 0 && t->busy[i].nodeid == nodeid;
    pthread_mutex_unlock(&t->handoff_lock);
    return busy;
}

void mark_busy(custody_fuse_transport *t, custody_fuse_entry *entry) {
    pthread_mutex_lock(&t->handoff_lock);
    int slot = -1;
    for (int i = 0; i < BUSY_NODES; i++) {
        if (t->busy[i].count > 0 && t->busy[i].nodeid == entry->nodeid) { slot = i; break; }
        if (slot < 0 && t->busy[i].count == 0) slot = i;
    }
    if (slot >= 0) {
        t->busy[slot].nodeid = entry->nodeid;
        t->busy[slot].count++;
        entry->marks_busy = 1;
        atomic_fetch_add_explicit(&t->busy_requests, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&t->handoff_lock);
}

void unmark_busy(custody_fuse_transport *t, custody_fuse_entry *entry) {
    if (!entry->marks_busy) return;
    entry->marks_busy = 0;
    pthread_mutex_lock(&t->handoff_lock);
    for (int i = 0; i < BUSY_NODES; i++) {
        if (t->busy[i].count > 0 && t->busy[i].nodeid == entry->nodeid) {
            t->busy[i].count--;
            atomic_fetch_sub_explicit(&t->busy_requests, 1, memory_order_relaxed);
            break;
        }
    }
    pthread_mutex_unlock(&t->handoff_lock);
}

int handoff_push(custody_fuse_transport *t, custody_fuse_entry *entry) {
    int wants_worker = 0;
    pthread_mutex_lock(&t->handoff_lock);
    entry->next_handoff = NULL;
    if (t->handoff_tail) t->handoff_tail->next_handoff = entry; else t->handoff_head = entry;
    t->handoff_tail = entry;
    t->queued++;
    // More requests waiting than idle workers to take them: one more worker, if allowed.
    if (t->queued > t->idle_workers && t->workers < t->most_workers) {
        t->workers++;
        wants_worker = 1;
    }
    if (t->idle_workers > 0) pthread_cond_signal(&t->handoff_ready);
    pthread_mutex_unlock(&t->handoff_lock);
    return wants_worker;
}

static int take(custody_fuse_transport *t, void **request, size_t *length, custody_fuse_entry **taken, int wait) {
    pthread_mutex_lock(&t->handoff_lock);
    custody_fuse_entry *entry;
    while (!(entry = pop(t))) {
        if (t->handoff_stopping || !wait) {
            pthread_mutex_unlock(&t->handoff_lock);
            return 0;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += WORKER_IDLE_SECONDS;
        t->idle_workers++;
        int waited = pthread_cond_timedwait(&t->handoff_ready, &t->handoff_lock, &deadline);
        t->idle_workers--;
        // Idle for a while, and not the last worker: it ends (a burst of waiting requests is over).
        if (waited == ETIMEDOUT && !t->handoff_head && t->workers > 1) {
            t->workers--;
            pthread_mutex_unlock(&t->handoff_lock);
            return -1;
        }
    }
    pthread_mutex_unlock(&t->handoff_lock);
    *request = entry->request;
    *length = entry->request_length;
    *taken = entry;
    return 1;
}

int custody_fuse_handoff_take(custody_fuse_transport *t, void **request, size_t *length, custody_fuse_entry **entry) {
    return take(t, request, length, entry, 1);
}

int custody_fuse_handoff_take_now(custody_fuse_transport *t, void **request, size_t *length, custody_fuse_entry **entry) {
    return take(t, request, length, entry, 0);
}

void custody_fuse_handoff_worker_failed(custody_fuse_transport *t) {
    pthread_mutex_lock(&t->handoff_lock);
    if (t->workers > 0) t->workers--;
    pthread_mutex_unlock(&t->handoff_lock);
}

void custody_fuse_handoff_stop(custody_fuse_transport *t) {
    pthread_mutex_lock(&t->handoff_lock);
    t->handoff_stopping = 1;
    pthread_cond_broadcast(&t->handoff_ready);
    pthread_mutex_unlock(&t->handoff_lock);
}
