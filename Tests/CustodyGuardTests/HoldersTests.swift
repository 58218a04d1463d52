import CLinux
@testable import CustodyGuard
import XCTest

/// The table of holders follows forks, executions and exits as the kernel reports them.
final class HoldersTests: XCTestCase {
    func event(_ what: Int32, pid: Int32, tgid: Int32, parent: Int32 = 0, parentProcess: Int32 = 0) -> clinux_process_event {
        clinux_process_event(what: what, pid: pid, tgid: tgid, parent_pid: parent, parent_tgid: parentProcess)
    }
    let fork = Int32(CLINUX_PROCESS_FORK), exec = Int32(CLINUX_PROCESS_EXEC), exit = Int32(CLINUX_PROCESS_EXIT)

    func testChildrenStartedAfterwardsHoldWhatTheirParentHolds() {
        var table = ProcessHolders()
        table.apply(event(fork, pid: 20, tgid: 20, parent: 10, parentProcess: 10))
        XCTAssertNil(table.holder(ofThread: 20), "a child started before its parent held anything holds nothing")
        table.hold(10, identities: ["a@contoso.com"], threads: [10, 11], since: 100)
        XCTAssertEqual(table.holder(ofThread: 11)?.process, 10)
        XCTAssertNil(table.holder(ofThread: 20))
        table.apply(event(fork, pid: 30, tgid: 30, parent: 11, parentProcess: 10))
        XCTAssertEqual(table.holder(ofThread: 30)?.holder.identities, ["a@contoso.com"])
        table.apply(event(fork, pid: 31, tgid: 30, parent: 30, parentProcess: 30))
        XCTAssertEqual(table.holder(ofThread: 31)?.process, 30, "a new thread of a holder")
        table.apply(event(fork, pid: 40, tgid: 40, parent: 31, parentProcess: 30))
        XCTAssertEqual(table.holder(ofThread: 40)?.holder.identities, ["a@contoso.com"], "grandchildren too")
        table.hold(30, identities: ["b@contoso.com"], threads: [], since: 200)
        XCTAssertEqual(table.holder(ofThread: 31)?.holder.identities, ["a@contoso.com", "b@contoso.com"])
    }

    func testExitsEmptyTheTableAndAReusedIDHoldsNothing() {
        var table = ProcessHolders()
        table.hold(10, identities: ["a@contoso.com"], threads: [10, 11], since: 1)
        table.apply(event(exit, pid: 10, tgid: 10))
        XCTAssertEqual(table.holder(ofThread: 11)?.process, 10, "the process lives while a thread does")
        table.apply(event(exit, pid: 11, tgid: 10))
        XCTAssertTrue(table.isEmpty)
        table.apply(event(fork, pid: 10, tgid: 10, parent: 1, parentProcess: 1))
        XCTAssertNil(table.holder(ofThread: 10))
    }

    func testAnExecutionLeavesOneThread() {
        var table = ProcessHolders()
        table.hold(10, identities: ["a@contoso.com"], threads: [10, 11, 12], since: 1)
        table.apply(event(exec, pid: 10, tgid: 10))
        XCTAssertNil(table.holder(ofThread: 11))
        XCTAssertEqual(table.holder(ofThread: 10)?.holder.identities, ["a@contoso.com"], "a program run by a holder still holds")
        table.apply(event(exit, pid: 10, tgid: 10))
        XCTAssertTrue(table.isEmpty)
    }

    func testResynchronizingFindsLaterDescendantsAndDropsTheGone() {
        var table = ProcessHolders()
        table.hold(10, identities: ["a@contoso.com"], threads: [10], since: 100)
        table.hold(50, identities: ["b@contoso.com"], threads: [50], since: 100)
        let alive: [Int32: [Int32]] = [10: [10, 12], 20: [20], 21: [21], 30: [30]]
        table.resynchronize(threads: { alive[$0] }, children: [(21, 20, 150), (20, 10, 120), (30, 10, 90)])
        XCTAssertNil(table.holder(ofThread: 50), "gone")
        XCTAssertEqual(table.holder(ofThread: 12)?.process, 10)
        XCTAssertEqual(table.holder(ofThread: 21)?.holder.identities, ["a@contoso.com"], "a grandchild listed before its parent")
        XCTAssertNil(table.holder(ofThread: 30), "started before its parent held anything")
    }

    /// What is saved across restarts changes with who holds what, not with threads coming and going.
    func testMembershipCountsProcessesAndIdentitiesNotThreads() {
        var table = ProcessHolders()
        var seen = table.membership
        func changed() -> Bool {
            defer { seen = table.membership }
            return table.membership != seen
        }
        table.hold(10, identities: ["a@contoso.com"], threads: [10], since: 1)
        XCTAssertTrue(changed())
        table.hold(10, identities: ["a@contoso.com"], threads: [10], since: 1)
        XCTAssertFalse(changed(), "nothing new")
        table.apply(event(fork, pid: 11, tgid: 10, parent: 10, parentProcess: 10))
        table.apply(event(exit, pid: 11, tgid: 10))
        XCTAssertFalse(changed(), "a thread came and went")
        table.hold(10, identities: ["b@contoso.com"], threads: [], since: 1)
        XCTAssertTrue(changed(), "another identity")
        table.apply(event(fork, pid: 20, tgid: 20, parent: 10, parentProcess: 10))
        XCTAssertTrue(changed(), "a child")
        table.apply(event(exit, pid: 20, tgid: 20))
        XCTAssertTrue(changed(), "it exited")
        table.drop(10)
        XCTAssertTrue(changed())
    }
}
