#!/usr/bin/env python3
"""Custody benchmark: the same workloads on several file systems, in one run, on this machine.

Systems (each mounted once for the run, alternating round by round):
  raw                        the backing disk itself
  custody-encrypted          custodyd, every file owned by a managed identity (class C, unlocked),
                             written as the uid's default identity
  custody-encrypted-bound    the same, every workload run with `custodyctl run --identity` (a bound
                             process tree, as the README works), so identity resolution is measured;
                             custodyctl's own start with cold caches is its own row
                             (custodyctl_run_cold), and the cold workloads start with it cached
  custody-encrypted-baseline custody-encrypted with another build of custodyd (BASELINE_CUSTODYD, for
                             a before-and-after in one run; only when that is set)
  custody-plain              custodyd with no identity: the plaintext passthrough
  gocryptfs                  gocryptfs (Debian), default settings (names encrypted, as Custody's
                             managed names are)
  gocryptfs-plaintextnames   gocryptfs -plaintextnames (names in clear)
  passthrough-ll             libfuse's low-level passthrough example (passthrough_ll.c from
                             libfuse3-dev's examples, built here into BENCH_DIR, never committed)
                             with -o writeback,xattr,clone_fd: what FUSE itself costs

For the Custody systems it also counts the FUSE requests each workload made, per file (from the
daemon's metrics, GET /v1/metrics), by operation. round_trip_us times one request every system
passes to its daemon (a getxattr of an absent attribute); with the request counts it gives each
per-file workload's round-trip floor: the raw disk's time plus what the waited-for requests cost
over plain system calls. A FUSE file system that does the raw disk's work on the caller's path
cannot go below it; one that moves work off that path (Custody frees a removed file's blocks after
answering the UNLINK) can.

Prints a markdown table of medians (seconds, or IOPS for fio) with the ratio to gocryptfs, writes
JSON under bench/runs/ (ignored by git: results are not committed), and records custodyd's peak
RSS during the large write, the large read and untar, each measured from a quiet daemon.

Environment: ROUNDS (3), FIO_SECONDS (10), WORKLOADS (comma list, default all), SYSTEMS (comma
list), BENCH_DIR (/var/tmp/custody-bench), CUSTODYD (.build/release/custodyd), CUSTODYCTL (next to
custodyd), CUSTODY_ARGS (more custodyd arguments, such as --no-low-latency), BASELINE_CUSTODYD (a
custodyd to compare with, as custody-encrypted-baseline), BASELINE_ARGS (more arguments for that
one only: with BASELINE_CUSTODYD the same build, `--plain-names` measures what encrypted names cost).
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import cpu_seconds, drop_caches, mounted, sh, status_kib, timed, unmount_and_wait, unwind_on_signals

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUSTODYD = os.environ.get("CUSTODYD", os.path.join(ROOT, ".build/release/custodyd"))
BENCH_DIR = os.environ.get("BENCH_DIR", "/var/tmp/custody-bench")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
FIO_SECONDS = int(os.environ.get("FIO_SECONDS", "10"))
ALL_WORKLOADS = ["custodyctl_run_cold", "round_trip_us", "dd_write", "dd_read_cold", "untar", "ls_lR_cold", "read_all_cold",
                 "rm_rf", "sqlite_300_commits", "fio_randread_4k", "fio_randwrite_4k"]
WORKLOADS = [w for w in os.environ.get("WORKLOADS", ",".join(ALL_WORKLOADS)).split(",") if w]
CUSTODYCTL = os.environ.get("CUSTODYCTL", os.path.join(os.path.dirname(CUSTODYD), "custodyctl"))
BASELINE_CUSTODYD = os.environ.get("BASELINE_CUSTODYD", "")
ALL_SYSTEMS = ["raw", "custody-encrypted", "custody-encrypted-bound", "custody-encrypted-devfuse", "custody-plain", "gocryptfs",
               "gocryptfs-plaintextnames", "passthrough-ll"] + (["custody-encrypted-baseline"] if BASELINE_CUSTODYD else [])
PASSTHROUGH_LL_SOURCE = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c"
# Workloads whose request counts are reported per file (the tree's entries).
PER_FILE_WORKLOADS = ["untar", "ls_lR_cold", "read_all_cold", "rm_rf"]
SQLITE_COMMITS = 300


def units_of(workload, files):
    """What a workload's requests are counted per: a commit for SQLite, else an entry of the tree."""
    return SQLITE_COMMITS if workload == "sqlite_300_commits" else files


