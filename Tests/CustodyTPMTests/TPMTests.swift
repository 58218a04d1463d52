import CustodyCrypto
import CustodyTPM
import Foundation
import XCTest

/// A software TPM of the test's own (scripts/checks/swtpm-start.sh), stopped by PID.
final class SoftwareTPM {
    let directory: String
    private(set) var tcti = ""
    private(set) var pid: pid_t = 0

    init(directory: String) throws {
        self.directory = directory
        try start()
    }

    func start() throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../scripts/checks/swtpm-start.sh").standardized.path
        let output = directory + ".out"
        let (status, text) = try run(["/bin/bash", script, directory], stdout: output)
        let fields = text.split(separator: " ")
        guard status == 0, fields.count == 2, let pid = pid_t(fields[1].trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw NSError(domain: "swtpm", code: 1, userInfo: [NSLocalizedDescriptionKey: "swtpm did not start: \(text)"])
        }
        tcti = String(fields[0])
        self.pid = pid
    }

    /// swtpm runs as a daemon (not the test's child): gone once it is no more than a zombie for
    /// init to reap.
    func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        for _ in 0..<250 {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let state = stat.split(separator: ")").last?.split(separator: " ").first, state != "Z" else { pid = 0; return }
            usleep(20_000)
        }
        kill(pid, SIGKILL)
        pid = 0
    }

    /// Runs a tpm2-tools command against this TPM.
    func tool(_ arguments: [String]) throws {
        let (status, _) = try run(["/usr/bin/env"] + arguments + ["-T", tcti], stdout: "/dev/null")
        XCTAssertEqual(status, 0, "\(arguments)")
    }
}

/// Runs a program to its end (posix_spawn and waitpid: the test's own child, reaped by it) with
/// its output in `stdout`; returns its exit status and that output.
func run(_ arguments: [String], stdout: String) throws -> (Int32, String) {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
    var pid: pid_t = 0
    let argv = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    guard posix_spawn(&pid, arguments[0], &actions, nil, argv, environ) == 0 else {
        throw NSError(domain: "spawn", code: 1, userInfo: [NSLocalizedDescriptionKey: "cannot run \(arguments[0])"])
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let text = stdout == "/dev/null" ? "" : ((try? String(contentsOfFile: stdout, encoding: .utf8)) ?? "")
    return ((status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f), text)
}

final class TPMTests: XCTestCase {
    var work = ""
    var tpms: [SoftwareTPM] = []

    override func setUpWithError() throws {
        work = FileManager.default.temporaryDirectory.appendingPathComponent("custody-tpm-\(getpid())-\(UInt32.random(in: 0...UInt32.max))").path
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    }

    override func tearDown() {
        for tpm in tpms { tpm.stop() }
        try? FileManager.default.removeItem(atPath: work)
    }

    func softwareTPM(_ name: String) throws -> SoftwareTPM {
        let tpm = try SoftwareTPM(directory: work + "/" + name)
        tpms.append(tpm)
        return tpm
    }

    func secret(_ byte: UInt8, count: Int = 32) throws -> SecretBytes {
        try [UInt8](repeating: byte, count: count).withUnsafeBytes { try SecretBytes(copying: $0) }
    }

    func bytes(_ secret: SecretBytes) -> [UInt8] { secret.withUnsafeBytes { Array($0) } }

    func testSealUnsealAcrossRestarts() throws {
        let soft = try softwareTPM("one")
        let tpm = TPM(tcti: soft.tcti)
        let key = try SecretBytes.random(count: 32)
        let sealed = try tpm.seal(key)
        XCTAssertFalse(sealed.privateArea.isEmpty)
        XCTAssertFalse(sealed.hasAuthorization)
        // The blob holds no plaintext copy of the key.
        XCTAssertNil(sealed.privateArea.range(of: Data(bytes(key))))
        XCTAssertEqual(bytes(try tpm.unseal(sealed)), bytes(key))
        // The same TPM after a restart (its state kept) still unseals.
        soft.stop()
        try soft.start()
        XCTAssertEqual(bytes(try TPM(tcti: soft.tcti).unseal(sealed)), bytes(key))
        // 128 bytes is the most a sealed object holds.
        XCTAssertThrowsError(try TPM(tcti: soft.tcti).seal(try secret(1, count: 129))) { XCTAssertEqual(($0 as? TPMError)?.kind, .invalid) }
    }

    func testAnotherTPMOrAClearedOneCannotUnseal() throws {
        let one = try softwareTPM("one"), two = try softwareTPM("two")
        let sealed = try TPM(tcti: one.tcti).seal(try secret(7))
        XCTAssertThrowsError(try TPM(tcti: two.tcti).unseal(sealed)) { XCTAssertEqual(($0 as? TPMError)?.kind, .foreign) }
        try one.tool(["tpm2_clear"])
        XCTAssertThrowsError(try TPM(tcti: one.tcti).unseal(sealed)) { XCTAssertEqual(($0 as? TPMError)?.kind, .foreign) }
    }

    func testPCR7Binding() throws {
        let soft = try softwareTPM("one")
        let tpm = TPM(tcti: soft.tcti)
        let sealed = try tpm.seal(try secret(9), pcrs: [7])
        XCTAssertEqual(sealed.pcrs, [7])
        XCTAssertEqual(bytes(try tpm.unseal(sealed)), [UInt8](repeating: 9, count: 32))
        try soft.tool(["tpm2_pcrextend", "7:sha256=" + String(repeating: "ab", count: 32)])
        XCTAssertThrowsError(try tpm.unseal(sealed)) { XCTAssertEqual(($0 as? TPMError)?.kind, .policy) }
    }

    func testAuthorizationFailuresCountAndLockOut() throws {
        let soft = try softwareTPM("one")
        let tpm = TPM(tcti: soft.tcti)
        let sealed = try tpm.seal(try secret(3), authorization: try secret(0x41, count: 32))
        XCTAssertTrue(sealed.hasAuthorization)
        XCTAssertEqual(bytes(try tpm.unseal(sealed, authorization: try secret(0x41, count: 32))), [UInt8](repeating: 3, count: 32))
        let before = try tpm.lockoutState()
        XCTAssertEqual(before.failures, 0)
        XCTAssertGreaterThan(before.maxTries, 0)
        for attempt in 1...Int(before.maxTries) {
            XCTAssertThrowsError(try tpm.unseal(sealed, authorization: try secret(0x42, count: 32))) {
                XCTAssertEqual(($0 as? TPMError)?.kind, .badAuthorization, "attempt \(attempt)")
            }
        }
        XCTAssertEqual(try tpm.lockoutState().failures, before.maxTries)
        // Locked out: even the right value is refused now.
        XCTAssertThrowsError(try tpm.unseal(sealed, authorization: try secret(0x41, count: 32))) { XCTAssertEqual(($0 as? TPMError)?.kind, .lockout) }
    }

    func testNoTPMIsUnreachable() throws {
        XCTAssertFalse(TPM.isPresent(tcti: "device:/nonexistent/tpmrm0"))
        XCTAssertThrowsError(try TPM(tcti: "swtpm:host=127.0.0.1,port=1").lockoutState()) { XCTAssertEqual(($0 as? TPMError)?.kind, .unreachable) }
    }
}
