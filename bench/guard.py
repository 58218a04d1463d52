#!/usr/bin/env python3
"""What the guard costs processes that hold no managed data, on the raw disk (docs/guard.md).

One custodyd serves a mount and watches the file system of BENCH_DIR; the workloads run on that
file system outside the mount, by a process that never read managed data, in three conditions,
alternating round by round:

  off        custodyd --guard-file-systems none
  on-idle    the guard watches the disk, and no process holds managed data (the kernel asks nothing)
  on-held    the same while another process holds managed data (it read a file of an identity whose
             policy lists saveToLocations): every open on the disk waits for the daemon's answer

Workloads: open_close_us (microseconds per open and close of one file, in a loop), untar
(/usr/include, then sync) and read_all_cold (every file, caches dropped). Prints a markdown table of
medians with each condition's difference from `off`, and writes JSON under bench/runs/.

Environment: ROUNDS (3), BENCH_DIR (/var/tmp/custody-bench), CUSTODYD (.build/release/custodyd),
CUSTODY_ARGS (more custodyd arguments, such as --no-low-latency).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import drop_caches, mounted, sh, timed, unmount_and_wait, unwind_on_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUSTODYD = os.environ.get("CUSTODYD", os.path.join(ROOT, ".build/release/custodyd"))
BENCH_DIR = os.environ.get("BENCH_DIR", "/var/tmp/custody-bench")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CONDITIONS = ["off", "on-idle", "on-held"]
OPEN_CALLS = 20000
OPEN_SCRIPT = """
import os, sys, time
path, calls = sys.argv[1], int(sys.argv[2])
def loop(count):
    for _ in range(count):
        os.close(os.open(path, os.O_RDONLY))
