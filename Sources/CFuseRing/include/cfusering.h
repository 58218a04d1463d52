// FUSE over io_uring (Linux 6.14+): the kernel hands each request to a ring entry of the queue of
// the CPU the caller runs on, and takes the answer back through the same entry. Written in C
// because liburing is static inline functions over shared ring memory and the FUSE ring ABI is C
// structs; Swift (CustodyFUSE's `RequestRings`) runs the threads and decides when to use it.
//
// libfuse 3.14 knows nothing of rings, so requests that arrive on a ring are handed to libfuse's
// own parser (`fuse_session_process_buf`) as one contiguous buffer, and its answers come back
// through a custom I/O (`fuse_session_custom_io`) that writes them into the ring entry instead of
// /dev/fuse. The same custom I/O reads every /dev/fuse request, to see the flags libfuse drops
// (`custody_fuse_request_kills_suidgid`). Everything else (INIT, FORGET, INTERRUPT,
// notifications, and every request until the rings are ready or when they never are) keeps going
// through /dev/fuse.
//
// The parts, one file each: `transport.c` (the custom I/O and where an answer goes), `ring.c`
// (one CPU's ring: its entries, the wait for requests, commits), `handoff.c` (requests that may
// wait, served by worker threads), `requests.c` (what a request asks for), `threads.c` (CPUs,
// pinning, priorities).
//
// Lifetimes. A ring is created, served and stopped by one thread; its entries' requests may be
// served on other threads (hand-off) or answered from anywhere. A ring is destroyed only once its
// thread has returned and no worker can still hold one of its entries (`RequestRings.stop`):
// nothing in this module reads another ring's memory, and answers from other threads find their
// entry under the transport's lock, which a ring's destruction takes too.
#ifndef CFUSERING_H
#define CFUSERING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fuse_session;

/// One mount's rings and the custom I/O in front of its /dev/fuse descriptor.
typedef struct custody_fuse_transport custody_fuse_transport;
/// One CPU's ring: an io_uring of its own with several entries, served by one thread.
typedef struct custody_fuse_ring custody_fuse_ring;
/// One ring entry: the buffers one request and its answer pass through.
typedef struct custody_fuse_entry custody_fuse_entry;

// MARK: transport

/// Installs the custom I/O on a mounted session (before its loop starts). `key` is the session's
/// userdata, which libfuse passes back to the I/O calls. `workers`: the most threads serving
/// requests that may wait (see `custody_fuse_ring_next`). NULL with `*error` set on failure.
custody_fuse_transport *custody_fuse_transport_install(struct fuse_session *session, void *key, int workers, int *error);

/// Asks for FUSE_OVER_IO_URING in the INIT answer (call before the loop reads INIT, and only when
/// a ring will be registered for every queue: until they are, the kernel holds requests).
void custody_fuse_transport_offer_rings(custody_fuse_transport *transport);

/// Whether INIT was answered with the ring flag (then the kernel waits for every queue).
int custody_fuse_transport_rings_offered(const custody_fuse_transport *transport);

/// The largest answer payload libfuse may send (max_write), known once INIT was answered; 0 before.
uint32_t custody_fuse_transport_max_write(const custody_fuse_transport *transport);

/// Forgets the transport and unmaps every entry's buffers (after every ring is destroyed and the
/// session is destroyed: the kernel may write into a registered buffer until the connection is gone).
void custody_fuse_transport_remove(custody_fuse_transport *transport);

/// The transport answers INIT with FUSE_HANDLE_KILLPRIV_V2 whenever the kernel offers it: the
/// kernel then leaves clearing set-user-ID and set-group-ID on write, truncate and chown to the
/// file system, which finds out when to through `custody_fuse_request_kills_suidgid`.
///
/// Whether the request the calling thread serves (a WRITE, SETATTR or OPEN) asks the file
/// system to clear the file's set-user-ID bit, and its set-group-ID bit where group execution is
/// allowed. The kernel asks so when the writing, truncating or chowning process lacks
/// CAP_FSETID; direct (O_DIRECT) writes carry it on every kernel, whatever INIT said.
int custody_fuse_request_kills_suidgid(void);

// MARK: rings

/// Creates the io_uring of queue `qid`. Call it on the thread that will serve it.
custody_fuse_ring *custody_fuse_ring_create(custody_fuse_transport *transport, unsigned qid, int *error);

/// Registers the ring's first entries with the kernel (`payload_size`: at least the kernel's
/// largest request), and again those the kernel refused with EAGAIN. 0, or -errno: -EAGAIN while
/// INIT is not answered yet (try again), others final.
int custody_fuse_ring_register(custody_fuse_ring *ring, size_t payload_size);

