import CustodySystem
import Foundation
import Glibc
import XCTest

/// Real tools and concurrent writers through the mount.
final class WorkloadTests: XCTestCase {
    var daemon: MountedDaemon!

    override func setUpWithError() throws {
        daemon = try MountedDaemon()
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testTarOfUsrIncludeRoundTripsByteForByte() throws {
        let tarball = daemon.root + "/include.tar"
        try mustRun(["tar", "-C", "/usr", "-cf", tarball, "include"])
        try mustRun(["tar", "-C", daemon.mountPoint, "-xf", tarball])
        let count = try mustRun(["sh", "-c", "find '\(daemon.mnt("include"))' | wc -l"])
        XCTAssertGreaterThan(Int(count.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0, 1000)
        // Same names, types, symlink targets and bytes: through the mount, and on the backing store.
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include", daemon.mnt("include")])
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include", daemon.back("include")])
        // Listing and re-reading cold.
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include", daemon.mnt("include")])
        let listing = try mustRun(["ls", "-lR", daemon.mnt("include")])
        XCTAssertTrue(listing.contains("stdio.h"))
        try mustRun(["rm", "-rf", daemon.mnt("include")])
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.back("include")))
    }

    func testCpAndSqliteWork() throws {
        try mustRun(["cp", "-a", "/usr/include/linux", daemon.mnt("linux")])
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include/linux", daemon.back("linux")])
        let db = daemon.mnt("test.db")
        try mustRun(["sqlite3", db, "create table t(k integer primary key, v text);"])
        var script = "begin;"
        for i in 0..<500 { script += "insert into t(v) values('row \(i)');" }
        script += "commit;"
        try mustRun(["sqlite3", db], input: Data(script.utf8))
        XCTAssertEqual(try mustRun(["sqlite3", db, "select count(*), max(k) from t;"]), "500|500\n")
        XCTAssertEqual(try mustRun(["sqlite3", daemon.back("test.db"), "pragma integrity_check;"]), "ok\n")
    }

    func testEightWritersOnDistinctFiles() throws {
        let size = 2 << 20
        let mountPoint = daemon.mountPoint
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            let pattern = [UInt8](repeating: UInt8(worker + 1), count: 64 << 10)
            guard let fd = try? Syscall.open(mountPoint + "/w\(worker)", O_WRONLY | O_CREAT | O_TRUNC, 0o644) else { return }
            defer { close(fd) }
            var offset = 0
            while offset < size {
                try? pattern.withUnsafeBytes { try Syscall.pwriteAll(fd, $0.baseAddress!, $0.count, Int64(offset)) }
                offset += pattern.count
            }
        }
        for worker in 0..<8 {
            let stored = try readFile(daemon.back("w\(worker)"))
            XCTAssertEqual(stored.count, size)
            XCTAssertTrue(stored.allSatisfy { $0 == UInt8(worker + 1) }, "file \(worker) holds only its writer's bytes")
        }
    }

    func testEightWritersOnOneFileAtDistinctOffsets() throws {
        let slice = 1 << 20
        let fd = try Syscall.open(daemon.mnt("shared"), O_RDWR | O_CREAT | O_TRUNC, 0o644)
        defer { close(fd) }
        let path = daemon.mnt("shared")
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            // Each writer has its own handle too, as separate processes would.
            guard let own = try? Syscall.open(path, O_WRONLY) else { return }
            defer { close(own) }
            let chunk = [UInt8](repeating: UInt8(0x10 + worker), count: 16 << 10)
            var done = 0
            while done < slice {
                try? chunk.withUnsafeBytes { try Syscall.pwriteAll(own, $0.baseAddress!, $0.count, Int64(worker * slice + done)) }
                done += chunk.count
            }
        }
        XCTAssertEqual(fsync(fd), 0)
        let stored = try readFile(daemon.back("shared"))
        XCTAssertEqual(stored.count, 8 * slice)
        for worker in 0..<8 {
            let part = stored[(worker * slice)..<((worker + 1) * slice)]
            XCTAssertTrue(part.allSatisfy { $0 == UInt8(0x10 + worker) }, "slice \(worker) is intact")
        }
    }
}
