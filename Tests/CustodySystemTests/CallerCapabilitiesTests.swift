import Foundation
import Glibc
import XCTest

@testable import CustodySystem

final class CallerCapabilitiesTests: XCTestCase {
    func testTheEffectiveSetIsReadFromTheStatusText() {
        let status = "Name:\tsh\nCapInh:\t0000000000000010\nCapPrm:\t0000000000000010\nCapEff:\t0000000000000010\nCapBnd:\t000001ffffffffff\n"
        XCTAssertEqual(CallerCapabilities.effectiveSet(inStatus: status), 0x10)
        XCTAssertNil(CallerCapabilities.effectiveSet(inStatus: "Name:\tsh\nCapPrm:\t0000000000000010\n"), "no line")
        XCTAssertNil(CallerCapabilities.effectiveSet(inStatus: "CapEff:\tzz\n"), "not hexadecimal")
        XCTAssertNil(CallerCapabilities.effectiveSet(inStatus: "CapEff:\t\n"), "empty")
        XCTAssertNil(CallerCapabilities.effectiveSet(inStatus: "CapEff:\t00000000000000000010\n"), "wider than 64 bits")
    }

    /// This test's own thread, against what /proc and the process say, and a thread that is gone.
    func testAThreadsCapabilitiesComeFromProc() throws {
        let me = Linux.currentThreadID()
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        let effective = try XCTUnwrap(CallerCapabilities.effectiveSet(inStatus: status))
        XCTAssertEqual(CallerCapabilities.has(CallerCapabilities.setID, thread: me), effective & 0x10 != 0)
        XCTAssertEqual(geteuid() == 0, CallerCapabilities.has(CallerCapabilities.setID, thread: me), "root here holds CAP_FSETID")
        XCTAssertFalse(CallerCapabilities.has(CallerCapabilities.setID, thread: 0))
        XCTAssertFalse(CallerCapabilities.has(64, thread: me), "beyond the mask")
        // A thread ID that no task has (above pid_max).
        XCTAssertFalse(CallerCapabilities.has(CallerCapabilities.setID, thread: 4_194_304 + 1))
    }
}