/// What `custody_fuse_ring_next` saw.
enum custody_fuse_ring_event {
    /// A request for this thread to serve now: `*request` (`*length` bytes, laid out as read from
    /// /dev/fuse) in `*entry`. Serve it between `custody_fuse_entry_begin` and `_end`.
    CUSTODY_RING_REQUEST = 1,
    /// `custody_fuse_ring_stop` was called.
    CUSTODY_RING_STOPPED = 2,
    /// A request that may wait (an fsync, a large write …) went to the workers' queue
    /// (`custody_fuse_handoff_take`), so the ring goes on taking requests meanwhile.
    CUSTODY_RING_HANDED_OFF = 3,
    /// As HANDED_OFF, and no worker is free while fewer than the most run: start one (or, if that
    /// fails, call `custody_fuse_handoff_worker_failed` and serve the queue with `_take_now`).
    CUSTODY_RING_WANTS_WORKER = 4,
};

/// Sends the answers that are ready and waits for the next request. Returns an event, or -errno
/// (-ENOTCONN, -ECONNABORTED: the connection went away).
int custody_fuse_ring_next(custody_fuse_ring *ring, void **request, size_t *length, custody_fuse_entry **entry);

/// Makes the ring's thread return CUSTODY_RING_STOPPED from `next` (any thread).
void custody_fuse_ring_stop(custody_fuse_ring *ring);

/// Frees the ring (after its thread returned from `next` for the last time and no worker holds
/// one of its entries). Its entries' buffers stay mapped until the transport is removed.
void custody_fuse_ring_destroy(custody_fuse_ring *ring);

/// Gives back the memory that requests left in the entries added beyond the first few (a burst
/// of large requests that waited made them): the ring's thread does it when it next runs, for
/// each such entry no request is in. Any thread.
void custody_fuse_ring_release_memory(custody_fuse_ring *ring);

/// Entries the ring has registered (it starts with a few and adds more while requests that may
/// wait hold them, up to a limit).
int custody_fuse_ring_entries(const custody_fuse_ring *ring);

/// Whether `custody_fuse_ring_work_pending` can tell (the kernel sets the flag it reads).
int custody_fuse_ring_reports_pending(const custody_fuse_ring *ring);

/// Whether something (a request, a wake-up) waits for the ring's thread to run. Any thread, while
/// the ring exists.
int custody_fuse_ring_work_pending(const custody_fuse_ring *ring);

// MARK: serving one request

/// Marks the calling thread as serving the entry's request (its answer goes into the entry).
void custody_fuse_entry_begin(custody_fuse_entry *entry);

/// The handler returned. Once the request is answered too (now, or later from any thread), the
/// answer is committed by the ring's thread. 1 when the request showed the store slow: a change
/// or a large READ or WRITE that took 10 ms or more, after which changes go to workers for 10 s.
int custody_fuse_entry_end(custody_fuse_entry *entry);

/// For the thread serving a request whose arguments are all in its headers (READ): the entry's
/// payload buffer, where an answer of up to `size` bytes can be built and then sent without a
/// copy (answer with a pointer to it). NULL when not serving such a request from a ring, or when
/// `size` does not fit. `sensitive`: the bytes are an encrypted file's plaintext, zeroed once sent.
void *custody_fuse_ring_borrow_payload(size_t size, int sensitive);

// MARK: requests that may wait

/// Waits for a handed-off request. 1 with the request (serve it between `custody_fuse_entry_begin`
/// and `_end`), 0 once `custody_fuse_handoff_stop` was called and the queue is empty, -1 when the
/// calling worker should end because it had nothing to do for a while and another worker is left
/// (it is no longer counted then).
int custody_fuse_handoff_take(custody_fuse_transport *transport, void **request, size_t *length, custody_fuse_entry **entry);

/// As `take`, without waiting: 0 when the queue is empty.
int custody_fuse_handoff_take_now(custody_fuse_transport *transport, void **request, size_t *length, custody_fuse_entry **entry);

/// A worker asked for by CUSTODY_RING_WANTS_WORKER could not be started.
void custody_fuse_handoff_worker_failed(custody_fuse_transport *transport);

/// Lets every worker return from `take` once the queue is empty (after the rings' threads stopped,
/// so that nothing more is handed off).
void custody_fuse_handoff_stop(custody_fuse_transport *transport);

// MARK: threads and CPUs

/// Pins the calling thread to one CPU. 0, or an errno.
int custody_pin_thread(int cpu);

/// Lets the calling thread run on every CPU the process could when the transport was installed,
/// at normal priority (a worker started by a pinned, idle-priority ring thread). 0, or an errno.
int custody_unpin_thread(const custody_fuse_transport *transport);

/// The calling thread's ID.
pid_t custody_thread_id(void);

/// Puts a thread of this process at idle priority (SCHED_IDLE) or back at normal (SCHED_OTHER).
/// 0, or an errno.
int custody_thread_set_idle_priority(pid_t thread, int idle);

/// Number of queues the kernel keeps: one per possible CPU.
int custody_fuse_possible_cpus(void);

#endif
