import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Per-CPU request rings (FUSE over io_uring, `RequestRings`): requests reach the daemon through
/// them when the kernel offers them, the same operations give the same results through
/// /dev/fuse, the ring threads run pinned at idle priority, and a request that waits for them on
/// a busy CPU gets them raised to normal priority.
final class RequestRingTests: XCTestCase {
    var daemons: [MountedDaemon] = []
    var hogs: [pid_t] = []

    override func tearDown() {
        for hog in hogs { kill(hog, SIGKILL); _ = waitForExit(hog, seconds: 5) }
        hogs = []
        for daemon in daemons { daemon.destroy() }
        daemons = []
    }

    /// Rings need a kernel with FUSE over io_uring (6.14+); the machines the project runs on have it.
    func requireRings() throws {
        guard FileManager.default.fileExists(atPath: "/sys/module/fuse/parameters/enable_uring") else {
            if ProcessInfo.processInfo.environment["CI"] == "true" {
                XCTFail("this kernel has no FUSE over io_uring (no fuse.enable_uring parameter)")
            }
            throw XCTSkip("this kernel has no FUSE over io_uring")
        }
    }

    /// A daemon, once it serves (it logs how requests reach it when its rings are made).
    func start(_ arguments: [String] = []) throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: arguments)
        daemons.append(daemon)
        _ = try? eventually("the daemon to say how it serves") { daemon.log.contains("requests through") }
        return daemon
    }

    func metrics(_ daemon: MountedDaemon) throws -> [String: Double] {
        let answer = try daemon.api("GET", "/v1/metrics")
        XCTAssertEqual(answer.status, 200, answer.body)
        return MetricsTests.parse(answer.body)
    }

    /// Requests served in all, by the daemon's own count.
    func requestsServed(_ values: [String: Double]) -> Double {
        values.filter { $0.key.hasPrefix("custody_fuse_requests_total{") }.values.reduce(0, +)
    }

    /// The daemon's threads: ID, scheduling policy (0 normal, 5 idle) and allowed CPUs.
    func threads(of pid: pid_t) -> [(id: Int, policy: Int, cpus: String)] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task") else { return [] }
        return names.compactMap { name in
            guard let id = Int(name), let stat = readTextFile("/proc/\(pid)/task/\(name)/stat"),
                  let close = stat.lastIndex(of: ")"),
                  let status = readTextFile("/proc/\(pid)/task/\(name)/status") else { return nil }
            // Fields after the command: the third is field 3 (state); policy is field 41.
            let fields = stat[stat.index(after: close)...].split(separator: " ")
            guard fields.count > 38, let policy = Int(fields[38]) else { return nil }
            let cpus = status.split(separator: "\n").first { $0.hasPrefix("Cpus_allowed_list:") }
                .map { $0.dropFirst("Cpus_allowed_list:".count).trimmingCharacters(in: .whitespaces) } ?? ""
            return (id, policy, cpus)
        }
    }

    /// Creates, writes, renames, links, truncates, lists and removes files, and describes what it
    /// read back, so that two transports can be compared.
    func exercise(_ daemon: MountedDaemon) throws -> [String] {
        var seen: [String] = []
        try FileManager.default.createDirectory(atPath: daemon.mnt("dir/sub"), withIntermediateDirectories: true)
        let big = (0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }
        try writeFile(daemon.mnt("dir/big"), big)
        for index in 0..<200 { try writeFile(daemon.mnt("dir/sub/f\(index)"), bytes("file \(index)\n")) }
        XCTAssertEqual(rename(daemon.mnt("dir/sub/f0"), daemon.mnt("dir/renamed")), 0)
        XCTAssertEqual(link(daemon.mnt("dir/sub/f1"), daemon.mnt("dir/hard")), 0)
        XCTAssertEqual(symlink("sub/f2", daemon.mnt("dir/soft")), 0)
        XCTAssertEqual(truncate(daemon.mnt("dir/sub/f3"), 2), 0)
        try Syscall.setxattr(daemon.mnt("dir/sub/f4"), "user.note", "kept", 4, 0)
        for index in stride(from: 100, to: 200, by: 1) { XCTAssertEqual(unlink(daemon.mnt("dir/sub/f\(index)")), 0) }
        _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])

        XCTAssertEqual(try readFile(daemon.mnt("dir/big")), big, "a 3 MiB file reads back")
        seen.append(try mustRun(["sh", "-c", "cd '\(daemon.mnt("dir"))' && ls -lnR --time-style=+ . | awk '{print $1, $2, $5, $NF}'"]))
        seen.append(try mustRun(["sh", "-c", "cd '\(daemon.mnt("dir"))' && cat renamed hard soft sub/f3 && md5sum big"]))
        XCTAssertEqual(xattr(daemon.mnt("dir/sub/f4"), "user.note"), "kept")
        XCTAssertNil(xattr(daemon.mnt("dir/sub/f5"), "user.note"))
        XCTAssertEqual(errnoOf { _ = try readFile(daemon.mnt("dir/sub/f150")) }, ENOENT)
        _ = try mustRun(["rm", "-rf", daemon.mnt("dir")])
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.back("dir")))
        return seen
    }

    func testRequestsAreServedOnTheCallersCPUAndGiveWhatDevFuseGives() throws {
        try requireRings()
        let ringed = try start()
        XCTAssertTrue(ringed.log.contains("requests through per-CPU request rings"), ringed.log)
        // One thread per CPU, pinned to its CPU, at idle priority.
        let cpus = Int(sysconf(Int32(_SC_NPROCESSORS_CONF)))
        let pinned = threads(of: ringed.pid).filter { !$0.cpus.contains("-") && !$0.cpus.contains(",") }
        XCTAssertEqual(pinned.count, cpus, "\(threads(of: ringed.pid))")
        XCTAssertEqual(Set(pinned.map(\.cpus)), Set((0..<cpus).map(String.init)))
        XCTAssertTrue(pinned.allSatisfy { $0.policy == 5 }, "\(pinned)")
        let before = try metrics(ringed)
        let throughRings = try exercise(ringed)
        let after = try metrics(ringed)
        let served = requestsServed(after) - requestsServed(before)
        let ringServed = (after["custody_fuse_ring_requests_total"] ?? 0) - (before["custody_fuse_ring_requests_total"] ?? 0)
        XCTAssertGreaterThan(served, 1000)
        // Everything but FORGET (which the kernel sends through /dev/fuse) goes through a ring.
        let forgets = (after[#"custody_fuse_requests_total{op="forget"}"#] ?? 0) - (before[#"custody_fuse_requests_total{op="forget"}"#] ?? 0)
        XCTAssertEqual(ringServed, served - forgets, "requests through the rings: \(ringServed) of \(served)")

        let plain = try start(["--no-request-rings"])
        XCTAssertTrue(plain.log.contains("requests through /dev/fuse (request rings turned off)"), plain.log)
        let throughDevice = try exercise(plain)
        XCTAssertEqual(throughRings, throughDevice)
        XCTAssertEqual(try metrics(plain)["custody_fuse_ring_requests_total"], 0)
        XCTAssertTrue(threads(of: plain.pid).allSatisfy { $0.policy == 0 })
    }

    /// Encrypted files through the rings: the same bytes back, ciphertext on disk.
    func testEncryptedFilesThroughTheRings() throws {
        try requireRings()
        let daemon = try start(["--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        let data = (0..<(5 << 20) + 123).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 7) }
        try writeFile(daemon.mnt("secret"), data)
        _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        XCTAssertEqual(try readFile(daemon.mnt("secret")), data)
        let stored = try readFile(daemon.back("secret"))
        XCTAssertGreaterThan(stored.count, data.count)
        XCTAssertNil(stored.firstRange(of: data[1000..<1064]), "the backing file holds ciphertext")
        XCTAssertEqual(xattr(daemon.mnt("secret"), "user.custody.encrypted"), "1")
        XCTAssertGreaterThan(try metrics(daemon)["custody_fuse_ring_requests_total"] ?? 0, 0)
    }

    /// Whether `needle` is anywhere in the memory of process `pid` that can be read.
    func memory(of pid: pid_t, contains needle: [UInt8]) throws -> Bool {
        let maps = try String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8)
        let memory = open("/proc/\(pid)/mem", O_RDONLY)
        guard memory >= 0 else { throw Errno.current }
        defer { close(memory) }
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 2, fields[1].hasPrefix("r"), !line.hasSuffix("[vvar]"), !line.hasSuffix("[vsyscall]"),
                  !line.hasSuffix("[vvar_vclock]") else { continue }
            let range = fields[0].split(separator: "-")
            guard range.count == 2, let start = UInt64(range[0], radix: 16), let end = UInt64(range[1], radix: 16) else { continue }
            var offset = start
            var chunk = [UInt8](repeating: 0, count: 1 << 20)
            while offset < end {
                let want = Int(min(UInt64(chunk.count), end - offset))
                let got = chunk.withUnsafeMutableBytes { pread(memory, $0.baseAddress, want, off_t(Int64(bitPattern: offset))) }
                if got <= 0 { break }
                let found = chunk.withUnsafeBytes { haystack in
                    needle.withUnsafeBytes { wanted in Self.find(wanted, in: UnsafeRawBufferPointer(rebasing: haystack[0..<got])) }
                }
                if found { return true }
                // Overlap so that a match across chunks is seen.
                offset += UInt64(max(1, got - needle.count))
            }
        }
        return false
    }

    /// Whether `needle` occurs in `haystack` (memchr for its first byte, then memcmp).
    static func find(_ needle: UnsafeRawBufferPointer, in haystack: UnsafeRawBufferPointer) -> Bool {
        guard let base = haystack.baseAddress, let wanted = needle.baseAddress, needle.count > 0, haystack.count >= needle.count else { return false }
        var at = 0
        let last = haystack.count - needle.count
        while at <= last {
            guard let hit = memchr(base + at, Int32(needle[0]), last - at + 1) else { return false }
            let position = UnsafeRawPointer(hit) - base
            if memcmp(hit, wanted, needle.count) == 0 { return true }
            at = position + 1
        }
        return false
    }

    /// What an encrypted file's reader got does not stay in the daemon's memory after the answer,
    /// through the rings (their READ answers are zeroed) or through /dev/fuse.
    func testNoPlaintextStaysInTheDaemonAfterReads() throws {
        try requireRings()
        for arguments in [[], ["--no-request-rings"]] {
            let daemon = try start(["--default-identity", "0=alice@contoso.com"] + arguments)
            XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
            // A marker no program holds but the reader: made here from random bytes.
            var generator = SystemRandomNumberGenerator()
            let marker = (0..<48).map { _ in UInt8.random(in: 0...255, using: &generator) }
            var data = [UInt8](repeating: 0x2e, count: 3 << 20)
            for at in stride(from: 4096, to: data.count - marker.count, by: 256 << 10) { data.replaceSubrange(at..<(at + marker.count), with: marker) }
            try writeFile(daemon.mnt("secret"), data)
            _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
            XCTAssertEqual(try readFile(daemon.mnt("secret")), data)
            // Small reads too (they decrypt from a mapping of the stored file).
            let fd = try Syscall.open(daemon.mnt("secret"), O_RDONLY)
            var page = [UInt8](repeating: 0, count: 4096)
            _ = page.withUnsafeMutableBytes { pread(fd, $0.baseAddress, 4096, 4096) }
            close(fd)
            XCTAssertEqual(Array(page[0..<marker.count]), marker)
            usleep(200_000)
            XCTAssertFalse(try memory(of: daemon.pid, contains: marker), "plaintext left in the daemon's memory (\(arguments))")
        }
    }

    /// A CPU kept busy by another program: the ring threads pinned there would get no turn at idle
    /// priority; the guard sees the waiting request and raises them, then lowers them again.
    func testARequestWaitingOnABusyCPURaisesItsRingThreads() throws {
        try requireRings()
        let daemon = try start()
        let hog = try spawn("/usr/bin/taskset", ["-c", "0", "/bin/sh", "-c", "while :; do :; done"])
        hogs.append(hog)
        usleep(100_000)
        // 2,000 round trips from the hog's CPU (attributes are not cached: every one reaches the daemon).
        let started = Date()
        let result = try runCommand(["taskset", "-c", "0", "python3", "-c", """
            import os
            for _ in range(2000):
                try: os.getxattr('\(daemon.mountPoint)', 'user.none')
                except OSError: pass
            """])
        XCTAssertEqual(result.status, 0, result.error)
        let values = try metrics(daemon)
        XCTAssertGreaterThanOrEqual(values["custody_fuse_ring_priority_raises_total"] ?? 0, 1, "the guard raised CPU 0's ring threads")
        XCTAssertTrue(threads(of: daemon.pid).contains { $0.cpus == "0" && $0.policy == 0 }, "\(threads(of: daemon.pid))")
        XCTAssertLessThan(Date().timeIntervalSince(started), 30, "the requests were served")
        kill(hog, SIGKILL)
        _ = waitForExit(hog, seconds: 5)
        hogs = []
        // The hold ends (1 s) and the threads go back to idle priority.
        _ = try? eventually("the threads back at idle priority", interval: 0.1) { !threads(of: daemon.pid).contains(where: { $0.cpus == "0" && $0.policy == 0 }) }
        XCTAssertFalse(threads(of: daemon.pid).contains { $0.cpus == "0" && $0.policy == 0 }, "\(threads(of: daemon.pid))")
    }

    /// Unmounting while a program keeps making requests ends the daemon promptly (ring threads
    /// stop with the connection) and the program sees errors, not a hang.
    /// Requests that may wait go from the ring's thread to a worker; the others are served where
    /// they arrive. Each call below makes one kind of request (O_DIRECT: no page cache between).
    func testRequestsThatMayWaitGoToWorkers() throws {
        try requireRings()
        let daemon = try start(["--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        // An encrypted file, and a plain one made beside the mount (no owner).
        try writeFile(daemon.mnt("secret"), [UInt8](repeating: 7, count: 1 << 20))
        try writeFile(daemon.back("plain"), [UInt8](repeating: 7, count: 1 << 20))
        XCTAssertEqual(xattr(daemon.mnt("secret"), "user.custody.encrypted"), "1")
        XCTAssertEqual(xattr(daemon.mnt("plain"), "user.custody.encrypted"), "0")
        func handedOff() throws -> Double { try metrics(daemon)["custody_fuse_ring_handoffs_total"] ?? -1 }
        let script = #"""
        import mmap, os, sys
        path, what = sys.argv[1], sys.argv[2]
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        buffer = mmap.mmap(-1, 1 << 20)
        if what == "fsync": os.fsync(fd)
        elif what == "small-write": os.pwrite(fd, buffer[:4096], 0)
        elif what == "large-write": os.pwrite(fd, buffer, 0)
        elif what == "small-read": os.preadv(fd, [memoryview(buffer)[:4096]], 0)
        elif what == "large-read": os.preadv(fd, [buffer], 0)
        elif what == "truncate": os.ftruncate(fd, 8192)
        elif what == "fallocate": os.posix_fallocate(fd, 0, 1 << 16)
        """#
        for (what, expected) in [("small-write", 0.0), ("small-read", 0), ("large-write", 1), ("large-read", 1),
                                 ("fsync", 1), ("truncate", 1), ("fallocate", 1)] {
            for file in ["secret", "plain"] {
                let before = try handedOff()
                let result = try runCommand(["python3", "-c", script, daemon.mnt(file), what])
                XCTAssertEqual(result.status, 0, "\(what) on \(file): \(result.error)")
                XCTAssertEqual(try handedOff() - before, expected, "\(what) on \(file)")
            }
        }
        // Attributes: ordinary ones where they arrive, the mount's own (a re-protection) on a worker.
        var before = try handedOff()
        XCTAssertNil(xattr(daemon.mnt("secret"), "user.none"))
        try Syscall.setxattr(daemon.mnt("secret"), "user.note", "n", 1, 0)
        XCTAssertEqual(try handedOff() - before, 0, "getxattr, setxattr")
        before = try handedOff()
        try Syscall.setxattr(daemon.mnt("plain"), "user.custody.owner", "alice@contoso.com", 17, 0)
        XCTAssertEqual(try handedOff() - before, 1, "setting user.custody.owner")
        XCTAssertEqual(xattr(daemon.mnt("plain"), "user.custody.encrypted"), "1")
    }

    /// A burst of large writes makes the rings add entries and start workers; once it is over the
    /// entries' memory goes back, and workers without work end (down to one).
    func testABurstOfWaitingRequestsLeavesNothingBehind() throws {
        try requireRings()
        let daemon = try start(["--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#).status, 201)
        func resident() -> Int {
            let status = readTextFile("/proc/\(daemon.pid)/status") ?? ""
            return status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
                .flatMap { $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first }.flatMap { Int($0) } ?? 0
        }
        func workers() -> Int {
            let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(daemon.pid)/task")) ?? []
            return tasks.filter { readTextFile("/proc/\(daemon.pid)/task/\($0)/comm")?.hasPrefix("custody-worker") == true }.count
        }
        try mustRun(["dd", "if=/dev/zero", "of=" + daemon.mnt("warm"), "bs=1M", "count=16", "conv=fsync", "status=none"])
        usleep(500_000)
        let before = resident()
        var peakWorkers = 0
        for round in 0..<3 {
            try mustRun(["dd", "if=/dev/zero", "of=" + daemon.mnt("big\(round)"), "bs=1M", "count=256", "conv=fsync", "status=none"])
            peakWorkers = max(peakWorkers, workers())
        }
        XCTAssertGreaterThan(try metrics(daemon)["custody_fuse_ring_handoffs_total"] ?? 0, 256, "the write-back's 1 MiB WRITEs went to workers")
        XCTAssertGreaterThan(peakWorkers, 1, "workers were started")
        // The pruner's tick (100 ms) after the last request gives the memory back.
        usleep(500_000)
        XCTAssertLessThan(resident() - before, 12 << 10, "resident KiB after the burst: \(resident()), before: \(before)")
        // Workers idle for 10 s end; one stays.
        _ = try? eventually("idle workers to end", timeout: 20, interval: 0.2) { workers() <= 1 }
        XCTAssertEqual(workers(), 1, "workers left after 10 s without work")
        for round in 0..<3 { XCTAssertEqual(try readFile(daemon.mnt("big\(round)")).count, 256 << 20) }
    }

    func testUnmountWhileRequestsFlowEndsCleanly() throws {
        try requireRings()
        let daemon = try start()
        try writeFile(daemon.mnt("f"), bytes("x"))
        let reader = try spawn("/bin/sh", ["-c", "while :; do cat '\(daemon.mnt("f"))' >/dev/null 2>&1 || exit 0; done"])
        defer { kill(reader, SIGKILL); _ = waitForExit(reader, seconds: 5) }
        usleep(300_000)
        XCTAssertEqual(try runCommand(["fusermount3", "-u", "-z", daemon.mountPoint]).status, 0)
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(daemon.pid, seconds: 10, status: &status), "the daemon ended after the unmount")
        XCTAssertEqual(status, 0, "custodyd \(describeExit(status)); log: \(daemon.log)")
        daemon.pid = 0
        XCTAssertTrue(waitForExit(reader, seconds: 10), "the reader saw the mount go")
    }
}