def request_summary(ops):
    """A workload's requests per unit: their total, then each operation's, most first."""
    detail = ", ".join(f"{op} {n:.2f}" for op, n in sorted(ops.items(), key=lambda item: -item[1]) if n >= 0.01)
    return f"{sum(ops.values()):.2f} ({detail})"
SYSTEMS = [s for s in os.environ.get("SYSTEMS", ",".join(ALL_SYSTEMS)).split(",") if s]
IOPS_WORKLOADS = {"fio_randread_4k", "fio_randwrite_4k"}
# Requests the caller does not wait for: the kernel sends them and goes on.
UNWAITED_REQUESTS = {"release", "releasedir", "forget", "batch_forget", "interrupt"}
# round_trip_us: one getxattr of an absent attribute, which every file system here passes to its
# daemon (no cache answers it), timed in a loop in the system's own context (a bound system's
# inside `custodyctl run`). Against the raw disk's figure it is what one waited-for request costs.
ROUND_TRIP_CALLS = 20000
ROUND_TRIP_SCRIPT = """
import errno, os, sys, time
path, calls = sys.argv[1], int(sys.argv[2])
def loop(count):
    for _ in range(count):
        try:
            os.getxattr(path, "user.custody-bench-absent")
        except OSError as error:
            if error.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise
loop(1000)
start = time.perf_counter()
loop(calls)
print((time.perf_counter() - start) / calls * 1e6)
"""


