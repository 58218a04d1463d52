#!/usr/bin/env python3
"""make bench-scale: how Custody's costs grow with the tree and with parallel clients.

For each tree size (SCALE_SIZES, default 10000,100000,1000000 small files of 100 bytes, 1,000 to
a directory), on the raw disk and on a Custody mount (every file encrypted, a third of them owned
by a second identity, written through `custodyctl run --identity`):

  create    the files, through the mount
  ls -lR    cold (caches dropped)
  find      cold
  du -s     cold
  wipe      cold, of the second identity (a third of the files): until its keys are destroyed, and
            until the last of its files is deleted (Custody only)

It reports the time per file of each step and the daemon's resident memory after each step and
at its peak, so that a step whose cost per file grows with the tree, or memory that grows with
it, shows. Then 1, 2, 4 and 8 clients each write and read a file of their own (fio, 1 MiB blocks)
on the raw disk and on the mount: throughput per client count.

Results go to bench/runs/scale-DATE.json and a plot to bench/runs/scale-DATE.png (gnuplot), or to
SCALE_PLOT. Environment: SCALE_SIZES, CLIENTS (1,2,4,8), FIO_SIZE_MB (128), BENCH_DIR
(/var/tmp/custody-bench-scale), CUSTODYD (.build/release/custodyd), CUSTODYCTL, CUSTODY_ARGS.
"""
import json
import os
import shutil
import subprocess
import sys
import time

from benchlib import drop_caches, mounted, sh, status_kib, timed, unmount_and_wait, unwind_on_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUSTODYD = os.environ.get("CUSTODYD", os.path.join(ROOT, ".build/release/custodyd"))
CUSTODYCTL = os.environ.get("CUSTODYCTL", os.path.join(os.path.dirname(CUSTODYD), "custodyctl"))
BENCH_DIR = os.environ.get("BENCH_DIR", "/var/tmp/custody-bench-scale")
SIZES = [int(s) for s in os.environ.get("SCALE_SIZES", "10000,100000,1000000").split(",") if s]
CLIENTS = [int(s) for s in os.environ.get("CLIENTS", "1,2,4,8").split(",") if s]
FIO_SIZE_MB = int(os.environ.get("FIO_SIZE_MB", "128"))
PER_DIRECTORY = 1000
STEPS = ["create", "ls_lR", "find", "du"]

# Writes files START, START+STEP, … below COUNT into directories of 1,000 (made as needed);
# with "skip-thirds", leaves out every third file (those numbered 2 modulo 3).
CREATOR = r"""
import os, sys
root, start, step, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
skip = len(sys.argv) > 5 and sys.argv[5] == "skip-thirds"
data = b"x" * 100
made = set()
for i in range(start, count, step):
    if skip and i % 3 == 2:
        continue
    d = os.path.join(root, "d%05d" % (i // 1000))
    if d not in made:
        os.makedirs(d, exist_ok=True)
        made.add(d)
    fd = os.open(os.path.join(d, "f%07d" % i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
"""


class Target:
    """The raw disk, or a Custody mount with two identities."""

    def __init__(self, name):
        self.name = name
        self.base = os.path.join(BENCH_DIR, name)
        self.backing = os.path.join(self.base, "backing")
        self.mnt = os.path.join(self.base, "mnt")
        self.process = None
        self.dir = self.backing

    def start(self):
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt])
        shutil.rmtree(self.base, ignore_errors=True)
        os.makedirs(self.backing)
        os.makedirs(self.mnt)
        if self.name == "raw":
            return
        state = os.path.join(self.base, "state")
        self.socket = os.path.join(self.base, "control.sock")
        log = open(os.path.join(self.base, "daemon.log"), "w")
        cmd = [CUSTODYD, "--state", state, "--socket", self.socket, "--multi-identity",
               "--default-identity", "0=stay@custody.example", *os.environ.get("CUSTODY_ARGS", "").split(), self.backing, self.mnt]
        self.process = subprocess.Popen(cmd, stdout=log, stderr=log)
        deadline = time.time() + 15
        while not mounted(self.mnt):
            if self.process.poll() is not None or time.time() > deadline:
                raise SystemExit(f"custodyd did not mount; see {self.base}/daemon.log")
            time.sleep(0.02)
        for oid, upn in (("stay-oid", "stay@custody.example"), ("leave-oid", "leave@custody.example")):
            self.api("POST", "/v1/accounts", {"id": oid, "upn": upn, "policy": {"protectionLevel": "untilFirstAuth"}}, expect=201)
        self.dir = self.mnt

    def api(self, method, path, body=None, expect=200):
        args = ["curl", "-s", "-w", "\n%{http_code}", "--unix-socket", self.socket, "-X", method]
        if body is not None:
            args += ["--data-binary", json.dumps(body)]
        out = subprocess.run(args + ["http://localhost" + path], capture_output=True, text=True).stdout
        text, _, status = out.rpartition("\n")
        if status != str(expect):
            raise SystemExit(f"{method} {path}: {status} {text}")
        return json.loads(text) if text else None

    def rss_kib(self, field="VmRSS"):
        if self.process is None:
            return None
        return status_kib(self.process.pid, field)

    def stop(self):
        if self.process is None:
            return
        unmount_and_wait(self.process, self.mnt, timeout=30)
        self.process = None


