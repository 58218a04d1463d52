// The kernel interfaces of the guard (Sources/CustodyGuard): fanotify permission events for
// opens, the proc connector's fork/exec/exit events, and the open flags of a stopped open call.
#define _GNU_SOURCE
#include "clinux.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/cn_proc.h>
#include <linux/connector.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/openat2.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/fanotify.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

int clinux_guard_group(void) {
    return fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK | FAN_REPORT_TID,
                         O_RDONLY | O_LARGEFILE | O_CLOEXEC);
}

int clinux_guard_mark(int group, const char *path, int add) {
    unsigned int flags = (add ? FAN_MARK_ADD : FAN_MARK_REMOVE) | FAN_MARK_FILESYSTEM;
    return fanotify_mark(group, flags, FAN_OPEN_PERM, AT_FDCWD, path);
}

int clinux_guard_unmark_all(int group) {
    return fanotify_mark(group, FAN_MARK_FLUSH | FAN_MARK_FILESYSTEM, 0, AT_FDCWD, "/");
}

int clinux_guard_read(int group, struct clinux_open_event *events, int capacity) {
    char buffer[4096] __attribute__((aligned(__alignof__(struct fanotify_event_metadata))));
    size_t room = (size_t)capacity * sizeof(struct fanotify_event_metadata);
    if (room > sizeof(buffer))
        room = sizeof(buffer);
    ssize_t length = read(group, buffer, room);
    if (length < 0)
        return errno == EAGAIN ? 0 : -1;
    int count = 0;
    struct fanotify_event_metadata *event = (struct fanotify_event_metadata *)buffer;
    while (FAN_EVENT_OK(event, length) && count < capacity) {
        if (event->vers == FANOTIFY_METADATA_VERSION && event->fd >= 0) {
            events[count].fd = event->fd;
            events[count].tid = event->pid;
            count++;
        }
        event = FAN_EVENT_NEXT(event, length);
    }
    return count;
}

