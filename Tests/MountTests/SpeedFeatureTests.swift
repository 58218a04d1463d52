import CustodySystem
import Foundation
import Glibc
import XCTest

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
        let deadline = monotonicSeconds() + 2
        while currentLatencyBound() == 0, monotonicSeconds() < deadline { usleep(1_000) }
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
        let deadline = monotonicSeconds() + 3
        var dirty = try dirtyKiB() - baseline
        while dirty > 16 << 10, monotonicSeconds() < deadline {
            usleep(50_000)
            dirty = try dirtyKiB() - baseline
        }
        XCTAssertLessThan(dirty, 16 << 10, "the backing file's write-back started as the data arrived")
    }
}
