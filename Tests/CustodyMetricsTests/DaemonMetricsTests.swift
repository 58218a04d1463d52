import CustodyCore
@testable import CustodyMetrics
import Foundation
import XCTest
import CustodyTestSupport

/// The metrics read off engine events, and the text they render to.
final class DaemonMetricsTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-metrics").path
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
    }

    static func values(_ text: [UInt8]) -> [String: Double] {
        var values: [String: Double] = [:]
        for line in String(decoding: text, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            values[String(line[..<space])] = value
        }
        return values
    }

    func testEventsMoveTheirCountersAndUnknownLabelValuesCollapse() throws {
        let engine = try Engine(stateDirectory: directory)
        let metrics = DaemonMetrics(version: "test")
        _ = metrics.observe(engine)
        let events = engine.events
        events.emit(.lockRequested, identity: "a", "", details: ["cause": "suspend"])
        events.emit(.lockRequested, identity: "a", "", details: ["cause": "made-up\"cause"])
        events.emit(.locked, identity: "a", "")
        events.emit(.unlocked, identity: "a", "", details: ["cause": "login"])
        events.emit(.unlockFailed, identity: "a", "", details: ["protector": "recovery"])
        events.emit(.unlockFailed, identity: "a", "", details: ["tpmLockout": "true"])
        events.emit(.transferBlocked, identity: "a", "", details: ["suppressed": "4"])
        events.emit(.wipeStarted, identity: "a", "")
        var running = Self.values(metrics.render(engine, identities: false))
        XCTAssertEqual(running[#"custody_jobs_running{kind="wipe"}"#], 1)
        events.emit(.wipeProgress, identity: "a", "", details: ["keysDestroyedSeconds": "0.004"])
        events.emit(.wipeProgress, identity: "a", "", details: ["scanned": "10", "deleted": "7", "bytesFreed": "7000"])
        events.emit(.wipeFinished, identity: "a", "")
        events.emit(.reprotectProgress, identity: "b", "", details: ["done": "1", "total": "3"])
        events.emit(.reprotectFinished, identity: "b", "", details: ["done": "2", "total": "3", "left": "1"])

        running = Self.values(metrics.render(engine, identities: false))
        XCTAssertEqual(running[#"custody_lock_requests_total{cause="suspend"}"#], 1)
        XCTAssertEqual(running[#"custody_lock_requests_total{cause="other"}"#], 1, "input never makes new series")
        XCTAssertEqual(running[#"custody_lock_requests_total{cause="manual"}"#], 0, "known series start at 0")
        XCTAssertEqual(running["custody_locks_total"], 1)
        XCTAssertEqual(running[#"custody_unlocks_total{cause="login"}"#], 1)
        XCTAssertEqual(running[#"custody_unlock_failures_total{protector="recovery",reason="wrong"}"#], 1)
        XCTAssertEqual(running[#"custody_unlock_failures_total{protector="any",reason="tpmLockout"}"#], 1)
        XCTAssertEqual(running["custody_transfers_blocked_total"], 5, "the refusals left out of the stream count too")
        XCTAssertEqual(running[#"custody_jobs_total{kind="wipe",result="done"}"#], 1)
        XCTAssertEqual(running[#"custody_job_files_total{kind="wipe"}"#], 7)
        XCTAssertEqual(running["custody_wipe_bytes_freed_total"], 7000)
        XCTAssertEqual(running[#"custody_wipe_keys_destroyed_seconds_bucket{le="0.01"}"#], 1)
        XCTAssertEqual(running[#"custody_jobs_running{kind="wipe"}"#], 0)
        XCTAssertEqual(running[#"custody_jobs_total{kind="reprotect",result="failed"}"#], 1, "files left behind: not done")
        XCTAssertEqual(running[#"custody_job_files_total{kind="reprotect"}"#], 2)
        XCTAssertEqual(running[#"custody_jobs_running{kind="reprotect"}"#], 0)
        XCTAssertEqual(running["custody_events_total"], 13)
        XCTAssertEqual(running[#"custody_build_info{version="test"}"#], 1)
        XCTAssertGreaterThan(running["process_resident_memory_bytes"] ?? 0, 1_048_576)
    }

    func testAccountsByStateAndIdentitySeriesOnlyWhenAsked() throws {
        let engine = try Engine(stateDirectory: directory)
        _ = try engine.register(id: "alice-id", upn: "alice@contoso.com")
        let metrics = DaemonMetrics(version: "test")
        let anonymous = Self.values(metrics.render(engine, identities: false))
        XCTAssertEqual(anonymous[#"custody_accounts{state="registered"}"#], 1)
        XCTAssertFalse(String(decoding: metrics.render(engine, identities: false), as: UTF8.self).contains("alice"))
        let named = Self.values(metrics.render(engine, identities: true))
        XCTAssertEqual(named[#"custody_account_lock_state{identity="alice@contoso.com",state="registered"}"#], 1)
    }

    func testRequestsErrorsAndBytes() {
        let metrics = DaemonMetrics(version: "test")
        let engineless = try? Engine(stateDirectory: directory)
        metrics.mounts.served(.create, nanoseconds: 40_000, errno: 0)
        metrics.mounts.served(.create, nanoseconds: 2_000_000, errno: 13)
        metrics.mounts.served(.copyFileRange, nanoseconds: 1, errno: 0)
        metrics.mounts.created(.encrypted)
        metrics.mounts.tampered(.header)
        metrics.mounts.bytesEncrypted.increment(by: Int64(4096))
        guard let engineless else { return XCTFail("no engine") }
        let values = Self.values(metrics.render(engineless, identities: false))
        XCTAssertEqual(values[#"custody_fuse_requests_total{op="create"}"#], 2)
        XCTAssertEqual(values[#"custody_fuse_requests_total{op="copy_file_range"}"#], 1)
        XCTAssertEqual(values[#"custody_fuse_errors_total{op="create",errno="EACCES"}"#], 1)
        XCTAssertEqual(values[#"custody_fuse_request_duration_seconds_bucket{op="create",le="0.00005"}"#], 1)
        XCTAssertEqual(values[#"custody_fuse_request_duration_seconds_bucket{op="create",le="0.0025"}"#], 2)
        XCTAssertEqual(values[#"custody_files_created_total{owner="encrypted"}"#], 1)
        XCTAssertEqual(values[#"custody_tamper_detections_total{kind="header"}"#], 1)
        XCTAssertEqual(values["custody_encrypted_bytes_total"], 4096)
    }
}
