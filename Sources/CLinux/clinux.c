#define _GNU_SOURCE
#include "clinux.h"
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <linux/falloc.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <signal.h>
#include <errno.h>
#include <linux/landlock.h>

const int clinux_O_PATH = O_PATH;
const int clinux_O_DIRECT = O_DIRECT;
const int clinux_O_NOATIME = O_NOATIME;
const int clinux_O_TMPFILE = O_TMPFILE;
const int clinux_AT_EMPTY_PATH = AT_EMPTY_PATH;
const int clinux_SEEK_DATA = SEEK_DATA;
const int clinux_SEEK_HOLE = SEEK_HOLE;
const unsigned int clinux_RENAME_NOREPLACE = RENAME_NOREPLACE;
const unsigned int clinux_RENAME_EXCHANGE = RENAME_EXCHANGE;
const unsigned int clinux_RENAME_WHITEOUT = RENAME_WHITEOUT;
const long clinux_UTIME_NOW = UTIME_NOW;
const long clinux_UTIME_OMIT = UTIME_OMIT;
const int clinux_XATTR_CREATE = XATTR_CREATE;
const int clinux_XATTR_REPLACE = XATTR_REPLACE;
const int clinux_FALLOC_FL_KEEP_SIZE = FALLOC_FL_KEEP_SIZE;
const int clinux_FALLOC_FL_PUNCH_HOLE = FALLOC_FL_PUNCH_HOLE;

int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}

int clinux_fallocate(int fd, int mode, int64_t offset, int64_t length) {
    return fallocate(fd, mode, (off_t)offset, (off_t)length);
}

ssize_t clinux_copy_file_range(int fd_in, int64_t *off_in, int fd_out, int64_t *off_out, size_t len, unsigned int flags) {
    return copy_file_range(fd_in, (off_t *)off_in, fd_out, (off_t *)off_out, len, flags);
}

int clinux_setfsuid(uid_t uid) { return setfsuid(uid); }
int clinux_setfsgid(gid_t gid) { return setfsgid(gid); }
pid_t clinux_gettid(void) { return gettid(); }

int clinux_thread_setgroups(size_t size, const gid_t *list) {
    return (int)syscall(SYS_setgroups, size, list);
}

ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size) {
    return getxattr(path, name, value, size);
}
ssize_t clinux_lgetxattr(const char *path, const char *name, void *value, size_t size) {
    return lgetxattr(path, name, value, size);
}

#ifndef SYS_getxattrat
#define SYS_getxattrat 464
#endif

ssize_t clinux_getxattrat(int directory, const char *path, const char *name, void *value, size_t size) {
    /* struct xattr_args of Linux 6.13. */
    struct { unsigned long long value; unsigned int size; unsigned int flags; } args = {
        (unsigned long long)(uintptr_t)value, (unsigned int)size, 0 };
    if (size > 0xFFFFFFFFu) { errno = EINVAL; return -1; }
    return syscall(SYS_getxattrat, directory, path, AT_SYMLINK_NOFOLLOW, name, &args, sizeof(args));
}

#ifndef SYS_setxattrat
#define SYS_setxattrat 463
#endif

int clinux_setxattrat(int directory, const char *path, const char *name, const void *value, size_t size, int flags) {
    /* struct xattr_args of Linux 6.13. */
    struct { unsigned long long value; unsigned int size; unsigned int flags; } args = {
        (unsigned long long)(uintptr_t)value, (unsigned int)size, (unsigned int)flags };
    if (size > 0xFFFFFFFFu) { errno = EINVAL; return -1; }
    return (int)syscall(SYS_setxattrat, directory, path, AT_SYMLINK_NOFOLLOW, name, &args, sizeof(args));
}

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

int clinux_fchmod_path(int fd, unsigned int mode) {
    return (int)syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH);
}

int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags) {
    return setxattr(path, name, value, size, flags);
}
int clinux_lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags) {
    return lsetxattr(path, name, value, size, flags);
}
ssize_t clinux_listxattr(const char *path, char *list, size_t size) {
    return listxattr(path, list, size);
}
int clinux_removexattr(const char *path, const char *name) {
    return removexattr(path, name);
}
int clinux_release_free_memory(void) {
    return malloc_trim(0);
}
int clinux_will_need(int fd, long long offset, long long length) {
    return posix_fadvise(fd, (off_t)offset, (off_t)length, POSIX_FADV_WILLNEED);
}
int clinux_start_writeback(int fd) {
    return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}
int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags) {
    return fsetxattr(fd, name, value, size, flags);
}
ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size) {
    return fgetxattr(fd, name, value, size);
}
int clinux_fremovexattr(int fd, const char *name) {
    return fremovexattr(fd, name);
}

int clinux_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred credentials;
    socklen_t length = sizeof credentials;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return -1;
    *pid = credentials.pid;
    *uid = credentials.uid;
    *gid = credentials.gid;
    return 0;
}