loop(1000)
start = time.perf_counter()
loop(calls)
print((time.perf_counter() - start) / calls * 1e6)
"""
HOLDER_SCRIPT = """
import sys, time
open(sys.argv[1]).read()
print("holding", flush=True)
time.sleep(3600)
"""


class Guarded:
    """custodyd with a mount and a managed account whose data may be saved to the mount only."""

    def __init__(self, condition):
        self.condition = condition
        self.base = os.path.join(BENCH_DIR, "guard-" + condition)
        self.disk = os.path.join(self.base, "disk")
        self.holder = None

    def start(self):
        mnt = os.path.join(self.base, "mnt")
        if mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt])
        shutil.rmtree(self.base, ignore_errors=True)
        for directory in ("backing", "mnt", "disk"):
            os.makedirs(os.path.join(self.base, directory))
        state = os.path.join(self.base, "state")
        os.makedirs(state, mode=0o700)
        self.socket = os.path.join(self.base, "control.sock")
        self.mnt = mnt
        watch = ["none"] if self.condition == "off" else [self.disk]
        cmd = [CUSTODYD, "--state", state, "--socket", self.socket, "--multi-identity", "--no-sessions",
               "--default-identity", "0=bench@custody.example", "--guard-file-systems", *watch]
        cmd += os.environ.get("CUSTODY_ARGS", "").split()
        cmd += [os.path.join(self.base, "backing"), mnt]
        self.log = open(os.path.join(self.base, "daemon.log"), "w")
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + 15
        while not mounted(mnt):
            if self.process.poll() is not None or time.time() > deadline:
                raise SystemExit(f"custodyd did not mount; see {self.base}/daemon.log")
            time.sleep(0.02)
        body = ('{"id": "bench-oid", "upn": "bench@custody.example", "policy": {"protectionLevel": "untilFirstAuth", '
                '"saveToLocations": ["AccountDocument"]}}')
        out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--unix-socket", self.socket, "-X", "POST",
                              "--data-binary", body, "http://localhost/v1/accounts"], capture_output=True, text=True)
        if not out.stdout.endswith("201"):
            raise SystemExit(f"cannot enroll the benchmark identity: {out.stdout}")
        secret = os.path.join(mnt, "plan.txt")
        with open(secret, "w") as f:
            f.write("managed data\n")
        if self.condition == "on-held":
            # Its output goes nowhere a holder may not write (a log file on the watched disk would make the read refused).
            self.holder = subprocess.Popen([sys.executable, "-c", HOLDER_SCRIPT, secret], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL, text=True)
            if self.holder.stdout.readline().strip() != "holding":
                raise SystemExit("the holder did not start")
        status = json.loads(subprocess.run(["curl", "-s", "--unix-socket", self.socket, "http://localhost/v1/status"],
                                           capture_output=True, text=True).stdout)
        guard = status.get("guard", {})
        expected = {"off": "off", "on-idle": "fanotify", "on-held": "fanotify"}[self.condition]
        if guard.get("level") != expected or (self.condition == "on-held") != (guard.get("holders", 0) > 0):
            raise SystemExit(f"{self.condition}: the guard is not as the condition needs: {guard}")

    def stop(self):
        if self.holder:
            self.holder.kill()
            self.holder.wait()
            self.holder = None
        unmount_and_wait(self.process, self.mnt, timeout=10)
        self.log.close()
        shutil.rmtree(self.base, ignore_errors=True)


def run_round(system, round_index, tarball, results):
    record = lambda name, value: results.setdefault(system.condition, {}).setdefault(name, []).append(value)
    work = os.path.join(system.disk, f"round{round_index}")
    tree = os.path.join(work, "tree")
    os.makedirs(tree)
    probe = os.path.join(work, "probe")
    open(probe, "w").close()
    out = subprocess.run([sys.executable, "-c", OPEN_SCRIPT, probe, str(OPEN_CALLS)], check=True, capture_output=True, text=True).stdout
    record("open_close_us", float(out.strip()))
    drop_caches()
    record("untar", timed(lambda: (sh("tar", "-xf", tarball, "-C", tree), sh("sync"))))
    drop_caches()
    record("read_all_cold", timed(lambda: sh("sh", "-c", f"find '{tree}' -type f -print0 | xargs -0 cat > /dev/null")))
    shutil.rmtree(work, ignore_errors=True)


def main():
    unwind_on_signals()
    if not os.path.exists(CUSTODYD):
        raise SystemExit(f"{CUSTODYD} is missing: make release")
    os.makedirs(BENCH_DIR, exist_ok=True)
    tarball = os.path.join(BENCH_DIR, "include.tar")
    if not os.path.exists(tarball):
        sh("tar", "-cf", tarball, "-C", "/usr", "include")
    results = {}
    for round_index in range(ROUNDS):
        order = CONDITIONS if round_index % 2 == 0 else list(reversed(CONDITIONS))
        for condition in order:
            system = Guarded(condition)
            try:
                system.start()
                run_round(system, round_index, tarball, results)
            finally:
                system.stop()
    medians = {c: {w: statistics.median(v) for w, v in ws.items()} for c, ws in results.items()}
    mode = "low-latency mode off" if "--no-low-latency" in os.environ.get("CUSTODY_ARGS", "") else "low-latency mode on"
    print(f"\nThe guard's cost to a process that holds nothing, on the raw disk ({mode}; medians of {ROUNDS}):\n")
    print("| workload | " + " | ".join(CONDITIONS) + " |")
    print("|---|" + "---|" * len(CONDITIONS))
    for workload in ["open_close_us", "untar", "read_all_cold"]:
        cells = []
        base = medians["off"][workload]
        for condition in CONDITIONS:
            value = medians[condition][workload]
            if condition == "off":
                cells.append(f"{value:.2f}")
            elif workload == "open_close_us":
                cells.append(f"{value:.2f} ({value - base:+.2f} µs)")
            else:
                cells.append(f"{value:.2f} ({(value / base - 1) * 100:+.0f} %)")
        print(f"| {workload} | " + " | ".join(cells) + " |")
    os.makedirs(os.path.join(ROOT, "bench", "runs"), exist_ok=True)
    out = os.path.join(ROOT, "bench", "runs", time.strftime("guard-%Y%m%d-%H%M%S.json"))
    with open(out, "w") as f:
        json.dump({"mode": mode, "rounds": ROUNDS, "results": results, "medians": medians}, f, indent=1)
    print(f"\n(raw figures: {out})")


if __name__ == "__main__":
    main()
