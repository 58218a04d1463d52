"""What the benchmark scripts (bench.py, scale.py) share: commands, caches, mounts, timing."""
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