class System:
    """A mounted (or raw) directory to run workloads in."""

    def __init__(self, name):
        self.name = name
        self.base = os.path.join(BENCH_DIR, name)
        self.backing = os.path.join(self.base, "backing")
        self.mnt = os.path.join(self.base, "mnt")
        self.process = None
        # What every workload command runs under (a bound process tree for the bound system).
        self.prefix = []

    def start(self):
        # A run that was killed (SIGKILL, a lost session) can leave a dead mount behind.
        if mounted(self.mnt):
            if subprocess.run(["fusermount3", "-u", self.mnt]).returncode != 0:
                sh("fusermount3", "-u", "-z", self.mnt)
        shutil.rmtree(self.base, ignore_errors=True)
        os.makedirs(self.backing)
        os.makedirs(self.mnt)
        if self.name == "raw":
            self.dir = self.backing
            return
        log = open(os.path.join(self.base, "daemon.log"), "w")
        if self.name.startswith("custody"):
            state = os.path.join(self.base, "state")
            os.makedirs(state, mode=0o700)
            self.socket = os.path.join(self.base, "control.sock")
            binary = BASELINE_CUSTODYD if self.name == "custody-encrypted-baseline" else CUSTODYD
            cmd = [binary, "--state", state, "--socket", self.socket, "--multi-identity"]
            if self.name in ("custody-encrypted", "custody-encrypted-devfuse", "custody-encrypted-baseline"):
                # Everything root (this benchmark) writes belongs to a managed identity.
                cmd += ["--default-identity", "0=bench@custody.example"]
            if self.name == "custody-encrypted-devfuse":
                # The same, with every request through /dev/fuse (no per-CPU request rings).
                cmd += ["--no-request-rings"]
            if self.name == "custody-encrypted-bound":
                self.prefix = [CUSTODYCTL, "run", "--socket", self.socket, "--identity", "bench@custody.example", "--"]
            cmd += os.environ.get("CUSTODY_ARGS", "").split()
            if self.name == "custody-encrypted-baseline":
                cmd += os.environ.get("BASELINE_ARGS", "").split()
            cmd += [self.backing, self.mnt]
        elif self.name == "passthrough-ll":
            cmd = [build_passthrough_ll(), "-f", "-o", f"source={self.backing},writeback,xattr", "-o", "clone_fd", self.mnt]
        else:
            passfile = os.path.join(self.base, "pass")
            with open(passfile, "w") as f:
                f.write("benchmark passphrase\n")
            extra = ["-plaintextnames"] if self.name == "gocryptfs-plaintextnames" else []
            sh("gocryptfs", "-init", "-q", "-passfile", passfile, *extra, self.backing, stdout=subprocess.DEVNULL)
            cmd = ["gocryptfs", "-fg", "-q", "-passfile", passfile, self.backing, self.mnt]
        self.process = subprocess.Popen(cmd, stdout=log, stderr=log)
        deadline = time.time() + 15
        while not mounted(self.mnt):
            if self.process.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{self.name} did not mount; see {self.base}/daemon.log")
            time.sleep(0.02)
        if self.name.startswith("custody-encrypted"):
            body = '{"id": "bench-oid", "upn": "bench@custody.example", "policy": {"protectionLevel": "untilFirstAuth"}}'
            out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--unix-socket", self.socket, "-X", "POST",
                                  "--data-binary", body, "http://localhost/v1/accounts"], capture_output=True, text=True)
            if not out.stdout.endswith("201"):
                raise SystemExit(f"cannot enroll the benchmark identity: {out.stdout}")
        self.dir = self.mnt

    def stop(self):
        if self.process is None:
            return
        unmount_and_wait(self.process, self.mnt, timeout=10)
        self.process = None

    def requests(self):
        """FUSE requests served so far, by operation (Custody systems only; else None)."""
        if not (self.process and self.name.startswith("custody")):
            return None
        text = subprocess.run(["curl", "-s", "--unix-socket", self.socket, "http://localhost/v1/metrics"],
                              capture_output=True, text=True).stdout
        counts = {}
        for line in text.splitlines():
            if line.startswith('custody_fuse_requests_total{op="'):
                op = line.split('"')[1]
                counts[op] = int(float(line.rsplit(" ", 1)[1]))
        return counts

    def cpu(self):
        """The daemon's CPU time so far (any mounted system; None for the raw disk)."""
        return cpu_seconds(self.process.pid) if self.process else None

    def reset_peak_rss(self):
        """Starts a new peak once the daemon is quiet: it gives back what a burst of requests left
        (the request rings' added entries, freed buffers) a tick (100 ms) after the burst, and a
        peak taken before that would be the previous workload's."""
        if self.process and self.name.startswith("custody"):
            time.sleep(0.3)
            with open(f"/proc/{self.process.pid}/clear_refs", "w") as f:
                f.write("5\n")

    def peak_rss_kib(self):
        if not (self.process and self.name.startswith("custody")):
            return None
        return status_kib(self.process.pid, "VmHWM")


def build_passthrough_ll():
    """libfuse's passthrough_ll example, compiled from the sources Debian ships (once per run)."""
    binary = os.path.join(BENCH_DIR, "tools", "passthrough_ll")
    if not os.path.exists(binary):
        if not os.path.exists(PASSTHROUGH_LL_SOURCE):
            raise SystemExit(f"{PASSTHROUGH_LL_SOURCE} is missing (Debian's libfuse3-dev ships it)")
        os.makedirs(os.path.dirname(binary), exist_ok=True)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, check=True).stdout.split()
        sh("cc", "-O2", "-o", binary, PASSTHROUGH_LL_SOURCE, f"-I{os.path.dirname(PASSTHROUGH_LL_SOURCE)}", *flags)
    return binary


def fio(path, mode, prefix=()):
    out = subprocess.run(
        [*prefix, "fio", "--name=bench", f"--filename={path}", "--size=256M", "--bs=4k", f"--rw={mode}",
         "--ioengine=psync", "--direct=1", "--numjobs=1", f"--runtime={FIO_SECONDS}", "--time_based",
         "--output-format=json"], check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]
    return job["read" if mode == "randread" else "write"]["iops"]