/* The guarded call in progress on this thread, if any: where its SIGBUS should land. */
static __thread sigjmp_buf *fault_guard;
static struct sigaction sigbus_before;
static pthread_once_t fault_guard_once = PTHREAD_ONCE_INIT;
static int fault_guard_result = -1;

static void on_sigbus(int signal_number, siginfo_t *info, void *context) {
    sigjmp_buf *jump = fault_guard;
    if (jump != NULL) {
        fault_guard = NULL;
        siglongjmp(*jump, 1);
    }
    if ((sigbus_before.sa_flags & SA_SIGINFO) && sigbus_before.sa_sigaction != NULL) {
        sigbus_before.sa_sigaction(signal_number, info, context);
        return;
    }
    if (!(sigbus_before.sa_flags & SA_SIGINFO) && sigbus_before.sa_handler != SIG_DFL && sigbus_before.sa_handler != SIG_IGN) {
        sigbus_before.sa_handler(signal_number);
        return;
    }
    /* Nothing else wanted it: returning re-runs the faulting access, which now gets the default action. */
    signal(SIGBUS, SIG_DFL);
}

static void install_fault_guard(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigbus;
    sigemptyset(&action.sa_mask);
    /* SA_NODEFER: the jump out of the handler leaves SIGBUS unblocked without saving the signal
       mask in every copy (sigsetjmp with a mask costs a system call). */
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    fault_guard_result = sigaction(SIGBUS, &action, &sigbus_before);
}

int clinux_install_fault_guard(void) {
    pthread_once(&fault_guard_once, install_fault_guard);
    return fault_guard_result;
}

int clinux_guarded_call(void (*body)(void *), void *context) {
    sigjmp_buf jump;
    if (sigsetjmp(jump, 0) != 0) return -1;
    fault_guard = &jump;
    __asm__ volatile("" ::: "memory");
    body(context);
    __asm__ volatile("" ::: "memory");
    fault_guard = NULL;
    return 0;
}

int clinux_peer_in_group(int fd, gid_t group) {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    if (clinux_peer_credentials(fd, &pid, &uid, &gid) != 0) return -1;
    if (gid == group) return 1;
    gid_t groups[256];
    socklen_t length = sizeof groups;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &length) != 0) return errno == ERANGE ? 0 : -1;
    for (size_t i = 0; i < length / sizeof(gid_t); i++) if (groups[i] == group) return 1;
    return 0;
}

int clinux_send_descriptors(int socket, const int *fds, int count) {
    if (count < 1 || count > 4) { errno = EINVAL; return -1; }
    unsigned char byte = 1;
    struct iovec vector = { .iov_base = &byte, .iov_len = 1 };
    union { char buffer[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } control;
    memset(&control, 0, sizeof(control));
    struct msghdr message = { .msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer,
                              .msg_controllen = CMSG_SPACE(count * sizeof(int)) };
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(count * sizeof(int));
    memcpy(CMSG_DATA(header), fds, count * sizeof(int));
    ssize_t sent;
    do { sent = sendmsg(socket, &message, MSG_NOSIGNAL); } while (sent < 0 && errno == EINTR);
    return sent == 1 ? 0 : -1;
}

int clinux_receive_descriptors(int socket, unsigned char *byte, int *fds, int capacity) {
    if (capacity < 1 || capacity > 4) { errno = EINVAL; return -1; }
    struct iovec vector = { .iov_base = byte, .iov_len = 1 };
    union { char buffer[CMSG_SPACE(4 * sizeof(int))]; struct cmsghdr align; } control;
    struct msghdr message = { .msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.buffer,
                              .msg_controllen = sizeof(control.buffer) };
    ssize_t got;
    do { got = recvmsg(socket, &message, MSG_CMSG_CLOEXEC); } while (got < 0 && errno == EINTR);
    if (got <= 0) return (int)got;
    int count = 0;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); header; header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
        int n = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int received[4];
        if (n > 4) n = 4;
        memcpy(received, CMSG_DATA(header), n * sizeof(int));
        for (int i = 0; i < n; i++) {
            if (count < capacity) fds[count++] = received[i];
            else close(received[i]);
        }
    }
    /* A message whose descriptors were cut (MSG_CTRUNC) is refused: close what came. */
    if (message.msg_flags & MSG_CTRUNC) {
        for (int i = 0; i < count; i++) close(fds[i]);
        errno = EMSGSIZE;
        return -1;
    }
    return count;
}

int clinux_memfd(const char *name) { return memfd_create(name, MFD_CLOEXEC); }

void clinux_close_from(int first) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned int)first, ~0U, 0) == 0) return;
#endif
    long limit = sysconf(_SC_OPEN_MAX);
    if (limit < 0 || limit > 65536) limit = 65536;
    for (int fd = first; fd < limit; fd++) close(fd);
}

int clinux_die_with_parent(void) { return prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); }

int clinux_no_new_privileges(void) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

