import CustodySystem
import Foundation
import Glibc
import Synchronization
import XCTest
import CustodyTestSupport

/// What the mount does for speed that a user can observe from outside: the wake-up latency bound
/// during bursts, the mount's read-ahead, and write-behind of large writes.
final class SpeedFeatureTests: XCTestCase {

    /// The system-wide CPU latency bound in force now (reading the device gives the aggregate).
    private func currentLatencyBound() -> Int32? {
        let fd = open("/dev/cpu_dma_latency", O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var value: Int32 = -1
        guard read(fd, &value, 4) == 4 else { return nil }
        return value
    }

    /// Sends lookups of names that do not exist (each one a request: they are all different)
    /// from another thread for `seconds`, while this thread samples the latency bound.
    private func boundsDuringBurst(_ daemon: MountedDaemon, seconds: Double) -> [Int32] {
        let done = DispatchSemaphore(value: 0)
        let mountPoint = daemon.mountPoint
        let thread = Thread {
            let end = monotonicSeconds() + seconds
            var index = 0
            while monotonicSeconds() < end {
                var attributes = stat()
                _ = lstat("\(mountPoint)/missing-\(index)", &attributes)
                index += 1
            }
            done.signal()
        }
        thread.start()
        var seen: [Int32] = []
        while done.wait(timeout: .now() + .milliseconds(5)) == .timedOut {
            if let bound = currentLatencyBound() { seen.append(bound) }
        }
        return seen
    }

    func testBurstOfRequestsHoldsZeroWakeLatencyAndReleasesIt() throws {
        guard let before = currentLatencyBound() else { throw XCTSkip("no /dev/cpu_dma_latency here") }
        XCTAssertNotEqual(before, 0, "nothing else may hold a zero bound during this test")
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        let seen = boundsDuringBurst(daemon, seconds: 1.0)
        XCTAssertTrue(seen.contains(0), "a burst of lookups holds a zero bound (saw \(Set(seen)))")
        // Quiet: released within a few milliseconds (allow for a slow machine).
        _ = try? eventually("the latency bound released", timeout: 2, interval: 0.001) { currentLatencyBound() != 0 }
        XCTAssertEqual(currentLatencyBound(), before, "released once requests stop")
    }

    func testNoLowLatencyNeverAsks() throws {
        guard currentLatencyBound() != nil else { throw XCTSkip("no /dev/cpu_dma_latency here") }
        let daemon = try MountedDaemon(extraArguments: ["--no-low-latency"])
        defer { daemon.destroy() }
        let seen = boundsDuringBurst(daemon, seconds: 0.5)
        XCTAssertFalse(seen.isEmpty)
        XCTAssertFalse(seen.contains(0), "--no-low-latency: the bound is never asked for")
    }

    func testReadAheadIsRaisedOnceTheMountServes() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        _ = try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint)
        let device = try XCTUnwrap(MountTable.entry(at: daemon.mountPoint)?.device)
        let value = try String(contentsOfFile: "/sys/class/bdi/\(device)/read_ahead_kb", encoding: .utf8)
        XCTAssertEqual(value.trimmingWhitespace(), "1024")
    }

    /// Dirty page-cache memory of the whole machine, in KiB.
    private func dirtyKiB() throws -> Int {
        let text = try String(contentsOfFile: "/proc/meminfo", encoding: .utf8)
        let line = try XCTUnwrap(text.split(separator: "\n").first { $0.hasPrefix("Dirty:") })
        return try XCTUnwrap(Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]))
    }

    func testLargeWritesAreWrittenBehind() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        try mustRun(["sync"])
        let baseline = try dirtyKiB()
        // 64 MiB in 1 MiB writes, closed without fsync: the kernel hands it to the daemon at close.
        try mustRun(["dd", "if=/dev/zero", "of=\(daemon.mnt("stream"))", "bs=1M", "count=64", "status=none"])
        XCTAssertEqual(try Syscall.lstat(daemon.back("stream")).st_size, 64 << 20)
        // Without write-behind the backing file's 64 MiB would stay dirty for the kernel's 30 s.
        var dirty = try dirtyKiB() - baseline
        _ = try? eventually("the write-back to start", timeout: 3, interval: 0.05) {
            dirty = try dirtyKiB() - baseline
            return dirty <= 16 << 10
        }
        XCTAssertLessThan(dirty, 16 << 10, "the backing file's write-back started as the data arrived")
    }

    /// Eight writers stream distinct content into encrypted files at once (1 MiB writes, one of them
    /// O_DIRECT, one starting at an odd offset): every file reads back exactly, through the mount
    /// and cold, and no writer's plaintext reaches the backing files. Encrypted writes are sealed
    /// straight out of libfuse's receive buffer, so the requests in flight must not share one.
    func testConcurrentLargeWritesToEncryptedFilesRoundTrip() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { daemon.destroy() }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        let size = (3 << 20) + 4_321, start = 777
        let contents: [[UInt8]] = (0..<8).map { worker in
            var generator = SeededGenerator(seed: 0xC0FFEE + UInt64(worker))
            return (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
        }
        let mountPoint = daemon.mountPoint
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            do {
                let direct = worker == 0
                let fd = try Syscall.open(mountPoint + "/stream\(worker)", O_WRONLY | O_CREAT | O_TRUNC | (direct ? Linux.O_DIRECT : 0), 0o644)
                defer { close(fd) }
                // O_DIRECT needs aligned buffers and offsets; the odd start goes to another writer.
                let first = worker == 1 ? start : 0
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 4096)
                defer { buffer.deallocate() }
                var offset = 0
                while offset < size {
                    let count = offset == 0 && first > 0 ? first : min(1 << 20, size - offset)
                    contents[worker].withUnsafeBytes { source in
                        buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[offset..<(offset + count)]))
                    }
                    try Syscall.pwriteAll(fd, buffer.baseAddress!, direct ? (count + 4095) & ~4095 : count, Int64(offset))
                    offset += count
                }
                if direct, ftruncate(fd, off_t(size)) != 0 { throw Errno.current }
                try Syscall.fsync(fd)
            } catch {
                failures.withLock { $0.append("writer \(worker): \(error)") }
            }
        }
        XCTAssertEqual(failures.withLock { $0 }, [])
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        for worker in 0..<8 {
            let path = daemon.mnt("stream\(worker)")
            XCTAssertEqual(xattr(path, "user.custody.encrypted"), "1")
            XCTAssertTrue(try readFile(path) == contents[worker], "stream \(worker) reads back exactly")
            let stored = try readFile(daemon.back("stream\(worker)"))
            XCTAssertGreaterThan(stored.count, size)
            let sample = contents[worker][(1 << 20)..<((1 << 20) + 32)]
            XCTAssertNil(stored.firstRange(of: sample), "stream \(worker): no plaintext in the backing file")
        }
    }

    /// Plain reads go through kept buffers shared by the request threads: eight readers at once,
    /// cold, with direct and buffered reads of several sizes (scratch, pooled and whole-MiB
    /// requests), must each get their own file's bytes, and short reads at the end of a file
    /// must return exactly what is left.
    func testConcurrentColdReadsOfPlainFilesReturnTheirOwnBytes() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        let size = (3 << 20) + 4_321
        let contents: [[UInt8]] = (0..<8).map { worker in
            var generator = SeededGenerator(seed: 0xBEEF + UInt64(worker))
            return (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
        }
        for worker in 0..<8 { try writeFile(daemon.back("plain\(worker)"), contents[worker]) }
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        // (request size, direct I/O, first offset) per reader; the odd offset needs buffered I/O.
        let plans: [(chunk: Int, direct: Bool, start: Int)] = [
            (1 << 20, true, 0), (1 << 20, false, 777), (96 << 10, true, 0), (4 << 10, true, 0),
            (1 << 20, false, 0), (200_000, false, 0), (1 << 20, true, 0), (64 << 10, false, 4_097),
        ]
        let mountPoint = daemon.mountPoint
        let failures = Mutex<[String]>([])
        let results = Mutex<[Int: [UInt8]]>([:])
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            let plan = plans[worker]
            do {
                let fd = try Syscall.open(mountPoint + "/plain\(worker)", O_RDONLY | (plan.direct ? Linux.O_DIRECT : 0))
                defer { close(fd) }
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: plan.chunk, alignment: 4096)
                defer { buffer.deallocate() }
                var bytes = [UInt8](repeating: 0, count: size)
                // The tail from `start`, then the head before it; every read but the last is full.
                for (from, to) in [(plan.start, size), (0, plan.start)] where from < to {
                    var offset = from
                    while offset < to {
                        let n = try Syscall.pread(fd, buffer.baseAddress!, plan.chunk, Int64(offset))
                        let expected = min(plan.chunk, size - offset)
                        if n != expected { throw Errno(EIO) }
                        let used = min(n, to - offset)
                        bytes.withUnsafeMutableBytes { $0.baseAddress!.advanced(by: offset).copyMemory(from: buffer.baseAddress!, byteCount: used) }
                        offset += used
                    }
                }
                // At the end of the file: a read that straddles it, and one past it.
                if plan.direct {
                    let tail = size & ~4095
                    if try Syscall.pread(fd, buffer.baseAddress!, 4096, Int64(tail)) != size - tail { throw Errno(ERANGE) }
                    if try Syscall.pread(fd, buffer.baseAddress!, 4096, Int64(tail + 4096)) != 0 { throw Errno(ERANGE) }
                }
                results.withLock { $0[worker] = bytes }
            } catch {
                failures.withLock { $0.append("reader \(worker): \(error)") }
            }
        }
        XCTAssertEqual(failures.withLock { $0 }, [])
        let read = results.withLock { $0 }
        for worker in 0..<8 {
            XCTAssertTrue(read[worker] == contents[worker], "reader \(worker) (\(plans[worker])) got its own file's bytes")
        }
    }

    /// Counts, by opcode name, the FUSE requests the kernel sends to `daemon`'s mount while `body`
    /// runs: the fuse:fuse_request_send tracepoint, in a trace instance of this test's own.
    private func requestsSent(to daemon: MountedDaemon, during body: () throws -> Void) throws -> [String: Int] {
        let tracing = "/sys/kernel/tracing"
        if access("\(tracing)/instances", F_OK) != 0 { _ = try? runCommand(["mount", "-t", "tracefs", "nodev", tracing]) }
        guard access("\(tracing)/events/fuse/fuse_request_send", F_OK) == 0 else {
            if ProcessInfo.processInfo.environment["CI"] == "true" { XCTFail("no fuse:fuse_request_send tracepoint and CI=true") }
            throw XCTSkip("this kernel has no fuse:fuse_request_send tracepoint")
        }
        let instance = "\(tracing)/instances/custody-test-\(getpid())"
        guard mkdir(instance, 0o700) == 0 else { throw Errno.current }
        defer { rmdir(instance) }
        let enable = "\(instance)/events/fuse/fuse_request_send/enable"
        try "1".write(toFile: enable, atomically: false, encoding: .utf8)
        defer { try? "0".write(toFile: enable, atomically: false, encoding: .utf8) }
        try body()
        try "0".write(toFile: enable, atomically: false, encoding: .utf8)
        // The connection is the mount's device number, in the kernel's encoding (major << 20 | minor).
        let device = try XCTUnwrap(MountTable.entry(at: daemon.mountPoint)?.device).split(separator: ":").compactMap { Int($0) }
        let connection = "connection \((device[0] << 20) | device[1]) "
        var counts: [String: Int] = [:]
        // (tracefs files report no size: read to the end rather than trusting one.)
        let traceFD = try Syscall.open("\(instance)/trace", O_RDONLY)
        defer { close(traceFD) }
        for line in String(decoding: try readAll(traceFD), as: UTF8.self).split(separator: "\n") where line.contains(connection) {
            guard let open = line.range(of: "(FUSE_"), let close = line[open.upperBound...].firstIndex(of: ")") else { continue }
            counts[String(line[line.index(after: open.lowerBound)..<close]), default: 0] += 1
        }
        return counts
    }

    /// On a local backing store a close costs no round trip: the first FLUSH is refused (ENOSYS)
    /// and the kernel sends no more. Files written and read still hold their bytes.
    func testClosingFilesCostsNoFlushOnALocalBackingStore() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { daemon.destroy() }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        let requests = try requestsSent(to: daemon) {
            for index in 0..<20 { try writeFile(daemon.mnt("f\(index)"), bytes("file \(index)")) }
            for index in 0..<20 { XCTAssertEqual(try readFile(daemon.mnt("f\(index)")), bytes("file \(index)")) }
        }
        XCTAssertEqual(requests["FUSE_CREATE"], 20, "\(requests)")
        XCTAssertLessThanOrEqual(requests["FUSE_FLUSH", default: 0], 1, "\(requests)")
        XCTAssertEqual(xattr(daemon.mnt("f3"), "user.custody.encrypted"), "1")
    }

    func testDirectIOOnEncryptedFilesGoesStraightToTheDaemon() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { daemon.destroy() }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        let path = daemon.mnt("direct.bin")
        try writeFile(path, [UInt8](repeating: 0, count: 64 << 10))
        XCTAssertEqual(xattr(path, "user.custody.encrypted"), "1")
        let block = UnsafeMutableRawBufferPointer.allocate(byteCount: 4096, alignment: 4096)
        defer { block.deallocate() }

        // O_DIRECT: one WRITE or READ per call, and no GETXATTR of security.capability before
        // the writes.
        let direct = try requestsSent(to: daemon) {
            let fd = try Syscall.open(path, O_RDWR | Linux.O_DIRECT)
            defer { close(fd) }
            for index in 0..<16 {
                block.copyBytes(from: Array(repeating: UInt8(ascii: "a") + UInt8(index), count: 4096))
                try Syscall.pwriteAll(fd, block.baseAddress!, 4096, Int64(index) * 4096)
            }
            for index in 0..<16 {
                XCTAssertEqual(try Syscall.pread(fd, block.baseAddress!, 4096, Int64(index) * 4096), 4096)
                XCTAssertEqual(block[4095], UInt8(ascii: "a") + UInt8(index))
            }
        }
        XCTAssertEqual(direct["FUSE_WRITE"], 16, "\(direct)")
        XCTAssertEqual(direct["FUSE_READ"], 16, "\(direct)")
        XCTAssertNil(direct["FUSE_GETXATTR"], "\(direct)")

        // The same writes through the page cache reach the daemon as one write-back at the fsync
        // (so the counts above tell the paths apart); the kernel checked the file for
        // capabilities at its first write and remembers (FUSE_HANDLE_KILLPRIV_V2).
        let cached = try requestsSent(to: daemon) {
            let fd = try Syscall.open(path, O_RDWR)
            defer { close(fd) }
            for index in 0..<16 { try Syscall.pwriteAll(fd, block.baseAddress!, 4096, Int64(index) * 4096) }
            try Syscall.fsync(fd)
        }
        XCTAssertGreaterThanOrEqual(cached["FUSE_WRITE", default: 0], 1, "\(cached)")
        XCTAssertLessThanOrEqual(cached["FUSE_WRITE", default: 0], 2, "\(cached)")
        XCTAssertNil(cached["FUSE_GETXATTR"], "\(cached)")

        let content = try readFile(path)
        XCTAssertEqual(content.count, 64 << 10)
        XCTAssertTrue(content[0..<(16 << 12)].allSatisfy { $0 == UInt8(ascii: "p") }, "the last writes are what is read")
        let stored = try readFile(daemon.back("direct.bin"))
        let run = [UInt8](repeating: UInt8(ascii: "p"), count: 16)
        XCTAssertFalse(stored.indices.dropLast(15).contains { Array(stored[$0..<($0 + 16)]) == run }, "no plaintext on disk")
    }

    func testNewEncryptedFilesCostNoTimestampRequestAtCloseAndStartEmpty() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { daemon.destroy() }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)

        // Files created, written and closed as `tar x` and `cp` do. The kernel keeps a written
        // file's times itself and sends them back (a SETATTR) at close when the times the daemon
        // reported at creation differ from its clock's; the header and owner record written during
        // the create must leave the reported times as the create made them. (A file whose create
        // and write straddle a clock tick gets one anyway, as on a plain mount: hence "a few".)
        let count = 20
        let requests = try requestsSent(to: daemon) {
            for index in 0..<count {
                try writeFile(daemon.mnt("new-\(index).txt"), bytes("file number \(index)"), flags: O_WRONLY | O_CREAT | O_EXCL)
            }
        }
        XCTAssertEqual(requests["FUSE_CREATE"], count, "\(requests)")
        XCTAssertLessThan(requests["FUSE_SETATTR", default: 0], count / 4, "\(requests)")
        for index in 0..<count {
            XCTAssertEqual(try readFile(daemon.mnt("new-\(index).txt")), bytes("file number \(index)"))
            XCTAssertEqual(xattr(daemon.mnt("new-\(index).txt"), "user.custody.encrypted"), "1")
            let stored = try readFile(daemon.back("new-\(index).txt"))
            XCTAssertGreaterThan(stored.count, 256, "a header is on disk")
            XCTAssertFalse(String(decoding: stored, as: UTF8.self).contains("file number"), "no plaintext on disk")
        }

        // A name the kernel holds as missing (it cached the failed lookup) appears in the backing
        // directory before the program creates it: the create empties what was there.
        var attributes = stat()
        XCTAssertEqual(lstat(daemon.mnt("late.txt"), &attributes), -1)
        XCTAssertEqual(errno, ENOENT)
        try writeFile(daemon.back("late.txt"), [UInt8](repeating: UInt8(ascii: "A"), count: 10_000))
        let late = try requestsSent(to: daemon) {
            try writeFile(daemon.mnt("late.txt"), bytes("fresh"), flags: O_WRONLY | O_CREAT)
        }
        XCTAssertEqual(late["FUSE_CREATE"], 1, "the kernel created the file (\(late))")
        XCTAssertEqual(try readFile(daemon.mnt("late.txt")), bytes("fresh"))
        XCTAssertEqual(xattr(daemon.mnt("late.txt"), "user.custody.encrypted"), "1")
        let stored = try readFile(daemon.back("late.txt"))
        XCTAssertLessThan(stored.count, 4096, "nothing of the earlier 10,000 bytes is left")
        XCTAssertFalse(stored.indices.dropLast(15).contains { stored[$0..<($0 + 16)].allSatisfy { $0 == UInt8(ascii: "A") } })
    }

    /// The daemon's mappings of `path` (small reads of large encrypted files are copied out of one).
    private func mappings(of path: String, in daemon: MountedDaemon) throws -> Int {
        let maps = try String(contentsOfFile: "/proc/\(daemon.pid)/maps", encoding: .utf8)
        return maps.split(separator: "\n").filter { $0.hasSuffix(" " + path) }.count
    }

    func testRandomReadsOfALargeEncryptedFileAndAFileCutBehindTheDaemon() throws {
        let daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        defer { daemon.destroy() }
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth"}}"#).status, 201)
        let path = daemon.mnt("image.bin")
        var generator = SeededGenerator(seed: 0x5EED_3A9)
        let content = (0..<(4 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try writeFile(path, content)
        XCTAssertEqual(xattr(path, "user.custody.encrypted"), "1")
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 8192, alignment: 4096)
        defer { buffer.deallocate() }

        let fd = try Syscall.open(path, O_RDONLY | Linux.O_DIRECT)
        defer { close(fd) }
        for _ in 0..<500 {
            let offset = Int.random(in: 0..<1024, using: &generator) * 4096
            let count = [4096, 8192].randomElement(using: &generator)!
            XCTAssertEqual(try Syscall.pread(fd, buffer.baseAddress!, count, Int64(offset)), count)
            XCTAssertTrue(buffer.prefix(count).elementsEqual(content[offset..<(offset + count)]), "\(count) bytes at \(offset)")
        }
        XCTAssertEqual(try mappings(of: daemon.back("image.bin"), in: daemon), 1, "small reads come from a mapping of the stored file")

        // Someone cuts the stored file to its first MiB behind the daemon's back, while it is open
        // and mapped: reads past the cut fail with EIO (they would raise SIGBUS in the mapping), the
        // daemon lives on, and reads before the cut still return the content.
        XCTAssertEqual(truncate(daemon.back("image.bin"), 1 << 20), 0)
        XCTAssertEqual(errnoOf { _ = try Syscall.pread(fd, buffer.baseAddress!, 4096, 3 << 20) }, EIO)
        XCTAssertEqual(errnoOf { _ = try Syscall.pread(fd, buffer.baseAddress!, 4096, 2 << 20) }, EIO)
        XCTAssertEqual(try Syscall.pread(fd, buffer.baseAddress!, 4096, 8192), 4096)
        XCTAssertTrue(buffer.prefix(4096).elementsEqual(content[8192..<12288]))
        XCTAssertEqual(kill(daemon.pid, 0), 0, "the daemon is alive")
        try writeFile(daemon.mnt("after.txt"), bytes("still serving"))
        XCTAssertEqual(try readFile(daemon.mnt("after.txt")), bytes("still serving"))
    }

    /// Whether the first page of the file at `path` is in the page cache (mincore of a mapping).
    private func firstPageCached(_ path: String) throws -> Bool {
        let fd = try Syscall.open(path, O_RDONLY)
        defer { close(fd) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        guard let map = mmap(nil, page, PROT_READ, MAP_SHARED, fd, 0), map != MAP_FAILED else { throw Errno.current }
        defer { munmap(map, page) }
        var resident: UInt8 = 0
        guard mincore(map, page, &resident) == 0 else { throw Errno.current }
        return resident & 1 != 0
    }

    func testReadingADirectorysFilesInOrderFetchesTheNextOnes() throws {
        let daemon = try MountedDaemon()
        defer { daemon.destroy() }
        // Files made in the backing store (the mount has not seen them), then dropped from the page cache.
        try FileManager.default.createDirectory(atPath: daemon.back("tree"), withIntermediateDirectories: false)
        for index in 0..<40 { try writeFile(daemon.back("tree/file\(index)"), [UInt8](repeating: UInt8(index), count: 64 << 10)) }
        try mustRun(["sync"])
        for index in 0..<40 {
            let fd = try Syscall.open(daemon.back("tree/file\(index)"), O_RDONLY)
            XCTAssertEqual(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0)
            close(fd)
            XCTAssertFalse(try firstPageCached(daemon.back("tree/file\(index)")))
        }

        // The listing order, as a program reading the mount sees it.
        let stream = try XCTUnwrap(opendir(daemon.mnt("tree")))
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name.hasPrefix("file") { names.append(name) }
        }
        closedir(stream)
        XCTAssertEqual(names.count, 40)
        let window = 16

        // Reading the first file: the next `window` files are fetched, the rest is not.
        XCTAssertEqual(try readFile(daemon.mnt("tree/\(names[0])")).count, 64 << 10)
        _ = try? eventually("the read-ahead window fetched", timeout: 5) { try firstPageCached(daemon.back("tree/\(names[window])")) }
        for index in 1...window { XCTAssertTrue(try firstPageCached(daemon.back("tree/\(names[index])")), "\(index) fetched") }
        usleep(200_000)
        for index in (window + 2)..<40 { XCTAssertFalse(try firstPageCached(daemon.back("tree/\(names[index])")), "\(index) not fetched") }

        // A read out of order (a program picking one file) fetches nothing more.
        XCTAssertEqual(try readFile(daemon.mnt("tree/\(names[30])")).first, UInt8(names[30].dropFirst(4))!)
        usleep(200_000)
        for index in 31..<40 { XCTAssertFalse(try firstPageCached(daemon.back("tree/\(names[index])")), "\(index) not fetched after a jump") }
    }
}
