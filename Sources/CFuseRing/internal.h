// What the files of CFuseRing share: the kernel's ring ABI, and the transport, ring and entry
// structures. Not part of the module's interface (include/cfusering.h is).
#ifndef CFUSERING_INTERNAL_H
#define CFUSERING_INTERNAL_H

#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include "cfusering.h"

#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>

// MARK: the FUSE-over-io_uring ABI (include/uapi/linux/fuse.h, protocol 7.42, Linux 6.14);
// Debian 12's kernel headers predate it.

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

// MARK: sizes

// Room in front of the payload for the request's two headers, so that a request is contiguous
// (as read from /dev/fuse) without copying its payload.
#define HEADROOM 4096
// Queues the kernel may have (one per possible CPU).
#define MAX_RINGS 1024
// Entries kept free for new requests while handed-off requests hold others.
#define ENTRIES_KEPT_FREE 2
// A ring registers at first room for every request nobody waits for that the kernel may send it
// at once (INIT's max_background, and one more the kernel allows each queue), and ENTRIES_KEPT_FREE
// more (`entries_at_start`). A request that finds no free entry waits in the kernel until an entry
// of its queue is committed; an entry registered later does not take it. Write-back and
// read-ahead on a slow store must therefore never hold every entry of a ring, or a caller's
// request behind them would wait for the store. Entries cost address space; their pages are
// touched only by the requests that use them, and given back after a burst.
#define ENTRIES_AT_START_LEAST 2
// The most entries of one ring. Beyond that, requests wait in the kernel for an entry.
#define ENTRIES_MOST 64
// READs and WRITEs of at least this many bytes are handed off (`request_kind`).
#define LARGE_IO (128 * 1024)
// Changes to the store, and large READs and WRITEs, that took this long, SLOW_REQUESTS of them
// within SLOW_WITHIN_SECONDS, show a store that does not keep up (a throttled, remote or failing
// disk): for SLOW_STORE_SECONDS after the last, changes go to the workers too (`store_is_slow`).
// One slow request alone does not: a healthy disk has them now and then (a journal commit, a
// directory's blocks freed), and a hand-off costs two thread wake-ups per request.
#define SLOW_NANOSECONDS (100ull * 1000 * 1000)
#define SLOW_REQUESTS 3
#define SLOW_WITHIN_SECONDS 2
#define SLOW_STORE_SECONDS 10
// A worker with nothing to do for this long ends, unless it is the last one.
#define WORKER_IDLE_SECONDS 10

// Nodes (files, directories) with handed-off requests in flight that the rings keep track of
// (`node_is_busy`); beyond that many, a node is not tracked.
#define BUSY_NODES 64

// io_uring user_data: entry i is tagged i + 1; the wake-up poll has a tag no entry has.
#define TAG_WAKE UINT64_MAX

// MARK: structures

/// How a request is served (`request_kind`): where it arrived; by a worker; or where it arrived
/// unless the store is slow, then by a worker.
enum request_kind { REQUEST_QUICK = 0, REQUEST_WAITS, REQUEST_CHANGES };

/// Where an entry's request stands (`progress`): both bits set, the ring's thread commits it.
enum { ENTRY_ANSWERED = 1, ENTRY_RETURNED = 2 };

/// Where an entry stands with the kernel (`state`): not registered yet (or refused with EAGAIN
/// before INIT was answered), registration sent, registered (requests come and go through it),
/// refused for good.
enum { ENTRY_NEW = 0, ENTRY_REGISTERING, ENTRY_IN_USE, ENTRY_DEAD };

struct custody_fuse_entry {
    custody_fuse_ring *ring;
    unsigned index;
    struct ring_request_header *header;
    char *payload;
    struct iovec iov[2];
    // Owned by whoever serves the request, from `take_request` to the commit.
    void *request;               // laid out as /dev/fuse delivers it, ending in the payload
    size_t request_length;
    uint64_t commit_id;
    uint32_t request_payload;    // bytes of the request in the payload (0: its arguments are all in the headroom)
    uint32_t opcode;             // of the request being served
    int kills_suidgid;           // the request asks for set-ID bits to go (see `note_request`)
    int kind;                    // `request_kind`
    uint64_t started;            // when a timed request began to be served (`request_is_timed`; monotonic ns)
    uint64_t nodeid;             // the node the request is about (its header's)
    int marks_busy;              // handed off and counted in the transport's busy nodes (`mark_busy`)
    int borrowed;                // the handler built its answer in the payload (`borrow_payload`)
    size_t read_answer;          // bytes of file content the last answer left in the payload
    size_t resident;             // bytes of the payload requests and answers have touched
    // An answer that cannot go into the payload yet (the handler may still read the request
    // there): kept here until the commit, then zeroed.
    char *stash;
    size_t stash_length;
    int stashed;
    // The ring's thread only.
    int state;                   // ENTRY_NEW, _REGISTERING, _IN_USE, _DEAD
    int held;                    // taken from the kernel and not committed yet
    // Shared.
    _Atomic uint64_t inflight;   // unique of the request not answered yet (0: none)
    _Atomic int progress;        // ENTRY_ANSWERED | ENTRY_RETURNED
    _Atomic int ready;           // answered and returned on another thread: the ring's thread commits it
    custody_fuse_entry *next_handoff;   // in the transport's hand-off queue
};