def run_round(system, round_index, tarball, results, peaks, requests, cpu):
    run = lambda *args, **kwargs: sh(*system.prefix, *args, **kwargs)

    def cold():
        """Drops the caches for a cold workload. A bound system's workloads start through
        custodyctl, whose binary and libraries would then come from the disk too (90-150 ms here);
        they are read back in first, and that cold start is measured on its own
        (custodyctl_run_cold), so that the bound workloads compare the mount's costs."""
        drop_caches()
        if system.prefix:
            sh(*system.prefix, "true")

    work = os.path.join(system.dir, f"round{round_index}")
    os.makedirs(work)
    big = os.path.join(work, "big")
    tree = os.path.join(work, "tree")
    db = os.path.join(work, "bench.db")
    record = lambda name, value: results.setdefault(system.name, {}).setdefault(name, []).append(value)

    def note_peak(workload):
        """The daemon's peak RSS since `reset_peak_rss`, for a Custody system."""
        peak = system.peak_rss_kib()
        if peak is not None:
            peaks.setdefault(system.name, {}).setdefault(workload, []).append(peak)

    def counted(name, fn):
        """fn() timed, and for Custody the requests it made, by operation."""
        before, cpu_before = system.requests(), system.cpu()
        record(name, timed(fn))
        after, cpu_after = system.requests(), system.cpu()
        if cpu_before is not None and cpu_after is not None:
            cpu.setdefault(system.name, {}).setdefault(name, []).append(cpu_after - cpu_before)
        if before is not None and after is not None:
            delta = {op: after[op] - before.get(op, 0) for op in after if after[op] != before.get(op, 0)}
            requests.setdefault(system.name, {}).setdefault(name, []).append(delta)

    if system.prefix and "custodyctl_run_cold" in WORKLOADS:
        drop_caches()
        record("custodyctl_run_cold", timed(lambda: run("true")))
    if "round_trip_us" in WORKLOADS:
        probe = os.path.join(work, "round-trip")
        run("touch", probe)
        out = subprocess.run([*system.prefix, sys.executable, "-c", ROUND_TRIP_SCRIPT, probe, str(ROUND_TRIP_CALLS)],
                             check=True, capture_output=True, text=True).stdout
        record("round_trip_us", float(out.strip()))
    if "dd_write" in WORKLOADS or "dd_read_cold" in WORKLOADS:
        # Like every other workload, the write starts from clean caches: without this it also paid
        # for the write-back of whatever the previous system's fio run left dirty.
        cold()
        system.reset_peak_rss()
        record("dd_write", timed(lambda: run("dd", "if=/dev/zero", f"of={big}", "bs=1M", "count=512",
                                              "conv=fsync", "status=none")))
        note_peak("dd_write")
        cold()
        system.reset_peak_rss()
        record("dd_read_cold", timed(lambda: run("dd", f"if={big}", "of=/dev/null", "bs=1M", "status=none")))
        note_peak("dd_read_cold")
        os.unlink(big)
    if {"untar", "ls_lR_cold", "read_all_cold", "rm_rf"} & set(WORKLOADS):
        os.makedirs(tree)
        cold()
        system.reset_peak_rss()
        counted("untar", lambda: (run("tar", "-xf", tarball, "-C", tree), sh("sync")))
        note_peak("untar")
        cold()
        counted("ls_lR_cold", lambda: run("ls", "-lR", tree, stdout=subprocess.DEVNULL))
        cold()
        counted("read_all_cold", lambda: run("sh", "-c", f"find '{tree}' -type f -print0 | xargs -0 cat > /dev/null"))
        counted("rm_rf", lambda: (run("rm", "-rf", tree), sh("sync")))
    if "sqlite_300_commits" in WORKLOADS:
        run("sqlite3", db, "create table t(id integer primary key, v text);")
        script = "".join(f"begin; insert into t(v) values('row {i} {'x' * 100}'); commit;\n" for i in range(SQLITE_COMMITS))
        counted("sqlite_300_commits", lambda: subprocess.run([*system.prefix, "sqlite3", db], input=script, text=True, check=True))
    if "fio_randread_4k" in WORKLOADS or "fio_randwrite_4k" in WORKLOADS:
        path = os.path.join(work, "fio.dat")
        run("dd", "if=/dev/urandom", f"of={path}", "bs=1M", "count=256", "conv=fsync", "status=none")
        if "fio_randread_4k" in WORKLOADS:
            record("fio_randread_4k", fio(path, "randread", system.prefix))
        if "fio_randwrite_4k" in WORKLOADS:
            try:
                record("fio_randwrite_4k", fio(path, "randwrite", system.prefix))
            except subprocess.CalledProcessError:
                if system.name != "passthrough-ll":
                    raise
                # The example opens the backing file with O_DIRECT and writes from libfuse's
                # unaligned buffer: EINVAL. No figure (the table shows a dash).
    shutil.rmtree(work, ignore_errors=True)


