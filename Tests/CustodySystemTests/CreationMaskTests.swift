@testable import CustodySystem
import Foundation
import Glibc
import XCTest

final class CreationMaskTests: TemporaryDirectoryTestCase {
    /// Runs `body` on a thread of its own and waits for it.
    private func onNewThread(_ body: @escaping @Sendable () -> Void) {
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            body()
            done.signal()
        }
        thread.start()
        done.wait()
    }

    private func mode(_ name: String) throws -> mode_t {
        try Syscall.lstat(directory + "/" + name).st_mode & 0o7777
    }

    func testTheMaskAppliesToTheCreationAndOnlyOnItsThread() throws {
        let processMask = umask(0)
        defer { umask(processMask) }
        let path = directory
        onNewThread {
            let fd = CreationMask.creating(mode: 0o666, mask: 0o027) { mode in open(path + "/masked", O_CREAT | O_WRONLY | O_CLOEXEC, mode) }
            if fd >= 0 { close(fd) }
            // The thread's own mask is back to what it was (the process's, 0).
            let fd2 = open(path + "/after", O_CREAT | O_WRONLY | O_CLOEXEC, 0o666)
            if fd2 >= 0 { close(fd2) }
            _ = CreationMask.creating(mode: 0o777, mask: 0o077) { mode in mkdir(path + "/dir", mode) }
        }
        XCTAssertEqual(try mode("masked"), 0o640)
        XCTAssertEqual(try mode("after"), 0o666, "the thread's umask is put back")
        XCTAssertEqual(try mode("dir"), 0o700)
        XCTAssertEqual(umask(0), 0, "the other threads' umask never changed")
        let fd = open(directory + "/here", O_CREAT | O_WRONLY | O_CLOEXEC, 0o666)
        if fd >= 0 { close(fd) }
        XCTAssertEqual(try mode("here"), 0o666)
    }

    func testAZeroMaskLeavesTheModeAndMakesNoContext() throws {
        let path = directory
        onNewThread {
            let fd = CreationMask.creating(mode: 0o4751, mask: 0) { mode in open(path + "/exact", O_CREAT | O_WRONLY | O_CLOEXEC, mode) }
            if fd >= 0 { close(fd) }
            XCTAssertNil(CreationMask.contexts.value.own, "no context is made for a mask of 0")
        }
        XCTAssertEqual(try mode("exact"), 0o4751 & ~umask(umask(0)))
    }
}
