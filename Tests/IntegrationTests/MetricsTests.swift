import CustodyFormat
import Foundation
import Glibc
import XCTest

/// `GET /v1/metrics` and the loopback listener: the text passes `promtool check metrics`, and the
/// counters move as a scripted workload says they must (writes, a wrong passphrase, a lock, a
/// tampered file, a wipe).
final class MetricsTests: XCTestCase {
    var daemon: MountedDaemon?
    var port: UInt16 = 0

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    /// promtool from Debian's prometheus package (`make promtool` extracts it into .build/tools).
    func promtool() throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        let candidates = [ProcessInfo.processInfo.environment["PROMTOOL"], root + "/.build/tools/promtool", "/usr/bin/promtool"]
        if let found = candidates.compactMap({ $0 }).first(where: { access($0, X_OK) == 0 }) { return found }
        if ProcessInfo.processInfo.environment["CI"] == "true" { XCTFail("promtool is missing and CI=true (make promtool)") }
        throw XCTSkip("promtool is missing (make promtool)")
    }

    /// A free loopback port.
    static func freePort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else { throw HarnessError("no free port") }
        return UInt16(bigEndian: address.sin_port)
    }

    /// Series by name and labels as written (`name{a="b"}`), to their values.
    static func parse(_ text: String) -> [String: Double] {
        var values: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            values[String(line[..<space])] = value
        }
        return values
    }

    func scrape(asUser uid: UInt32? = nil) throws -> (text: String, values: [String: Double]) {
        let answer = try XCTUnwrap(daemon).api("GET", "/v1/metrics", asUser: uid)
        XCTAssertEqual(answer.status, 200, answer.body)
        return (answer.body, Self.parse(answer.body))
    }

    func check(_ text: String, _ what: String) throws {
        let file = try XCTUnwrap(daemon).root + "/metrics-\(what).txt"
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        let result = try runCommand(["sh", "-c", "'\(try promtool())' check metrics < '\(file)'"])
        XCTAssertEqual(result.status, 0, "promtool on the \(what) metrics: \(result.output) \(result.error)")
    }

    func testCountersFollowAWorkloadAndPassPromtool() throws {
        port = try Self.freePort()
        // Identities shown (scrubbing off), to check the per-account series; PrivacyTests checks the default.
        let daemon = try MountedDaemon(extraArguments: ["--default-identity", "0=alice@contoso.com", "--lock-grace-period", "0",
                                                        "--metrics-listen", "127.0.0.1:\(port)", "--log-identities"])
        self.daemon = daemon
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com", "passphrase": "right"}"#).status, 201)
        let before = try scrape().values
        XCTAssertEqual(before[#"custody_accounts{state="unlocked"}"#], 1)
        XCTAssertEqual(before["custody_mounts"], 1)

        // Three encrypted files written, one read back.
        let data = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        for name in ["a", "b", "c"] { try writeFile(daemon.mnt(name), data) }
        _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        XCTAssertEqual(try Data(contentsOf: URL(fileURLWithPath: daemon.mnt("b"))), Data(data))
        // A wrong passphrase, a lock (no grace period), the right passphrase.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "wrong"}"#).status, 403)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/lock").status, 200)
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice-id").status, 200)
        let locked = try scrape().values
        XCTAssertEqual(locked[#"custody_accounts{state="locked"}"#], 1)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "right"}"#).status, 200)
        // A tampered block: zeroed on the backing store, then read.
        let layout = BlockLayout()
        _ = try mustRun(["dd", "if=/dev/zero", "of=\(daemon.back("a"))", "bs=1", "seek=\(layout.storedOffset(ofBlock: 1))", "count=64",
                         "conv=notrunc", "status=none"])
        _ = try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        XCTAssertNotEqual(try runCommand(["cat", daemon.mnt("a")]).status, 0, "the tampered file does not read")

        let (adminText, after) = try scrape()
        func delta(_ series: String) -> Double { (after[series] ?? 0) - (before[series] ?? 0) }
        XCTAssertGreaterThanOrEqual(delta(#"custody_fuse_requests_total{op="create"}"#), 3)
        XCTAssertGreaterThanOrEqual(delta(#"custody_fuse_requests_total{op="write"}"#), 3)
        XCTAssertGreaterThanOrEqual(delta(#"custody_fuse_request_duration_seconds_count{op="create"}"#), 3)
        XCTAssertEqual(delta(#"custody_files_created_total{owner="encrypted"}"#), 3)
        XCTAssertEqual(delta("custody_encrypted_bytes_total"), 30_000, "every written byte is counted once")
        XCTAssertGreaterThanOrEqual(delta("custody_decrypted_bytes_total"), 10_000)
        XCTAssertGreaterThanOrEqual(delta(#"custody_fuse_requests_total{op="lookup"}"#), 3, "each new name was looked up first")
        XCTAssertGreaterThanOrEqual(delta(#"custody_fuse_errors_total{op="read",errno="EIO"}"#), 1)
        XCTAssertGreaterThanOrEqual(delta(#"custody_tamper_detections_total{kind="block"}"#), 1)
        XCTAssertEqual(delta(#"custody_unlock_failures_total{protector="passphrase",reason="wrong"}"#), 1)
        XCTAssertEqual(delta(#"custody_lock_requests_total{cause="manual"}"#), 1)
        XCTAssertEqual(delta("custody_locks_total"), 1)
        XCTAssertEqual(delta(#"custody_unlocks_total{cause="passphrase"}"#), 1)
        XCTAssertEqual(after[#"custody_account_lock_state{identity="alice@contoso.com",state="unlocked"}"#], 1,
                       "an administrator sees the per-account series while identities are not scrubbed")
        try check(adminText, "admin")

        // The tampering is an event naming the owner and the file.
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        let tamper = try XCTUnwrap(events.split(separator: "\n").first { $0.contains("\"tamperDetected\"") }, events)
        XCTAssertTrue(tamper.contains("alice@contoso.com") && tamper.contains(#""kind":"block""#) && tamper.contains(#""path":"a""#), String(tamper))

        // Another user: the same counters, no identity.
        try daemon.openToOtherUsers()
        let other = try scrape(asUser: try testUser())
        XCTAssertFalse(other.text.contains("alice"), other.text)
        XCTAssertEqual(other.values["custody_locks_total"], after["custody_locks_total"])

        // The wipe: a job done, its files and bytes counted.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/wipe").status, 200)
        let wiped = try scrape().values
        XCTAssertEqual((wiped[#"custody_jobs_total{kind="wipe",result="done"}"#] ?? 0) - (before[#"custody_jobs_total{kind="wipe",result="done"}"#] ?? 0), 1)
        XCTAssertEqual((wiped[#"custody_job_files_total{kind="wipe"}"#] ?? 0) - (before[#"custody_job_files_total{kind="wipe"}"#] ?? 0), 3)
        XCTAssertGreaterThan(wiped["custody_wipe_bytes_freed_total"] ?? 0, 30_000)
        XCTAssertEqual(wiped[#"custody_jobs_running{kind="wipe"}"#], 0)
        XCTAssertEqual(wiped[#"custody_accounts{state="unlocked"}"#], 0)
        XCTAssertEqual(wiped["custody_wipe_keys_destroyed_seconds_count"], 1)

        // The loopback listener: the same text without identities; nothing else served.
        let tcp = try runCommand(["curl", "-s", "-w", "\n%{http_code}", "http://127.0.0.1:\(port)/metrics"])
        XCTAssertTrue(tcp.output.hasSuffix("\n200"), tcp.output)
        XCTAssertTrue(tcp.output.contains("custody_fuse_requests_total"))
        XCTAssertFalse(tcp.output.contains("identity="))
        try check(String(tcp.output.dropLast(4)), "tcp")
        XCTAssertEqual(try runCommand(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/v1/status"]).output, "404")
        XCTAssertEqual(try runCommand(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "http://127.0.0.1:\(port)/metrics"]).output, "404")
    }

    func testTheListenerOutlastsIdleAndSlowClients() throws {
        port = try Self.freePort()
        let daemon = try MountedDaemon(extraArguments: ["--metrics-listen", "127.0.0.1:\(port)"])
        self.daemon = daemon
        // Idle connections (more than are kept at once) and one that sends a byte a second.
        var idle: [Int32] = []
        defer { idle.forEach { close($0) } }
        for _ in 0..<100 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
            let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
            XCTAssertEqual(connected, 0)
            idle.append(fd)
        }
        let slow = try XCTUnwrap(idle.last)
        // While they hold on, a scrape is answered at once.
        let during = try runCommand(["curl", "-s", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/metrics"])
        XCTAssertEqual(during.output, "200", "a scrape among idle connections")
        for byte in "GET /met".utf8 {
            var value = byte
            _ = send(slow, &value, 1, Int32(MSG_NOSIGNAL))
            usleep(1_000_000)
        }
        // Cut off at the deadline (5 s), not answered; the listener still serves.
        var buffer = [UInt8](repeating: 0, count: 16)
        XCTAssertEqual(recv(slow, &buffer, buffer.count, Int32(MSG_DONTWAIT)), 0, "the slow client was closed, not answered")
        let after = try runCommand(["curl", "-s", "--max-time", "3", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/metrics"])
        XCTAssertEqual(after.output, "200")
        XCTAssertTrue(try daemon.api("GET", "/v1/status").status == 200, "the control socket is unaffected")
    }
}
