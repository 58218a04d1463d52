// Linux and GNU extensions that Swift's Glibc module does not show, because it is built
// without _GNU_SOURCE. The values and calls live in clinux.c, compiled with _GNU_SOURCE.
#ifndef CLINUX_H
#define CLINUX_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern const int clinux_O_PATH;
extern const int clinux_O_DIRECT;
extern const int clinux_O_NOATIME;
extern const int clinux_O_TMPFILE;
extern const int clinux_AT_EMPTY_PATH;
extern const int clinux_SEEK_DATA;
extern const int clinux_SEEK_HOLE;
extern const unsigned int clinux_RENAME_NOREPLACE;
extern const unsigned int clinux_RENAME_EXCHANGE;
extern const unsigned int clinux_RENAME_WHITEOUT;
extern const long clinux_UTIME_NOW;
extern const long clinux_UTIME_OMIT;
extern const int clinux_XATTR_CREATE;
extern const int clinux_XATTR_REPLACE;
extern const int clinux_FALLOC_FL_KEEP_SIZE;
extern const int clinux_FALLOC_FL_PUNCH_HOLE;

/// Drops `capability` from the calling thread's effective set (other threads keep theirs) and
/// remembers the thread's sets; 0 on success.
int clinux_thread_drop_capability(int capability);
/// Sets the calling thread's filesystem uid and puts back the effective capabilities that the
/// change cleared (as remembered by clinux_thread_drop_capability); returns the previous fsuid.
int clinux_thread_set_fsuid_keeping_capabilities(uid_t uid);
/// Gives the calling thread a file-system context (cwd, root, umask) of its own: unshare(CLONE_FS).
int clinux_unshare_fs(void);
int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);
int clinux_fallocate(int fd, int mode, int64_t offset, int64_t length);
ssize_t clinux_copy_file_range(int fd_in, int64_t *off_in, int fd_out, int64_t *off_out, size_t len, unsigned int flags);
/// Sets the calling thread's filesystem uid / gid; returns the previous value.
int clinux_setfsuid(uid_t uid);
int clinux_setfsgid(gid_t gid);
pid_t clinux_gettid(void);
/// Sets the calling thread's supplementary groups only (the raw syscall; glibc's wrapper changes every thread).
int clinux_thread_setgroups(size_t size, const gid_t *list);

ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size);
ssize_t clinux_lgetxattr(const char *path, const char *name, void *value, size_t size);
/* getxattrat(2) (Linux 6.13): attribute `name` of `path` relative to `directory`, not following a
   final symlink. -1 with errno ENOSYS on older kernels. */
ssize_t clinux_getxattrat(int directory, const char *path, const char *name, void *value, size_t size);
/* setxattrat(2) (Linux 6.13): sets attribute `name` of `path` relative to `directory`, not
   following a final symlink. -1 with errno ENOSYS on older kernels. */
int clinux_setxattrat(int directory, const char *path, const char *name, const void *value, size_t size, int flags);
/* fchmodat2(2) (Linux 6.6) with AT_EMPTY_PATH: the mode of what `fd` (O_PATH included) refers
   to. -1 with errno ENOSYS on older kernels. */
int clinux_fchmod_path(int fd, unsigned int mode);
int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags);
int clinux_lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags);
ssize_t clinux_listxattr(const char *path, char *list, size_t size);
int clinux_removexattr(const char *path, const char *name);
/* Gives free heap memory back to the kernel (malloc_trim). */
int clinux_release_free_memory(void);
/* Starts reading a range into the page cache without waiting (posix_fadvise WILLNEED). */
int clinux_will_need(int fd, long long offset, long long length);
/* Starts writeback of the file's dirty pages without waiting for it (sync_file_range). */
int clinux_start_writeback(int fd);
/* The same on an open (not O_PATH) descriptor: no path lookup. */
int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags);
ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size);
int clinux_fremovexattr(int fd, const char *name);

/* Work on a file mapping that may shrink underneath (see FileMapping.swift). The first call
   installs a SIGBUS handler that, for a thread inside clinux_guarded_call, abandons the call;
   any other SIGBUS goes to the handler that was there before (or kills the process, as before).
   clinux_guarded_call returns 0 once body(context) has returned, or -1 when body touched a mapped
   page that the file no longer backs (body was abandoned part-way: it must hold nothing that needs
   releasing). */
int clinux_install_fault_guard(void);
int clinux_guarded_call(void (*body)(void *), void *context);

/// The peer of a connected Unix socket (SO_PEERCRED); 0 on success, -1 with errno.
int clinux_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* Whether the peer of a connected Unix socket had group `group` (primary or supplementary) when
   it connected (SO_PEERCRED, SO_PEERGROUPS): 1 yes, 0 no, -1 with errno. */
int clinux_peer_in_group(int fd, gid_t group);

/* Sends one byte with `count` descriptors (SCM_RIGHTS) on a Unix socket; 0, or -1 with errno. */
int clinux_send_descriptors(int socket, const int *fds, int count);
/* Receives one message of at most one byte and up to `capacity` descriptors (close-on-exec).
   Returns the number of descriptors (0 at end of file), or -1 with errno; `*byte` gets the byte. */
int clinux_receive_descriptors(int socket, unsigned char *byte, int *fds, int capacity);