def round_trip_floors(medians, per_file, files):
    """Per Custody system and per-file workload: the raw disk's time plus each waited-for request's
    cost over a raw system call (what the round trips alone add), and the measured time, both as
    ratios to the raw disk."""
    raw = medians.get("raw", {})
    floors = {}
    for s, by_workload in per_file.items():
        round_trip, raw_call = medians.get(s, {}).get("round_trip_us"), raw.get("round_trip_us")
        if round_trip is None or raw_call is None:
            continue
        for w, ops in by_workload.items():
            raw_time, measured = raw.get(w), medians.get(s, {}).get(w)
            if not raw_time or measured is None:
                continue
            waited = sum(n for op, n in ops.items() if op not in UNWAITED_REQUESTS)
            floor = raw_time + waited * units_of(w, files) * (round_trip - raw_call) / 1e6
            floors.setdefault(s, {})[w] = {"waited_per_entry": waited, "floor_seconds": floor,
                                           "floor_ratio": floor / raw_time, "measured_ratio": measured / raw_time}
    return floors


def running_order(systems):
    """The systems as units that rotate round by round. The raw disk's round leaves the (virtual)
    disk slow for whoever writes next: in 14 runs the large write right after it took 0.35-0.55 s
    longer (medians) than the same system's write after another system's round, although the guest
    shows no I/O in flight once it has synced. Rotating all five put the encrypted mount right
    after the raw disk in two rounds of three and the plain mount in one, so that effect, not the
    mounts, decided their ratio. gocryptfs -plaintextnames, a reference row that no target uses,
    therefore always runs right after the raw disk (the two rotate as one unit)."""
    names = [s.name for s in systems]
    units = [[s] for s in systems if s.name != "gocryptfs-plaintextnames" or "raw" not in names]
    for unit in units:
        if unit[0].name == "raw" and "gocryptfs-plaintextnames" in names:
            unit.append(systems[names.index("gocryptfs-plaintextnames")])
    return units