def tree_steps(target, size):
    """Create, list, find and du a tree of `size` files; seconds and RSS after each step."""
    tree = os.path.join(target.dir, "tree")
    os.makedirs(tree)
    result = {"seconds": {}, "rss_kib": {}}

    def create():
        # Two thirds as the default identity, then every third file (as the identity to be
        # wiped, on the mount): the same two passes on both targets.
        sh(sys.executable, "-c", CREATOR, tree, "0", "1", str(size), "skip-thirds")
        prefix = [] if target.process is None else [CUSTODYCTL, "run", "--socket", target.socket, "--identity", "leave@custody.example", "--"]
        sh(*prefix, sys.executable, "-c", CREATOR, tree, "2", "3", str(size))
        sh("sync")

    for step, fn in (("create", create),
                     ("ls_lR", lambda: sh("ls", "-lR", tree, stdout=subprocess.DEVNULL)),
                     ("find", lambda: sh("find", tree, "-type", "f", stdout=subprocess.DEVNULL)),
                     ("du", lambda: sh("du", "-s", tree, stdout=subprocess.DEVNULL))):
        if step != "create":
            drop_caches()
        result["seconds"][step] = timed(fn)
        result["rss_kib"][step] = target.rss_kib()
    if target.process is not None:
        # Cold like every other step: a small tree would otherwise still be in the caches from
        # the step before, and a large one not.
        drop_caches()
        started = time.perf_counter()
        answer = target.api("POST", "/v1/accounts/leave-oid/wipe")
        result["seconds"]["wipe"] = time.perf_counter() - started
        result["seconds"]["wipe_keys_destroyed"] = answer.get("keysDestroyedSeconds")
        result["wipe_deleted"] = answer.get("deleted")
        result["rss_kib"]["wipe"] = target.rss_kib()
        result["peak_rss_kib"] = target.rss_kib("VmHWM")
        left = int(subprocess.run(["sh", "-c", f"find '{tree}' -type f | wc -l"], capture_output=True, text=True).stdout)
        expected = size - size // 3
        if left != expected:
            raise SystemExit(f"after the wipe {left} files are left, not {expected}")
    return result


def clients(target, count):
    """MB/s of `count` clients each writing, then (cold) reading, a file of its own."""
    work = os.path.join(target.dir, f"clients{count}")
    os.makedirs(work)
    rates = {}
    for mode in ("write", "read"):
        if mode == "read":
            drop_caches()
        out = subprocess.run(["fio", "--name=scale", f"--directory={work}", f"--size={FIO_SIZE_MB}M", "--bs=1M", f"--rw={mode}",
                              "--ioengine=psync", f"--numjobs={count}", "--group_reporting", "--end_fsync=1",
                              "--output-format=json"], check=True, capture_output=True, text=True).stdout
        job = json.loads(out)["jobs"][0]
        rates[mode] = job[mode]["bw_bytes"] / 1e6
    shutil.rmtree(work, ignore_errors=True)
    return rates