int clinux_guard_answer(int group, int fd, int allow) {
    struct fanotify_response response = { .fd = fd, .response = allow ? FAN_ALLOW : FAN_DENY };
    ssize_t written;
    do {
        written = write(group, &response, sizeof(response));
    } while (written < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    errno = saved;
    return written == sizeof(response) ? 0 : -1;
}

int clinux_wake_descriptor(void) {
    return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

int clinux_process_events_open(void) {
    int fd = socket(PF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_CONNECTOR);
    if (fd < 0)
        return -1;
    // Room for bursts (a build starting hundreds of processes); as root past rmem_max.
    int size = 8 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
    struct sockaddr_nl address = { .nl_family = AF_NETLINK, .nl_groups = CN_IDX_PROC, .nl_pid = 0 };
    if (bind(fd, (struct sockaddr *)&address, sizeof(address)) != 0)
        goto fail;
    // A netlink header, a connector message and the operation, back to back.
    char request[NLMSG_SPACE(sizeof(struct cn_msg) + sizeof(enum proc_cn_mcast_op))] __attribute__((aligned(NLMSG_ALIGNTO)));
    memset(request, 0, sizeof(request));
    struct nlmsghdr *header = (struct nlmsghdr *)request;
    header->nlmsg_len = NLMSG_LENGTH(sizeof(struct cn_msg) + sizeof(enum proc_cn_mcast_op));
    header->nlmsg_type = NLMSG_DONE;
    struct cn_msg *message = NLMSG_DATA(header);
    message->id.idx = CN_IDX_PROC;
    message->id.val = CN_VAL_PROC;
    message->len = sizeof(enum proc_cn_mcast_op);
    enum proc_cn_mcast_op operation = PROC_CN_MCAST_LISTEN;
    memcpy(message->data, &operation, sizeof(operation));
    if (send(fd, request, header->nlmsg_len, 0) != (ssize_t)header->nlmsg_len)
        goto fail;
    return fd;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int clinux_process_events_read(int fd, struct clinux_process_event *events, int capacity) {
    int count = 0;
    while (count < capacity) {
        char buffer[8192] __attribute__((aligned(NLMSG_ALIGNTO)));
        ssize_t length = recv(fd, buffer, sizeof(buffer), 0);
        if (length < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return count;
            return -1;
        }
        for (struct nlmsghdr *header = (struct nlmsghdr *)buffer; NLMSG_OK(header, length);
             header = NLMSG_NEXT(header, length)) {
            if (header->nlmsg_type == NLMSG_ERROR || header->nlmsg_type == NLMSG_NOOP)
                continue;
            if (header->nlmsg_len < NLMSG_LENGTH(sizeof(struct cn_msg) + sizeof(struct proc_event)))
                continue;
            struct cn_msg *message = NLMSG_DATA(header);
            if (message->id.idx != CN_IDX_PROC || message->id.val != CN_VAL_PROC)
                continue;
            struct proc_event *event = (struct proc_event *)message->data;
            struct clinux_process_event out = { 0 };
            switch (event->what) {
            case PROC_EVENT_FORK:
                out.what = CLINUX_PROCESS_FORK;
                out.pid = event->event_data.fork.child_pid;
                out.tgid = event->event_data.fork.child_tgid;
                out.parent_pid = event->event_data.fork.parent_pid;
                out.parent_tgid = event->event_data.fork.parent_tgid;
                break;
            case PROC_EVENT_EXEC:
                out.what = CLINUX_PROCESS_EXEC;
                out.pid = event->event_data.exec.process_pid;
                out.tgid = event->event_data.exec.process_tgid;
                break;
            case PROC_EVENT_EXIT:
                out.what = CLINUX_PROCESS_EXIT;
                out.pid = event->event_data.exit.process_pid;
                out.tgid = event->event_data.exit.process_tgid;
                break;
            default:
                continue;
            }
            if (count < capacity)
                events[count++] = out;
        }
    }
    return count;
}

int clinux_open_call_flags(int tid, long long *flags) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/syscall", tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char text[256];
    ssize_t length = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (length <= 0)
        return -1;
    text[length] = 0;
    // "NR ARG0 ARG1 ARG2 ARG3 ARG4 ARG5 SP PC"; "running" or "-1 ..." when not in a call.
    long long number = 0;
    unsigned long long args[6] = { 0 };
    if (sscanf(text, "%lld %llx %llx %llx %llx %llx %llx", &number, &args[0], &args[1], &args[2], &args[3],
               &args[4], &args[5]) < 4)
        return -1;
    switch (number) {
#ifdef SYS_open
    case SYS_open:
        *flags = (long long)args[1];
        return 0;
#endif
#ifdef SYS_creat
    case SYS_creat:
        *flags = O_CREAT | O_WRONLY | O_TRUNC;
        return 0;
#endif
    case SYS_openat:
        *flags = (long long)args[2];
        return 0;
    case SYS_open_by_handle_at:
        *flags = (long long)args[2];
        return 0;
    /* Running a program opens it (and its interpreter) to read. */
    case SYS_execve:
#ifdef SYS_execveat
    case SYS_execveat:
#endif
        *flags = O_RDONLY;
        return 0;
#ifdef SYS_openat2
    case SYS_openat2: {
        struct open_how how;
        struct iovec local = { .iov_base = &how, .iov_len = sizeof(how.flags) };
        struct iovec remote = { .iov_base = (void *)(uintptr_t)args[2], .iov_len = sizeof(how.flags) };
        if (process_vm_readv(tid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof(how.flags))
            return -1;
        *flags = (long long)how.flags;
        return 0;
    }
#endif
    }
    return -1;
}

int clinux_unix_sockets(struct clinux_unix_socket *sockets, int capacity) {
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -1;
    struct {
        struct nlmsghdr header;
        struct unix_diag_req request;
    } message;
    memset(&message, 0, sizeof(message));
    message.header.nlmsg_len = sizeof(message);
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.request.sdiag_family = AF_UNIX;
    message.request.udiag_states = 1 << 1; /* TCP_ESTABLISHED: connected sockets */
    message.request.udiag_show = UDIAG_SHOW_PEER | UDIAG_SHOW_NAME;
    if (send(fd, &message, sizeof(message), 0) != (ssize_t)sizeof(message)) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    int count = 0, done = 0;
    while (!done) {
        char buffer[32768] __attribute__((aligned(NLMSG_ALIGNTO)));
        ssize_t length = recv(fd, buffer, sizeof(buffer), 0);
        if (length < 0) {
            if (errno == EINTR)
                continue;
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        if (length == 0)
            break;
        for (struct nlmsghdr *header = (struct nlmsghdr *)buffer; NLMSG_OK(header, length); header = NLMSG_NEXT(header, length)) {
            if (header->nlmsg_type == NLMSG_DONE || header->nlmsg_type == NLMSG_ERROR) {
                done = 1;
                break;
            }
            struct unix_diag_msg *socketMessage = NLMSG_DATA(header);
            struct clinux_unix_socket entry = { .inode = socketMessage->udiag_ino, .peer = 0, .named = 0 };
            int attributes = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof(*socketMessage)));
            for (struct rtattr *attribute = (struct rtattr *)(socketMessage + 1); RTA_OK(attribute, attributes);
                 attribute = RTA_NEXT(attribute, attributes)) {
                if (attribute->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(attribute) >= sizeof(uint32_t))
                    entry.peer = *(uint32_t *)RTA_DATA(attribute);
                if (attribute->rta_type == UNIX_DIAG_NAME && RTA_PAYLOAD(attribute) > 0)
                    entry.named = 1;
            }
            if (count < capacity)
                sockets[count++] = entry;
        }
    }
    close(fd);
    return count;
}