def main():
    unwind_on_signals()
    if os.geteuid() != 0:
        raise SystemExit("make bench needs root (to drop caches and mount)")
    if any(s.startswith("custody") for s in SYSTEMS) and not os.path.exists(CUSTODYD):
        raise SystemExit(f"{CUSTODYD} is missing: run 'make release' first")
    os.makedirs(BENCH_DIR, exist_ok=True)
    tarball = os.path.join(BENCH_DIR, "include.tar")
    sh("tar", "-C", "/usr", "-cf", tarball, "include")
    files = int(subprocess.run(["sh", "-c", "tar -tf " + tarball + " | wc -l"], capture_output=True, text=True).stdout)

    systems = [System(name) for name in SYSTEMS]
    results, peaks, requests, cpu = {}, {}, {}, {}
    started = time.time()
    try:
        for system in systems:
            system.start()
        units = running_order(systems)
        for r in range(ROUNDS):
            # Alternate the order each round so no system always runs first.
            order = [s for unit in units[r % len(units):] + units[:r % len(units)] for s in unit]
            for system in order:
                print(f"round {r + 1}/{ROUNDS}: {system.name}", file=sys.stderr, flush=True)
                run_round(system, r, tarball, results, peaks, requests, cpu)
    finally:
        for system in systems:
            system.stop()
    elapsed = time.time() - started

    medians = {s: {w: statistics.median(v) for w, v in ws.items()} for s, ws in results.items()}
    workloads = [w for w in ALL_WORKLOADS if any(w in medians.get(s, {}) for s in SYSTEMS)]
    reference = "gocryptfs" if "gocryptfs" in medians else None
    print(f"\nCustody benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
          f"{ROUNDS} rounds (medians), untar of {files} entries, fio {FIO_SECONDS} s, total {elapsed:.0f} s\n")
    header = "| workload | " + " | ".join(SYSTEMS) + " |"
    print(header)
    print("|" + "---|" * (len(SYSTEMS) + 1))
    for w in workloads:
        cells = []
        for s in SYSTEMS:
            value = medians.get(s, {}).get(w)
            if value is None:
                cells.append("–")
                continue
            if w in IOPS_WORKLOADS:
                text = f"{value:.0f} IOPS"
            elif w == "round_trip_us":
                text = f"{value:.1f} µs"
            else:
                text = f"{value:.3f} s"
            ref = medians.get(reference, {}).get(w) if reference else None
            if ref and s != reference:
                # Time ratio to gocryptfs (< 1 is faster); for IOPS the inverse, so the same holds.
                ratio = (ref / value) if w in IOPS_WORKLOADS else (value / ref)
                text += f" ({ratio:.2f}×)"
            cells.append(text)
        print(f"| {w} | " + " | ".join(cells) + " |")
    for s, by_workload in peaks.items():
        print(f"\n{s}: peak RSS " + ", ".join(f"{w} {max(v) / 1024:.1f} MiB" for w, v in by_workload.items()))
    if "passthrough-ll" in SYSTEMS:
        print("\npassthrough-ll: libfuse's example: no identities, no encryption, no read-ahead or write-behind of its"
              " own; it passes fio's O_DIRECT through to the disk, as the raw disk does, where Custody serves"
              " direct reads from the backing file's page cache; its O_DIRECT writes fail (EINVAL: libfuse's"
              " buffer is not aligned), so it has no random-write figure")
    if cpu:
        print("\nDaemon CPU time (user + system, all threads; median seconds)")
        for s, by_workload in cpu.items():
            print(f"  {s}: " + ", ".join(f"{w} {statistics.median(v):.3f}" for w, v in by_workload.items()))
    per_file = {}
    for s, by_workload in requests.items():
        for w, deltas in by_workload.items():
            totals = [sum(d.values()) for d in deltas]
            middle = deltas[totals.index(statistics.median_low(totals))]
            per_file.setdefault(s, {})[w] = {op: n / units_of(w, files) for op, n in middle.items()}
    for s, by_workload in per_file.items():
        print(f"\n{s}: FUSE requests per entry of the tree (median round)")
        for w in PER_FILE_WORKLOADS:
            if w not in by_workload:
                continue
            print(f"  {w}: {request_summary(by_workload[w])}")
        if "sqlite_300_commits" in by_workload:
            print(f"  per SQLite commit: {request_summary(by_workload['sqlite_300_commits'])}")

    floors = round_trip_floors(medians, per_file, files)
    if floors:
        print("\nRound-trip floor: the raw disk's time plus, per entry (per commit for SQLite), the requests the caller waited for"
              " times what one costs over the raw disk (round_trip_us); ratios to the raw disk")
        for s, by_workload in floors.items():
            detail = ", ".join(f"{w} {f['measured_ratio']:.2f}× (floor {f['floor_ratio']:.2f}×, {f['waited_per_entry']:.2f} waited)"
                               for w, f in by_workload.items())
            print(f"  {s}: {detail}")

    os.makedirs(os.path.join(ROOT, "bench/runs"), exist_ok=True)
    out = os.path.join(ROOT, "bench/runs", time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "rounds": ROUNDS, "fio_seconds": FIO_SECONDS,
                   "untar_entries": files, "elapsed_seconds": elapsed, "samples": results,
                   "medians": medians, "peak_rss_kib": peaks, "daemon_cpu_seconds": cpu, "requests": requests,
                   "requests_per_entry": per_file, "round_trip_floors": floors}, f, indent=2)
    print(f"\nwrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
