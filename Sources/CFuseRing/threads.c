// The CPUs requests come from, and the threads that serve them: pinning and priorities.
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

int custody_pin_thread(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return EINVAL;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int custody_unpin_thread(const custody_fuse_transport *t) {
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(t->cpus), &t->cpus);
    int priority = custody_thread_set_idle_priority(gettid(), 0);
    return rc != 0 ? rc : priority;
}

pid_t custody_thread_id(void) { return gettid(); }

int custody_thread_set_idle_priority(pid_t thread, int idle) {
    struct sched_param param = { .sched_priority = 0 };
    return sched_setscheduler(thread, idle ? SCHED_IDLE : SCHED_OTHER, &param) == 0 ? 0 : errno;
}

int custody_fuse_possible_cpus(void) {
    // "0-1" or "0-3,8-11": the highest number plus one (queues are indexed by CPU number).
    int fd = open("/sys/devices/system/cpu/possible", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (int)sysconf(_SC_NPROCESSORS_CONF);
    char text[256];
    ssize_t n = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (n <= 0) return (int)sysconf(_SC_NPROCESSORS_CONF);
    text[n] = 0;
    long highest = -1, value = -1;
    for (char *c = text; ; c++) {
        if (*c >= '0' && *c <= '9') {
            value = (value < 0 ? 0 : value * 10) + (*c - '0');
            if (value > 65536) return -1;
        } else {
            if (value > highest) highest = value;
            value = -1;
            if (*c == 0 || *c == '\n') break;
        }
    }
    return highest < 0 ? (int)sysconf(_SC_NPROCESSORS_CONF) : (int)(highest + 1);
}
