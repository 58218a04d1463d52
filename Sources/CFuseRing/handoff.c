// Requests that may wait (`request_may_wait`), handed off by the rings' threads to workers, so a
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
