// FUSE over io_uring (Linux 6.14+): the kernel hands each request to a ring entry of the queue of
// the CPU the caller runs on, and takes the answer back through the same entry. Written in C
// because liburing is static inline functions over shared ring memory and the FUSE ring ABI is C
// structs; Swift (CustodyFUSE's `RequestRings`) runs the threads and decides when to use it.
//
// libfuse 3.14 knows nothing of rings, so requests that arrive on a ring are handed to libfuse's
// own parser (`fuse_session_process_buf`) as one contiguous buffer, and its answers come back
// through a custom I/O (`fuse_session_custom_io`) that writes them into the ring entry instead of
// /dev/fuse. The same custom I/O reads every /dev/fuse request, to see the flags libfuse drops
// (`custody_fuse_request_kills_suidgid`). Everything else (INIT, FORGET, INTERRUPT, notifications, and every request until
// the rings are ready or when they never are) keeps going through /dev/fuse.
#ifndef CFUSERING_H
#define CFUSERING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct fuse_session;

/// One mount's rings and the custom I/O in front of its /dev/fuse descriptor.
typedef struct custody_fuse_transport custody_fuse_transport;
/// One ring entry: an io_uring of its own, served by one thread.
typedef struct custody_fuse_ring custody_fuse_ring;

/// Installs the custom I/O on a mounted session (before its loop starts). `key` is the session's
/// userdata, which libfuse passes back to the I/O calls. NULL with `*error` set on failure.
custody_fuse_transport *custody_fuse_transport_install(struct fuse_session *session, void *key, int *error);

/// Asks for FUSE_OVER_IO_URING in the INIT answer (call before the loop reads INIT, and only when
/// a ring entry will be registered for every queue: until they are, the kernel holds requests).
void custody_fuse_transport_offer_rings(custody_fuse_transport *transport);

/// Whether INIT was answered with the ring flag (then the kernel waits for every queue).
int custody_fuse_transport_rings_offered(const custody_fuse_transport *transport);

/// The transport answers INIT with FUSE_HANDLE_KILLPRIV_V2 whenever the kernel offers it: the
/// kernel then leaves clearing set-user-ID and set-group-ID on write, truncate and chown to the
/// file system, which finds out when to through `custody_fuse_request_kills_suidgid`.
///
/// Whether the request the calling thread serves (a WRITE, SETATTR or OPEN) asks the file
/// system to clear the file's set-user-ID bit, and its set-group-ID bit where group execution is
/// allowed. The kernel asks so when the writing, truncating or chowning process lacks
/// CAP_FSETID; direct (O_DIRECT) writes carry it on every kernel, whatever INIT said.
int custody_fuse_request_kills_suidgid(void);

/// The largest answer payload libfuse may send (max_write), known once INIT was answered; 0 before.
uint32_t custody_fuse_transport_max_write(const custody_fuse_transport *transport);

/// Forgets the transport (after every ring is destroyed and the session loop has ended).
void custody_fuse_transport_remove(custody_fuse_transport *transport);

/// Pins the calling thread to one CPU. 0, or an errno.
int custody_pin_thread(int cpu);

/// The calling thread's ID.
pid_t custody_thread_id(void);

/// Puts a thread of this process at idle priority (SCHED_IDLE) or back at normal (SCHED_OTHER).
/// 0, or an errno.
int custody_thread_set_idle_priority(pid_t thread, int idle);

/// Number of queues the kernel keeps: one per possible CPU.
int custody_fuse_possible_cpus(void);

/// Creates the io_uring of one entry of queue `qid`. Call it on the thread that will serve it.
custody_fuse_ring *custody_fuse_ring_create(custody_fuse_transport *transport, unsigned qid, int *error);

/// Frees the entry's io_uring and buffers (on its thread, after its last `next`).
void custody_fuse_ring_destroy(custody_fuse_ring *ring);

/// Registers the entry's buffers with the kernel (`payload_size`: at least the kernel's largest
/// request). 0, or -errno: -EAGAIN while INIT is not answered yet (try again), others final.
int custody_fuse_ring_register(custody_fuse_ring *ring, size_t payload_size);

/// What `custody_fuse_ring_next` saw.
enum custody_fuse_ring_event {
    /// A request is in `*request` (`*length` bytes, laid out as read from /dev/fuse).
    CUSTODY_RING_REQUEST = 1,
    /// `custody_fuse_ring_stop` was called.
    CUSTODY_RING_STOPPED = 2,
};

/// Sends a queued answer (if any) and waits for the next request. Returns an event, or -errno
/// (-ENOTCONN when the connection went away).
int custody_fuse_ring_next(custody_fuse_ring *ring, void **request, size_t *length);

/// Whether the request last returned by `next` has been answered (libfuse answers through the
/// custom I/O; an answer from another thread is committed at the next `next`).
int custody_fuse_ring_answered(const custody_fuse_ring *ring);

/// For the thread serving a request whose arguments are all in its headers (READ): the entry's
/// payload buffer, where an answer of up to `size` bytes can be built and then sent without a
/// copy (answer with a pointer to it). NULL when not serving such a request from a ring, or when
/// `size` does not fit. `sensitive`: the bytes are an encrypted file's plaintext, zeroed once sent.
void *custody_fuse_ring_borrow_payload(size_t size, int sensitive);

/// Whether `custody_fuse_ring_work_pending` can tell (the kernel sets the flag it reads).
int custody_fuse_ring_reports_pending(const custody_fuse_ring *ring);

/// Whether something (a request, a wake-up) waits for the ring's thread to run. Any thread.
int custody_fuse_ring_work_pending(const custody_fuse_ring *ring);

/// Makes the ring's thread return CUSTODY_RING_STOPPED from `next` (any thread).
void custody_fuse_ring_stop(custody_fuse_ring *ring);

#endif