def plot(results, path):
    """Time per file of each step against the tree size (log scales), raw and Custody, the
    wipe's time per wiped file, and the daemon's peak memory."""
    data = os.path.join(ROOT, "bench/runs", os.path.splitext(os.path.basename(path))[0] + ".dat")
    with open(data, "w") as f:
        for size in SIZES:
            row = [str(size)]
            for name in ("raw", "custody"):
                seconds = results["trees"][name][str(size)]["seconds"]
                row += [f"{seconds[step] / size * 1e6:.3f}" for step in STEPS]
            custody = results["trees"]["custody"][str(size)]
            row.append(f"{custody['seconds']['wipe'] / (size // 3) * 1e6:.3f}")
            row.append(f"{(custody.get('peak_rss_kib') or 0) / 1024:.1f}")
            f.write(" ".join(row) + "\n")
    columns = []
    for offset, name in ((2, "raw disk"), (2 + len(STEPS), "Custody")):
        for index, step in enumerate(STEPS):
            style = "dashtype 2" if name == "raw disk" else "dashtype 1"
            columns.append(f"'{data}' using 1:{offset + index} with linespoints lw 2 {style} lc {index + 1} title '{step}, {name}'")
    columns.append(f"'{data}' using 1:{2 + 2 * len(STEPS)} with linespoints lw 2 lc 6 title 'wipe (per wiped file), Custody'")
    script = f"""
set terminal pngcairo size 1300,500 font ',10' noenhanced
set output '{path}'
set multiplot layout 1,2
set logscale x
set format x '%.0s%c'
set logscale y
set xlabel 'files in the tree'
set ylabel 'microseconds per file'
set key outside bottom center horizontal maxrows 3
set title 'Time per file (solid: Custody, dashed: raw disk)'
plot {", ".join(columns)}
unset logscale y
set yrange [0:*]
set ylabel 'MiB'
set key inside top left
set title 'custodyd peak resident memory'
plot '{data}' using 1:{3 + 2 * len(STEPS)} with linespoints lw 2 title 'peak RSS'
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    unwind_on_signals()
    if os.geteuid() != 0:
        raise SystemExit("make bench-scale needs root (to drop caches and mount)")
    os.makedirs(BENCH_DIR, exist_ok=True)
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "sizes": SIZES, "trees": {"raw": {}, "custody": {}}, "clients": {}}
    for size in SIZES:
        for name in ("raw", "custody"):
            target = Target(name)
            try:
                target.start()
                print(f"{name}: tree of {size} files", file=sys.stderr, flush=True)
                results["trees"][name][str(size)] = tree_steps(target, size)
            finally:
                target.stop()
                shutil.rmtree(target.base, ignore_errors=True)
    for name in ("raw", "custody"):
        target = Target(name)
        try:
            target.start()
            for count in CLIENTS:
                print(f"{name}: {count} clients", file=sys.stderr, flush=True)
                results["clients"].setdefault(name, {})[str(count)] = clients(target, count)
        finally:
            target.stop()
            shutil.rmtree(target.base, ignore_errors=True)

    print(f"\nCustody scale benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores\n")
    print("| files | step | raw µs/file | Custody µs/file | Custody RSS after (MiB) |")
    print("|---|---|---|---|---|")
    for size in SIZES:
        raw, custody = results["trees"]["raw"][str(size)], results["trees"]["custody"][str(size)]
        for step in STEPS:
            print(f"| {size:,} | {step} | {raw['seconds'][step] / size * 1e6:.1f} | {custody['seconds'][step] / size * 1e6:.1f} | "
                  f"{custody['rss_kib'][step] / 1024:.1f} |")
        wiped = size // 3
        print(f"| {size:,} | wipe of {wiped:,} | | {custody['seconds']['wipe'] / wiped * 1e6:.1f} "
              f"(keys destroyed after {custody['seconds']['wipe_keys_destroyed'] * 1000:.1f} ms) | {custody['rss_kib']['wipe'] / 1024:.1f} |")
        print(f"| {size:,} | peak | | | {custody['peak_rss_kib'] / 1024:.1f} |")
    print("\n| clients | raw write MB/s | Custody write MB/s | raw read MB/s | Custody read MB/s |")
    print("|---|---|---|---|---|")
    for count in CLIENTS:
        raw, custody = results["clients"]["raw"][str(count)], results["clients"]["custody"][str(count)]
        print(f"| {count} | {raw['write']:.0f} | {custody['write']:.0f} | {raw['read']:.0f} | {custody['read']:.0f} |")

    os.makedirs(os.path.join(ROOT, "bench/runs"), exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = os.path.join(ROOT, "bench/runs", f"scale-{stamp}.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    picture = os.environ.get("SCALE_PLOT") or os.path.join(ROOT, "bench/runs", f"scale-{stamp}.png")
    plot(results, picture)
    print(f"\nwrote {os.path.relpath(out, ROOT)} and {os.path.relpath(picture, ROOT)}")


if __name__ == "__main__":
    main()
