import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// What a crash leaves is reported as a torn write, never as tampering, and can be cut back to its
/// last authentic block; every kind of tampering (a header field, a block) reaches the event and
/// the metric.
final class CrashDamageTests: XCTestCase {
    var daemon: MountedDaemon?

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    static let alice = "alice@contoso.com"
    static let arguments = ["--default-identity", "0=\(alice)"]
    let layout = BlockLayout()

    func start() throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: Self.arguments)
        self.daemon = daemon
        let answer = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#)
        XCTAssertEqual(answer.status, 201, answer.body)
        return daemon
    }

    func dropCaches() throws { _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"]) }

    func events(_ daemon: MountedDaemon, _ kind: String) throws -> [[String: Any]] {
        let (status, body) = try daemon.api("GET", "/v1/events?follow=false")
        XCTAssertEqual(status, 200, body)
        return body.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }.filter { $0["kind"] as? String == kind }
    }

    func metric(_ daemon: MountedDaemon, _ name: String) throws -> Double {
        MetricsTests.parse(try daemon.api("GET", "/v1/metrics").body)[name] ?? 0
    }

    /// Tears `file`'s stored block `block` as a `pwrite` cut short would: the stored file ends at
    /// a page boundary inside that block.
    func tear(_ daemon: MountedDaemon, _ file: String, inBlock block: UInt64) throws {
        let page = (layout.storedOffset(ofBlock: block + 1) - 1) / 4096 * 4096
        XCTAssertGreaterThan(page, layout.storedOffset(ofBlock: block), "a page boundary inside block \(block)")
        _ = try mustRun(["truncate", "-s", "\(page)", daemon.back(file)])
    }

    /// The sum of a metric family's kinds.
    func sum(_ daemon: MountedDaemon, _ family: String) throws -> Double {
        try ["block", "header", "truncated"].reduce(0) { $0 + (try metric(daemon, "\(family){kind=\"\($1)\"}")) }
    }

    func testAWriteTornByAnUncleanStopIsATornWriteAndRepairs() throws {
        let daemon = try start()
        let data = (0..<(10 * 4096)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 5) }
        try writeFile(daemon.mnt("big.bin"), data)
        XCTAssertEqual(xattr(daemon.mnt("big.bin"), "user.custody.encrypted"), "1")
        // The daemon stops in the middle of storing block 7 (killed), its last pwrite cut short.
        try tear(daemon, "big.bin", inBlock: 7)
        daemon.killHard()
        try daemon.start(extraArguments: Self.arguments)
        XCTAssertTrue(daemon.log.contains("did not stop cleanly"), daemon.log)
        try dropCaches()
        XCTAssertThrowsError(try readFile(daemon.mnt("big.bin"))) { XCTAssertEqual($0 as? Errno, .ioError, "\($0)") }
        XCTAssertEqual(try events(daemon, "tornWrite").count, 1, "reported as a torn write")
        XCTAssertTrue(try events(daemon, "tamperDetected").isEmpty, "and not as tampering")
        XCTAssertGreaterThan(try sum(daemon, "custody_torn_writes_total"), 0)
        XCTAssertEqual(try sum(daemon, "custody_tamper_detections_total"), 0)

        // The administrator cuts it back to its last authentic block.
        let repaired = try daemon.ctl(["repair", daemon.mnt("big.bin")])
        XCTAssertEqual(repaired.status, 0, repaired.error)
        XCTAssertTrue(repaired.output.contains("cut back to its last authentic block"), repaired.output)
        let (status, answer) = try daemon.apiJSON("POST", "/v1/files/repair", #"{"path": "\#(daemon.mnt("big.bin"))"}"#)
        XCTAssertEqual(status, 200)
        XCTAssertEqual(answer["repaired"] as? Bool, false, "repairing again changes nothing")
        let kept = try readFile(daemon.mnt("big.bin"))
        XCTAssertEqual(kept.count, 7 * 4096, "the blocks before the torn one")
        XCTAssertTrue(kept == Array(data.prefix(7 * 4096)), "a clean prefix of what was written")
        let event = try XCTUnwrap(try events(daemon, "fileRepaired").first)
        XCTAssertEqual((event["details"] as? [String: String])?["sizeAfter"], "\(7 * 4096)")
        XCTAssertTrue(daemon.log.contains("repaired"), daemon.log)
        // Only administrators repair.
        let user = try testUser("custody-test")
        try daemon.openToOtherUsers()
        let refused = try daemon.api("POST", "/v1/files/repair", #"{"path": "\#(daemon.mnt("big.bin"))"}"#, asUser: user)
        XCTAssertEqual(refused.status, 403, refused.body)
    }

    /// The daemon killed in the middle of a streamed write, again and again: what fsync covered
    /// is intact every time, nothing is ever reported as tampering, and a file the kill tore reads
    /// whole again after a repair.
    func testKilledDuringALargeWriteNeverRaisesATamperAlarm() throws {
        let daemon = try start()
        let writer = #"""
        import os, sys
        path, synced = sys.argv[1], sys.argv[2]
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        chunk = bytes((i * 7 + 1) % 251 for i in range(1 << 20))
        for i in range(64):
            os.write(fd, chunk)
            if i == 7:
                os.fsync(fd)
                open(synced, "w").write(str(8 << 20))
        """#
        let chunk = (0..<(1 << 20)).map { UInt8(($0 * 7 + 1) % 251) }
        for round in 0..<3 {
            let file = "stream\(round).bin", synced = daemon.root + "/synced\(round)"
            let program = try spawn("/usr/bin/python3", ["-c", writer, daemon.mnt(file), synced])
            _ = try? eventually("the writer's first fsync", timeout: 20) { access(synced, F_OK) == 0 }
            usleep(UInt32(50_000 + round * 70_000))
            daemon.killHard()
            kill(program, SIGKILL)
            _ = waitForExit(program, seconds: 10)
            try daemon.start(extraArguments: Self.arguments)
            try dropCaches()
            // What fsync covered reads back, whatever the kill tore after it.
            let copy = daemon.root + "/head\(round)"
            let head = try runCommand(["dd", "if=\(daemon.mnt(file))", "of=\(copy)", "bs=1M", "count=8", "status=none"])
            XCTAssertEqual(head.status, 0, "round \(round): \(head.error)")
            XCTAssertTrue(try readFile(copy) == Array([[UInt8]](repeating: chunk, count: 8).joined()), "round \(round): the fsynced 8 MiB")
            if (try? readFile(daemon.mnt(file))) == nil {
                XCTAssertFalse(try events(daemon, "tornWrite").isEmpty, "round \(round): a torn write is reported as one")
                XCTAssertEqual(try daemon.ctl(["repair", daemon.mnt(file)]).status, 0)
                let whole = try readFile(daemon.mnt(file))
                XCTAssertGreaterThanOrEqual(whole.count, 8 << 20, "round \(round)")
            }
            XCTAssertTrue(try events(daemon, "tamperDetected").isEmpty, "round \(round): no tamper alarm")
        }
    }

    func testDamageAfterACleanStartIsTampering() throws {
        let daemon = try start()
        try writeFile(daemon.mnt("a.bin"), [UInt8](repeating: 9, count: 3 * 4096))
        daemon.stop()
        try daemon.start(extraArguments: Self.arguments)
        XCTAssertFalse(daemon.log.contains("did not stop cleanly"), daemon.log)
        // Changed on the disk while the daemon runs: no crash can explain it.
        try tear(daemon, "a.bin", inBlock: 1)
        try dropCaches()
        XCTAssertThrowsError(try readFile(daemon.mnt("a.bin")))
        XCTAssertEqual(try events(daemon, "tamperDetected").count, 1)
        XCTAssertTrue(try events(daemon, "tornWrite").isEmpty)
    }

    /// Each header field changed on the disk: the open is refused with EIO, and each refusal is a
    /// tamperDetected event (header) and counts in the metric.
    func testEveryHeaderChangeIsReported() throws {
        let daemon = try start()
        // Offsets of the header's fields (docs/format.md): magic, version, kind, class, header
        // length, file ID, block size, wrap method, owner lengths, reserved, class key ID,
        // ephemeral key, owner, wrapped key, tail.
        let offsets = [0, 8, 10, 11, 12, 20, 32, 36, 37, 39, 40, 60, 90, 300, 450, 505]
        for index in offsets.indices {
            try writeFile(daemon.mnt("h\(index).bin"), [UInt8](repeating: UInt8(index), count: 100))
        }
        try dropCaches()
        for (index, offset) in offsets.enumerated() {
            let path = daemon.back("h\(index).bin")
            var bytes = try Array(Data(contentsOf: URL(fileURLWithPath: path)))
            bytes[offset] ^= 0x41
            try Data(bytes).write(to: URL(fileURLWithPath: path))
        }
        try dropCaches()
        for (index, offset) in offsets.enumerated() {
            XCTAssertThrowsError(try readFile(daemon.mnt("h\(index).bin")), "offset \(offset)") {
                XCTAssertEqual($0 as? Errno, .ioError, "offset \(offset): \($0)")
            }
        }
        let reported = try events(daemon, "tamperDetected")
        XCTAssertEqual(reported.count, offsets.count, "\(reported)")
        XCTAssertTrue(reported.allSatisfy { ($0["details"] as? [String: String])?["kind"] == "header" }, "\(reported)")
        XCTAssertEqual(try metric(daemon, #"custody_tamper_detections_total{kind="header"}"#), Double(offsets.count))
    }
}