#if defined(SYS_landlock_create_ruleset) && defined(SYS_landlock_restrict_self) && defined(SYS_landlock_add_rule)
/* The rights that create, change, remove or move files, as far as Landlock ABI `abi` knows them. */
static __u64 landlock_write_rights(long abi) {
    __u64 rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
        LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
        LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK |
        LANDLOCK_ACCESS_FS_MAKE_SYM;
#ifdef LANDLOCK_ACCESS_FS_REFER
    if (abi >= 2) rights |= LANDLOCK_ACCESS_FS_REFER;
#endif
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
    if (abi >= 3) rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
#endif
    return rights;
}

/* Restricts the calling process with `ruleset` and closes it: the ABI version, or -1 (errno). */
static int landlock_enforce(int ruleset, long abi) {
    int result = (int)syscall(SYS_landlock_restrict_self, ruleset, 0);
    int saved = errno;
    close(ruleset);
    errno = saved;
    return result == 0 ? (int)abi : -1;
}
#endif

int clinux_landlock_deny_filesystem(void) {
#if defined(SYS_landlock_create_ruleset) && defined(SYS_landlock_restrict_self) && defined(SYS_landlock_add_rule)
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) return -1;
    struct landlock_ruleset_attr attributes = { 0 };
    attributes.handled_access_fs = landlock_write_rights(abi) | LANDLOCK_ACCESS_FS_EXECUTE |
        LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attributes, sizeof(attributes), 0);
    if (ruleset < 0) return -1;
    return landlock_enforce(ruleset, abi);
#else
    errno = ENOSYS;
    return -1;
#endif
}

int clinux_landlock_restrict_writes(const char *const *paths, int count) {
#if defined(SYS_landlock_create_ruleset) && defined(SYS_landlock_restrict_self) && defined(SYS_landlock_add_rule)
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) return -1;
    __u64 handled = landlock_write_rights(abi);
    /* What a single file (not a directory) may be granted. */
    __u64 file_rights = handled & (LANDLOCK_ACCESS_FS_WRITE_FILE
#ifdef LANDLOCK_ACCESS_FS_TRUNCATE
        | LANDLOCK_ACCESS_FS_TRUNCATE
#endif
        );
    struct landlock_ruleset_attr attributes = { 0 };
    attributes.handled_access_fs = handled;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attributes, sizeof(attributes), 0);
    if (ruleset < 0) return -1;
    for (int i = 0; i < count; i++) {
        int fd = open(paths[i], O_PATH | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat info;
        if (fstat(fd, &info) != 0) { close(fd); continue; }
        struct landlock_path_beneath_attr rule = { 0 };
        rule.parent_fd = fd;
        rule.allowed_access = S_ISDIR(info.st_mode) ? handled : file_rights;
        long added = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
        int saved = errno;
        close(fd);
        if (added != 0) { close(ruleset); errno = saved; return -1; }
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) { int saved = errno; close(ruleset); errno = saved; return -1; }
    return landlock_enforce(ruleset, abi);
#else
    (void)paths;
    (void)count;
    errno = ENOSYS;
    return -1;
#endif
}

int clinux_disable_core_dumps(void) {
    struct rlimit none = { 0, 0 };
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

int clinux_protect_memory(void *address, size_t length, int lock) {
    (void)madvise(address, length, MADV_DONTDUMP);
    return lock && mlock(address, length) == 0 ? 1 : 0;
}

long long clinux_memlock_limit(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return 0;
    return limit.rlim_cur == RLIM_INFINITY ? -1 : (long long)limit.rlim_cur;
}

const char *clinux_errno_name(int error) {
    return strerrorname_np(error);
}

long clinux_filesystem_type(int fd) {
    struct statfs info;
    if (fstatfs(fd, &info) != 0) return -1;
    return (long)info.f_type;
}

int clinux_unshare_fs(void) {
    return unshare(CLONE_FS);
}

static __thread struct __user_cap_data_struct thread_capabilities[_LINUX_CAPABILITY_U32S_3];
static __thread int thread_capabilities_known;

int clinux_thread_drop_capability(int capability) {
    if (capability < 0 || capability >= 32 * _LINUX_CAPABILITY_U32S_3) { errno = EINVAL; return -1; }
    struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    if (syscall(SYS_capget, &header, data) != 0) return -1;
    data[capability / 32].effective &= ~(1u << (capability % 32));
    if (syscall(SYS_capset, &header, data) != 0) return -1;
    memcpy(thread_capabilities, data, sizeof(data));
    thread_capabilities_known = 1;
    return 0;
}

int clinux_thread_set_fsuid_keeping_capabilities(uid_t uid) {
    int previous = setfsuid(uid);
    if (thread_capabilities_known) {
        struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
        (void)syscall(SYS_capset, &header, thread_capabilities);
    }
    return previous;
}

void clinux_set_thread_name(const char *name) {
    char shown[16];
    strncpy(shown, name, sizeof(shown) - 1);
    shown[sizeof(shown) - 1] = 0;
    (void)pthread_setname_np(pthread_self(), shown);
}
