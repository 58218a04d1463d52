@testable import CustodySystem
import CLinux
import Foundation
import Glibc
import Synchronization
import XCTest

final class AllocationCredentialsTests: XCTestCase {
    /// The calling thread's effective capabilities (CapEff of /proc/thread-self/status).
    private static func effectiveCapabilities() -> UInt64 {
        let fd = open("/proc/thread-self/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return 0 }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 8192)
        let count = read(fd, &bytes, bytes.count)
        let status = String(decoding: bytes.prefix(max(0, count)), as: UTF8.self)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("CapEff:") }),
              let value = UInt64(line.dropFirst("CapEff:".count).trimmingCharacters(in: .whitespaces), radix: 16) else { return 0 }
        return value
    }

    private static func has(_ capability: Int, _ set: UInt64) -> Bool { set & (1 << UInt64(capability)) != 0 }

    func testAllocatingTakesTheOwnersFSUIDKeepsTheRestAndDropsResourceOnThatThreadOnly() throws {
        guard geteuid() == 0 else { throw XCTSkip("needs root") }
        // Where root has CAP_SYS_RESOURCE at all (a container may not give it), other threads keep it.
        let resourceHere = Self.has(24, Self.effectiveCapabilities())
        let cases = Mutex<[String: UInt64]>([:])
        let done = DispatchSemaphore(value: 0)
        Thread {
            AllocationCredentials.allocating(for: 65534) {
                cases.withLock {
                    $0["fsuid inside"] = UInt64(clinux_setfsuid(uid_t.max))
                    $0["caps inside"] = Self.effectiveCapabilities()
                }
            }
            cases.withLock {
                $0["fsuid after"] = UInt64(clinux_setfsuid(uid_t.max))
                $0["caps after"] = Self.effectiveCapabilities()
            }
            done.signal()
        }.start()
        done.wait()
        let seen = cases.withLock { $0 }
        XCTAssertEqual(seen["fsuid inside"], 65534, "the allocation runs with the owner's fsuid")
        XCTAssertEqual(seen["fsuid after"], 0, "and the daemon's is back after it")
        let inside = try XCTUnwrap(seen["caps inside"]), after = try XCTUnwrap(seen["caps after"])
        XCTAssertFalse(Self.has(24, inside), "no CAP_SYS_RESOURCE while allocating")
        XCTAssertFalse(Self.has(24, after), "nor after, on that thread")
        XCTAssertTrue(Self.has(4, inside), "CAP_FSETID stays (the fsuid change would have cleared it)")
        XCTAssertTrue(Self.has(1, inside) && Self.has(0, inside), "so do CAP_DAC_OVERRIDE and CAP_CHOWN")
        XCTAssertEqual(Self.has(24, Self.effectiveCapabilities()), resourceHere, "other threads keep what they had")
    }
}
