#define _GNU_SOURCE
#include "clinux.h"
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <linux/falloc.h>
#include <unistd.h>
#include <sys/socket.h>

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
int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags) {
    return setxattr(path, name, value, size, flags);
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