/* An anonymous, empty regular file in memory (memfd_create with MFD_CLOEXEC); -1 with errno. */
int clinux_memfd(const char *name);
/* Closes every descriptor from `first` up (close_range, or a loop where it is missing). */
void clinux_close_from(int first);
/* The calling process gets SIGKILL when its parent dies (PR_SET_PDEATHSIG). */
int clinux_die_with_parent(void);
/* PR_SET_NO_NEW_PRIVS and no core dumps (PR_SET_DUMPABLE 0). */
int clinux_no_new_privileges(void);
/* No core dump of this process, whatever core_pattern and systemd-coredump say: RLIMIT_CORE 0
   and PR_SET_DUMPABLE 0 (the kernel then writes no dump at all). 0, or -1 with errno. */
int clinux_disable_core_dumps(void);
/* Keeps [address, address + length) out of core dumps (MADV_DONTDUMP) and, with `lock`, out of
   swap (mlock, as far as the locked-memory limit allows). Returns 1 when locked, 0 when not. */
int clinux_protect_memory(void *address, size_t length, int lock);
/* The soft RLIMIT_MEMLOCK in bytes; -1 for no limit. */
long long clinux_memlock_limit(void);
/* Takes every file system access away from the process (a Landlock ruleset that handles all
   access rights and allows none). Returns the Landlock ABI version used, or -1 with errno
   (ENOSYS or EOPNOTSUPP: the kernel has no Landlock). */
int clinux_landlock_deny_filesystem(void);
/* Lets the process (and everything it starts) create, change, remove and rename files only
   beneath `paths` (directories, or single files such as /dev/null); reading and running stay
   as they were. Sets PR_SET_NO_NEW_PRIVS (Landlock needs it without CAP_SYS_ADMIN). Paths that
   do not exist are skipped. Returns the Landlock ABI version used, or -1 with errno (ENOSYS or
   EOPNOTSUPP: the kernel has no Landlock). */
int clinux_landlock_restrict_writes(const char *const *paths, int count);

/// The type (statfs magic number) of the file system holding `fd`; -1 with errno on failure.
long clinux_filesystem_type(int fd);

/* The guard (CustodyGuard): permission events for opens, process events, open calls. */

/* A fanotify group for permission events on opens (FAN_CLASS_CONTENT, FAN_REPORT_TID,
   non-blocking, close-on-exec; event descriptors O_RDONLY). -1 with errno. */
int clinux_guard_group(void);
/* Adds (add != 0) or removes the FAN_OPEN_PERM mark of the whole file system holding `path`. */
int clinux_guard_mark(int group, const char *path, int add);
/* Removes every file-system mark of the group. */
int clinux_guard_unmark_all(int group);
struct clinux_open_event {
    int fd;  /* the file being opened (the group's own descriptor; answer it, then it is closed) */
    int tid; /* the thread that opens it */
};
/* Reads the pending events (at most `capacity`): their number, 0 when none, -1 with errno. An
   event that carries no descriptor (the queue overflowed) is answered by the caller's next read. */
int clinux_guard_read(int group, struct clinux_open_event *events, int capacity);
/* Answers an event (allow != 0: FAN_ALLOW, else FAN_DENY) and closes its descriptor. */
int clinux_guard_answer(int group, int fd, int allow);

/* A non-blocking, close-on-exec eventfd (a counter one thread adds to and another waits on); -1 with errno. */
int clinux_wake_descriptor(void);

/* Process events from the kernel's proc connector (NETLINK_CONNECTOR, CN_IDX_PROC). */
enum { CLINUX_PROCESS_FORK = 1, CLINUX_PROCESS_EXEC = 2, CLINUX_PROCESS_EXIT = 3 };
struct clinux_process_event {
    int what;
    int pid;         /* fork: the new task; exec, exit: the task */
    int tgid;        /* its process */
    int parent_pid;  /* fork: the task that forked */
    int parent_tgid; /* fork: its process */
};
/* A non-blocking, close-on-exec socket subscribed to fork, exec and exit events; -1 with errno. */
int clinux_process_events_open(void);
/* Reads pending events (at most `capacity`): their number, 0 when none, -1 with errno (ENOBUFS:
   events were lost, the reader must look at /proc again). */
int clinux_process_events_read(int fd, struct clinux_process_event *events, int capacity);

/* One connected Unix socket of the machine: its inode, its peer's, and whether it has an address
   (a service's socket, and the sockets it accepted; the two ends of a socketpair have none). */
struct clinux_unix_socket {
    uint64_t inode;
    uint64_t peer;
    int named;
};
/* Every connected Unix socket (sock_diag), at most `capacity`: their number, or -1 with errno. */
int clinux_unix_sockets(struct clinux_unix_socket *sockets, int capacity);

/* What thread `tid`, stopped in an open call (open, openat, openat2, creat, open_by_handle_at),
   asked for: its open flags, read from /proc/TID/syscall (and, for openat2, its memory); an
   execve or execveat opens to read. 0 with *flags set; -1 when the thread is in no such call (an
   io_uring worker). */
int clinux_open_call_flags(int tid, long long *flags);

#endif

/// The symbolic name of an error number ("ENOENT"), or NULL when glibc knows none.
const char *clinux_errno_name(int error);

/// Names the calling thread: its first 15 bytes are what `top -H`, `ps -L`, gdb and
/// /proc/PID/task/TID/comm show.
void clinux_set_thread_name(const char *name);