struct custody_fuse_ring {
    struct io_uring uring;
    custody_fuse_transport *transport;
    unsigned qid;
    int event_fd;
    size_t payload_size;         // set at the first registration
    // Entries are added by the ring's thread only; others read the count with acquire ordering
    // and then only entries below it (answers from elsewhere, under the transport's lock).
    custody_fuse_entry *entries[ENTRIES_MOST];
    _Atomic int entry_count;
    int held;                    // entries taken from the kernel and not committed yet
    int dead;                    // entries the kernel refused
    int zero_pending;            // some committed entry still holds a READ answer
    int failed_growth;           // adding an entry failed once: do not try again
    _Atomic int release_memory;  // give the added entries' touched payload back (`custody_fuse_ring_release_memory`)
    _Atomic int stopping;
};

struct custody_fuse_transport {
    void *key;
    int fd;
    cpu_set_t cpus;                  // where the process could run when the transport was installed
    _Atomic uint64_t init_unique;    // INIT read and not answered yet (0: none)
    _Atomic int kernel_offers_rings; // the kernel's INIT carried FUSE_OVER_IO_URING
    _Atomic int offer_rings;
    _Atomic int rings_offered;
    _Atomic int kernel_offers_killpriv; // the kernel's INIT carried FUSE_HANDLE_KILLPRIV_V2
    _Atomic uint32_t max_write;
    _Atomic uint32_t max_pages;
    _Atomic uint16_t max_background; // requests nobody waits for that the kernel sends at once (INIT)
    _Atomic uint64_t slow_until;     // the store is slow until then (monotonic ns; `store_is_slow`)
    uint64_t slow_seen[SLOW_REQUESTS];  // when the last slow requests ended (under handoff_lock)
    unsigned slow_next;
    // Nodes with handed-off requests in flight, and how many each (under handoff_lock).
    struct { uint64_t nodeid; int count; } busy[BUSY_NODES];
    _Atomic int busy_requests;       // handed-off requests counted in `busy` (read without the lock)
    // The ring list. Answers from elsewhere search it, and a ring leaves it before it is freed.
    pthread_mutex_t lock;
    custody_fuse_ring *rings[MAX_RINGS];
    _Atomic int ring_count;
    // Every buffer mapped for the rings (`map_buffer`), unmapped when the transport is removed.
    pthread_mutex_t mappings_lock;
    void **mappings;
    size_t *mapping_sizes;
    size_t mapping_count, mapping_capacity;
    // Requests that may wait, for the workers (handoff.c).
    pthread_mutex_t handoff_lock;
    pthread_cond_t handoff_ready;
    custody_fuse_entry *handoff_head, *handoff_tail;
    int queued, workers, idle_workers, most_workers;
    int handoff_stopping;
    custody_fuse_transport *next;
};

// MARK: shared functions

/// The entry the calling thread serves (set by `custody_fuse_entry_begin`).
extern _Thread_local custody_fuse_entry *current_entry;

/// Anonymous memory that outlives the rings (until the transport is removed); not dumped.
void *map_buffer(custody_fuse_transport *transport, size_t size);

/// Reads the set-ID flags of a request laid out as /dev/fuse delivers it (requests.c).
int request_kills_suidgid_flag(const void *request, size_t length);

/// How a request is served: a `request_kind` (requests.c).
int request_kind(const struct fuse_in_header *in, const void *operation, size_t operation_size,
                 const char *payload, size_t payload_size);

/// Whether how long serving the entry's request took tells how fast the store is (requests.c).
int request_is_timed(const custody_fuse_entry *entry);

/// Whether a change or a large READ or WRITE took long lately (handoff.c).
int store_is_slow(custody_fuse_transport *transport);

/// Notes how long a timed request took; 1 when that was slow (handoff.c).
int note_store_time(custody_fuse_transport *transport, uint64_t nanoseconds);

/// Whether a handed-off request about `nodeid` is in flight (handoff.c).
int node_is_busy(custody_fuse_transport *transport, uint64_t nodeid);

/// Counts a handed-off entry's node as busy until `unmark_busy` (handoff.c).
void mark_busy(custody_fuse_transport *transport, custody_fuse_entry *entry);
void unmark_busy(custody_fuse_transport *transport, custody_fuse_entry *entry);

/// Monotonic nanoseconds (handoff.c).
uint64_t monotonic_ns(void);

/// Sets the calling thread's set-ID flag for `custody_fuse_request_kills_suidgid` (transport.c).
void set_request_kills_suidgid(int kills);

/// Queues a handed-off entry for the workers; 1 when another worker should be started (handoff.c).
int handoff_push(custody_fuse_transport *transport, custody_fuse_entry *entry);

/// An answer the ring's thread commits: now when called on it, else it is woken (ring.c).
void entry_finished(custody_fuse_entry *entry);

#endif
