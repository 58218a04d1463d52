import Glibc
import XCTest
@testable import CustodySystem
import CustodyTestSupport

/// The boost writes the same 4-byte values to a regular file as it would to `/dev/cpu_dma_latency`,
/// so the file holds the history of requests it made.
final class WakeLatencyTests: XCTestCase {
    private var path = ""

    override func setUp() {
        path = "/tmp/custody-wake-latency-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let fd = creat(path, 0o600)
        XCTAssertGreaterThanOrEqual(fd, 0)
        close(fd)
    }

    override func tearDown() {
        unlink(path)
    }

    private func history() -> [Int32] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        bytes = Array(bytes[0..<max(0, count)])
        return stride(from: 0, to: bytes.count - 3, by: 4).map { offset in
            Int32(bitPattern: UInt32(bytes[offset]) | UInt32(bytes[offset + 1]) << 8 | UInt32(bytes[offset + 2]) << 16 | UInt32(bytes[offset + 3]) << 24)
        }
    }

    private func waitFor(_ condition: () -> Bool, seconds: Double = 5) -> Bool {
        (try? eventually("the condition", timeout: seconds, interval: 0.001, condition)) != nil
    }

    func testBurstHoldsZeroLatencyAndQuietReleasesIt() throws {
        var tuning = WakeLatencyBoost.Tuning()
        tuning.burstRequests = 16
        tuning.windowNanoseconds = 20_000_000
        tuning.quietWindows = 2
        let boost = try XCTUnwrap(WakeLatencyBoost(path: path, tuning: tuning))
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained], "opening asks for nothing")

        // A few requests far apart: no boost.
        for _ in 0..<3 {
            boost.noteRequest()
            usleep(30_000)
        }
        XCTAssertFalse(boost.isBoosted)
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained])

        // A burst: the bound of 0 is asked for at once.
        for _ in 0..<64 { boost.noteRequest() }
        XCTAssertTrue(boost.isBoosted)
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained, 0])

        // Requests that keep coming keep it (checked over several windows).
        let keepUntil = monotonicSeconds() + 0.15
        while monotonicSeconds() < keepUntil {
            for _ in 0..<32 { boost.noteRequest() }
            usleep(2_000)
        }
        XCTAssertTrue(boost.isBoosted)
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained, 0])

        // Quiet: released after the quiet windows, and a new burst boosts again.
        XCTAssertTrue(waitFor { !boost.isBoosted })
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained, 0, WakeLatencyBoost.unconstrained])
        for _ in 0..<64 { boost.noteRequest() }
        XCTAssertTrue(boost.isBoosted)
        XCTAssertEqual(boost.boostCount, 2)
        XCTAssertTrue(waitFor { !boost.isBoosted })
        XCTAssertEqual(history(), [WakeLatencyBoost.unconstrained, 0, WakeLatencyBoost.unconstrained, 0, WakeLatencyBoost.unconstrained])
    }

    func testUnavailableDeviceGivesNoBoost() {
        XCTAssertNil(WakeLatencyBoost(path: "/nonexistent/cpu_dma_latency", tuning: .init()))
    }
}
