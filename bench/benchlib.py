"""What the benchmark scripts (bench.py, scale.py) share: commands, caches, mounts, timing."""
import os
import signal
import subprocess
import time


def sh(*args, **kwargs):
    return subprocess.run(list(args), check=True, **kwargs)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def cpu_seconds(pid):
    """User plus system CPU time of process PID and its threads so far, in seconds, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kib(pid, field):
    """A field of /proc/PID/status given in KiB (VmRSS, VmHWM), or None."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def unmount_and_wait(process, mnt, timeout):
    """Unmounts `mnt` and waits for its daemon: `timeout` seconds, then SIGTERM and half as long,
    then SIGKILL."""
    if mounted(mnt):
        subprocess.run(["fusermount3", "-u", mnt])
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout / 2)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def stop_on_signal(signum, frame):
    # SIGTERM and SIGHUP unwind like Ctrl-C, so the mounts are undone and the daemons stopped.
    raise SystemExit(128 + signum)


def unwind_on_signals():
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGHUP, stop_on_signal)
