import Foundation
import Glibc
import XCTest

/// Identities stay out of every channel an administrator may share (the daemon's log, its journal
/// entries, the metrics, support bundles) by default, and show only when the administrator turns
/// scrubbing off; every message about scrubbing says which of the two holds.
final class PrivacyTests: XCTestCase {
    var daemon: MountedDaemon?
    var journalFD: Int32 = -1
    var work = ""

    override func tearDown() {
        daemon?.destroy()
        if journalFD >= 0 { close(journalFD) }
        unsetenv("CUSTODY_JOURNAL_SOCKET")
        _ = try? runCommand(["rm", "-rf", work])
    }

    /// Managed, unmanaged, never registered, refused, and object IDs that are no UPNs.
    static let identities = ["alice@contoso.com", "alice-oid-7f3c", "bob@contoso.com", "bob-oid-19ae",
                             "carol@unmanaged.example", "mallory@refused.example"]

    struct Channels {
        var log = ""
        var journal = ""
        var metrics = ""
        var bundle = ""
        var diagnoseMessage = ""
    }

    /// A workload that names every identity in the channels' way, then what each channel holds.
    func runWorkload(_ extraArguments: [String]) throws -> Channels {
        work = try makeTemporaryDirectory("custody-privacy")
        journalFD = try JournalEventsTests.bindDatagramSocket(work + "/journal.sock")
        setenv("CUSTODY_JOURNAL_SOCKET", work + "/journal.sock", 1)
        // Read as journald does, all along (the daemon does not wait for a journal that lags).
        let journal = JournalReader(fd: journalFD)
        defer { journal.stop() }
        try "[settings]\nAllowedAccounts = [\"alice@contoso.com\", \"bob@contoso.com\"]\n".write(toFile: work + "/custody.toml", atomically: true, encoding: .utf8)
        let daemon = try MountedDaemon(extraArguments: ["--config", work + "/custody.toml", "--allow-other", "--log-level", "debug",
                                                        "--default-identity", "0=alice@contoso.com",
                                                        "--default-identity", "65534=carol@unmanaged.example"] + extraArguments)
        self.daemon = daemon
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid-7f3c", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid-19ae", "upn": "bob@contoso.com", "enroll": false}"#).status, 201)
        let refused = try daemon.api("POST", "/v1/accounts", #"{"id": "mallory-oid", "upn": "mallory@refused.example"}"#)
        XCTAssertEqual(refused.status, 403, refused.body)
        try writeFile(daemon.mnt("report.txt"), bytes("quarterly numbers\n"))
        XCTAssertEqual(chmod(daemon.mnt("report.txt"), 0o644), 0)
        // Carol (unmanaged, never registered) may not read Alice's file: a blocked transfer.
        let carol = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", daemon.mnt("report.txt")])
        XCTAssertNotEqual(carol.status, 0, "Alice's data does not go to Carol")
        // Bob writes through a bound process; Alice locks and unlocks.
        let bob = try daemon.ctl(["run", "--identity", "bob@contoso.com", "--", "sh", "-c", "echo bob > '\(daemon.mnt("bob.txt"))'"])
        XCTAssertEqual(bob.status, 0, bob.error)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", "{}").status, 200)
        var channels = Channels()
        channels.metrics = try daemon.api("GET", "/v1/metrics").body
        let diagnose = try daemon.ctl(["diagnose", "--out", work + "/bundle.json"])
        XCTAssertEqual(diagnose.status, 0, diagnose.error)
        channels.diagnoseMessage = diagnose.output
        channels.bundle = (try? String(contentsOfFile: work + "/bundle.json", encoding: .utf8)) ?? ""
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/wipe").status, 200)
        usleep(200_000)
        channels.log = daemon.log
        channels.journal = journal.stop().map { $0.map { "\($0.key)=\($0.value)" }.joined(separator: "\n") }.joined(separator: "\n")
        XCTAssertTrue(channels.journal.contains("CUSTODY_EVENT=transferBlocked"), "the workload reached the journal: \(channels.journal.prefix(500))")
        XCTAssertTrue(channels.log.contains("enrollmentFailed") || channels.log.contains("not allowed"), "the refusal is logged")
        return channels
    }

    func testByDefaultNoChannelNamesAnyIdentity() throws {
        let channels = try runWorkload([])
        for (name, text) in [("log", channels.log), ("journal", channels.journal), ("metrics", channels.metrics), ("bundle", channels.bundle)] {
            XCTAssertFalse(text.isEmpty, name)
            for identity in Self.identities {
                XCTAssertFalse(text.lowercased().contains(identity), "\(name) names \(identity): \(excerpt(text, around: identity))")
            }
        }
        XCTAssertTrue(channels.log.contains("[scrubbed:"), "identities are replaced, not dropped")
        XCTAssertTrue(channels.journal.contains("CUSTODY_IDENTITY=[scrubbed:"))
        XCTAssertFalse(channels.metrics.contains("custody_account_lock_state"), "no series per identity")
        XCTAssertTrue(channels.bundle.contains(#""identitiesScrubbed" : true"#), channels.bundle.prefix(400).description)
        XCTAssertTrue(channels.diagnoseMessage.contains("identities and configured values are scrubbed"), channels.diagnoseMessage)
    }

    func testAnAdministratorWhoTurnsItOffSeesIdentitiesAndIsToldSo() throws {
        let channels = try runWorkload(["--log-identities"])
        XCTAssertTrue(channels.log.contains("alice@contoso.com"), "the log names identities when asked to")
        XCTAssertTrue(channels.log.contains("mallory@refused.example"), "refused ones too")
        XCTAssertTrue(channels.journal.contains("CUSTODY_IDENTITY=alice@contoso.com"))
        XCTAssertTrue(channels.metrics.contains(#"custody_account_lock_state{identity="alice@contoso.com""#), channels.metrics)
        XCTAssertTrue(channels.bundle.contains("alice@contoso.com"))
        XCTAssertTrue(channels.bundle.contains(#""identitiesScrubbed" : false"#))
        XCTAssertTrue(channels.diagnoseMessage.contains("identities are NOT (ScrubAccountIdentities = false)"), channels.diagnoseMessage)
        XCTAssertFalse(channels.diagnoseMessage.contains("identities and configured values are scrubbed"))
    }

    func excerpt(_ text: String, around needle: String) -> String {
        let lowered = text.lowercased()
        guard let range = lowered.range(of: needle) else { return "" }
        let start = lowered.index(range.lowerBound, offsetBy: -min(120, lowered.distance(from: lowered.startIndex, to: range.lowerBound)))
        let end = lowered.index(range.upperBound, offsetBy: min(120, lowered.distance(from: range.upperBound, to: lowered.endIndex)))
        return String(lowered[start..<end])
    }
}

/// Receives journal entries on a thread of its own until stopped.
final class JournalReader: @unchecked Sendable {
    private let lock = NSLock()
    private var entries: [[String: String]] = []
    private var stopping = false
    private let done = DispatchSemaphore(value: 0)

    init(fd: Int32) {
        Thread.detachNewThread { [self] in
            while !lock.withLock({ stopping }) {
                let received = JournalEventsTests.receive(fd)
                lock.withLock { entries += received }
            }
            done.signal()
        }
    }

    /// Stops reading (once) and answers everything received.
    @discardableResult
    func stop() -> [[String: String]] {
        let first = lock.withLock { () -> Bool in
            defer { stopping = true }
            return !stopping
        }
        if first { done.wait() }
        return lock.withLock { entries }
    }
}
