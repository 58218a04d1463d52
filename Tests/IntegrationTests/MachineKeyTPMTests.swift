@testable import CustodyCore
import Foundation
import Glibc
import XCTest

/// The machine key sealed to a TPM 2.0, through the daemon: software TPMs of the test's own
/// (swtpm, scripts/checks/swtpm-start.sh, reached over the swtpm TCTI; never the host's TPM), stopped by PID.
final class MachineKeyTPMTests: XCTestCase {
    var daemons: [MountedDaemon] = []
    var tpms: [pid_t] = []
    var work = ""
    static let alice = "alice@contoso.com"
    static let text = Array("quarterly numbers, not for other eyes".utf8)

    override func setUpWithError() throws {
        work = try makeTemporaryDirectory("custody-tpm")
    }

    override func tearDown() {
        for daemon in daemons { daemon.destroy() }
        for pid in tpms { stopTPM(pid) }
        _ = try? runCommand(["rm", "-rf", work])
    }

    /// A new software TPM (or the same one again, when `name` was used before); its TCTI.
    func startTPM(_ name: String) throws -> String {
        let output = work + "/" + name + ".out"
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../scripts/checks/swtpm-start.sh").standardized.path
        let pid = try spawn("/bin/bash", [script, work + "/" + name], stdoutPath: output, stderrPath: output + ".err")
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(pid, seconds: 30, status: &status))
        let fields = ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").split(separator: " ")
        guard status == 0, fields.count == 2, let tpm = pid_t(fields[1].trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw HarnessError("swtpm did not start: \((try? String(contentsOfFile: output + ".err", encoding: .utf8)) ?? "")")
        }
        tpms.append(tpm)
        return String(fields[0])
    }

    /// swtpm runs as a daemon (not the test's child): stopped by PID, gone once it is no more
    /// than a zombie for init to reap.
    func stopTPM(_ pid: pid_t) {
        kill(pid, SIGTERM)
        for _ in 0..<250 {
            guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
                  let state = stat.split(separator: ")").last?.split(separator: " ").first, state != "Z" else { return }
            usleep(20_000)
        }
        kill(pid, SIGKILL)
    }

    func tpmTool(_ tcti: String, _ arguments: [String]) throws {
        let result = try runCommand(arguments + ["-T", tcti])
        XCTAssertEqual(result.status, 0, "\(arguments): \(result.error)")
    }

    func daemon(_ arguments: [String], copying source: MountedDaemon? = nil) throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: arguments + ["--default-identity", "0=\(Self.alice)"]) { state in
            guard let source else { return }
            let root = URL(fileURLWithPath: state).deletingLastPathComponent().path
            try mustRun(["cp", "-a", source.state + "/.", state])
            try mustRun(["cp", "-a", "--preserve=all", source.backing + "/.", root + "/backing"])
        }
        daemons.append(daemon)
        return daemon
    }

    /// Alice enrolled with a passphrase and a recovery key, and a file of hers in the mount.
    func aliceWithAFile(_ daemon: MountedDaemon) throws -> String {
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "\#(Self.alice)", "passphrase": "alice pass"}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        let recovery = try daemon.api("POST", "/v1/accounts/alice-id/recovery-key", "{}")
        XCTAssertEqual(recovery.status, 201, recovery.body)
        let key = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(recovery.body.utf8)) as? [String: Any])["recoveryKey"] as? String
        try writeFile(daemon.mnt("numbers.txt"), Self.text)
        XCTAssertNil(try readFile(daemon.back("numbers.txt")).firstRange(of: Self.text), "encrypted on the backing store")
        return try XCTUnwrap(key)
    }

    func machineKey(_ daemon: MountedDaemon) throws -> [String: Any] {
        let answer = try daemon.api("GET", "/v1/machine-key")
        XCTAssertEqual(answer.status, 200, answer.body)
        return try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
    }

    func storeFiles(_ daemon: MountedDaemon) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: daemon.state + "/machine-keys").sorted()
    }

    func testSealedAcrossRestartsAndUselessOnAnotherTPM() throws {
        let tcti = try startTPM("tpm-a")
        let first = try daemon(["--tpm2-tcti", tcti, "--machine-key", "tpm2"])
        let recoveryKey = try aliceWithAFile(first)
        var status = try machineKey(first)
        XCTAssertEqual(status["store"] as? String, "tpm2")
        XCTAssertNil(status["warning"])
        let files = try storeFiles(first)
        XCTAssertEqual(files.count, 1)
        XCTAssertTrue(files.allSatisfy { $0.hasSuffix(".json") }, "the key is not in a file in the clear: \(files)")
        XCTAssertFalse(FileManager.default.fileExists(atPath: first.state + "/machine.key"))

        // The same machine after a restart: the passphrase unlocks, the file reads back.
        first.stop()
        try first.start(extraArguments: ["--tpm2-tcti", tcti, "--default-identity", "0=\(Self.alice)"])
        XCTAssertEqual(first.refusalUnderStoredName(), EACCES, "locked until the passphrase is given (its name too)")
        XCTAssertEqual(try first.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#).status, 200)
        XCTAssertEqual(try readFile(first.mnt("numbers.txt")), Self.text)
        first.stop()

        // The state directory and the backing store copied to a machine with another TPM.
        let other = try startTPM("tpm-b")
        let copy = try daemon(["--tpm2-tcti", other], copying: first)
        status = try machineKey(copy)
        let problem = try XCTUnwrap(status["problem"] as? String)
        XCTAssertTrue(problem.contains("another TPM") && problem.contains("sealed"), problem)
        // The state directory is sealed too: the copy names no identity, to the daemon as to a thief.
        XCTAssertEqual(status["stranded"] as? [String], [])
        let refused = try copy.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#)
        XCTAssertEqual(refused.status, 409, "the right passphrase opens nothing here: \(refused.body)")
        XCTAssertTrue(refused.body.contains("316") && refused.body.contains("another TPM"), refused.body)
        XCTAssertEqual(copy.refusalUnderStoredName(), EACCES)
        XCTAssertTrue(copy.log.contains("the accounts are unknown until an identity is recovered"), copy.log)
        let statusText = try copy.ctl(["status"])
        XCTAssertFalse(statusText.output.contains(Self.alice), statusText.output)

        // Its administrator can still bring alice over with her recovery key.
        XCTAssertEqual(try copy.api("POST", "/v1/machine-key/reset").status, 200)
        let recovered = try copy.api("POST", "/v1/accounts/alice-id/recover", #"{"recoveryKey": "\#(recoveryKey)", "newPassphrase": "alice pass"}"#)
        XCTAssertEqual(recovered.status, 200, recovered.body)
        XCTAssertEqual(try readFile(copy.mnt("numbers.txt")), Self.text)
        XCTAssertEqual(try storeFiles(copy).count, 1, "the other machine's key is gone once nothing names it")
    }

    func testAClearedTPMSaysSoAndTheRecoveryKeyRestoresTheIdentity() throws {
        let tcti = try startTPM("tpm-a")
        let daemon = try self.daemon(["--tpm2-tcti", tcti])
        XCTAssertEqual(try machineKey(daemon)["store"] as? String, "tpm2", "auto seals to the TPM when one answers")
        let recoveryKey = try aliceWithAFile(daemon)
        daemon.stop()
        try tpmTool(tcti, ["tpm2_clear"])
        try daemon.start(extraArguments: ["--tpm2-tcti", tcti, "--default-identity", "0=\(Self.alice)"])
        let refused = try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#)
        XCTAssertEqual(refused.status, 409, refused.body)
        XCTAssertTrue(refused.body.contains("cleared"), refused.body)
        XCTAssertEqual(daemon.refusalUnderStoredName(), EACCES)

        // The recovery path with custodyctl: a new machine key, then the recovery key and a new passphrase.
        try String(recoveryKey + "\n").write(toFile: work + "/recovery", atomically: true, encoding: .utf8)
        try "new pass\n".write(toFile: work + "/passphrase", atomically: true, encoding: .utf8)
        let early = try daemon.ctl(["recover", Self.alice, "--recovery-key-file", work + "/recovery", "--new-passphrase-file", work + "/passphrase"])
        XCTAssertEqual(early.status, 1, "no machine key to rebuild on yet: \(early.output)")
        XCTAssertTrue(early.error.contains("MachineKeyUnavailable"), early.error)
        let reset = try daemon.ctl(["machine-key", "reset"])
        XCTAssertEqual(reset.status, 0, reset.error)
        XCTAssertTrue(reset.output.contains("custodyctl recover"), reset.output)
        let recovered = try daemon.ctl(["recover", Self.alice, "--recovery-key-file", work + "/recovery", "--new-passphrase-file", work + "/passphrase"])
        XCTAssertEqual(recovered.status, 0, recovered.error)
        XCTAssertEqual(try readFile(daemon.mnt("numbers.txt")), Self.text)
        // The new key is sealed to the cleared TPM's new seed: a restart opens it with the new passphrase.
        daemon.stop()
        try daemon.start(extraArguments: ["--tpm2-tcti", tcti, "--default-identity", "0=\(Self.alice)"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "new pass"}"#).status, 200)
        XCTAssertEqual(try readFile(daemon.mnt("numbers.txt")), Self.text)
    }

    func testAChangedPCR7RefusesToUnsealAndSaysWhy() throws {
        let tcti = try startTPM("tpm-a")
        let daemon = try self.daemon(["--tpm2-tcti", tcti, "--tpm2-pcr", "7"])
        XCTAssertEqual(try machineKey(daemon)["pcrs"] as? [Int], [7])
        _ = try aliceWithAFile(daemon)
        daemon.stop()
        try tpmTool(tcti, ["tpm2_pcrextend", "7:sha256=" + String(repeating: "5a", count: 32)])
        try daemon.start(extraArguments: ["--tpm2-tcti", tcti, "--default-identity", "0=\(Self.alice)"])
        let problem = try XCTUnwrap(try machineKey(daemon)["problem"] as? String)
        XCTAssertTrue(problem.contains("PCR 7") && problem.contains("Secure Boot"), problem)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#).status, 409)
    }

    /// `machine-key migrate` killed at any point: the next start finishes it, and every identity
    /// (with and without a passphrase) opens with what it had.
    func testAMigrationKilledAtAnyPointLosesNoIdentity() throws {
        let tcti = try startTPM("tpm-a")
        let arguments = ["--tpm2-tcti", tcti, "--multi-identity"]
        let daemon = try self.daemon(arguments + ["--machine-key", "file"])
        XCTAssertEqual(try machineKey(daemon)["store"] as? String, "file")
        _ = try aliceWithAFile(daemon)
        let others = (1...40).map { "user\($0)@contoso.com" }
        for (index, upn) in others.enumerated() {
            XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "user-\#(index)", "upn": "\#(upn)"}"#).status, 201)
        }
        var midway = 0
        for (round, store) in ["tpm2", "file", "tpm2"].enumerated() {
            let body = #"{"to": "\#(store)"}"#
            let curl = try spawn("/usr/bin/curl", ["-s", "--unix-socket", daemon.socket, "-X", "POST", "-H", "Content-Type: application/json",
                                                   "--data-binary", body, "http://localhost/v1/machine-key/migrate"])
            usleep(UInt32(5_000 + round * 15_000))
            daemon.killHard()
            waitForExit(curl, seconds: 10)
            // Killed midway: two machine keys (keybags on either), until the next start finishes.
            let keys = try FileManager.default.contentsOfDirectory(atPath: daemon.state + "/machine-keys").filter { !$0.contains(".tmp-") }
            if keys.count > 1 { midway += 1 }
            try daemon.start(extraArguments: arguments + ["--default-identity", "0=\(Self.alice)"])
            let status = try machineKey(daemon)
            XCTAssertEqual((status["keys"] as? [Any])?.count, 1, "round \(round): the move is finished at start: \(status)")
            XCTAssertNil(status["problem"])
            let accounts = try daemon.api("GET", "/v1/status").body
            for upn in others {
                XCTAssertTrue(accounts.contains(#""upn":"\#(upn)""#) || accounts.contains(#""upn" : "\#(upn)""#), upn)
            }
            XCTAssertFalse(accounts.contains("unavailable"), accounts)
            XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#).status, 200, "round \(round)")
            XCTAssertEqual(try readFile(daemon.mnt("numbers.txt")), Self.text)
            XCTAssertEqual(try daemon.api("POST", "/v1/accounts/user-7/lock").status, 200, "round \(round): user-7 is enrolled and has its keys")
        }
        print("migrations killed while two machine keys were there: \(midway) of 3")
    }
}

extension MachineKeyTPMTests {
    func dictionaryAttackFailures(_ daemon: MountedDaemon) throws -> Int? {
        (try machineKey(daemon)["dictionaryAttack"] as? [String: Any])?["failures"] as? Int
    }

    /// An identity's keybag, opened as the daemon opens it (sealed under the state key).
    func keybag(_ daemon: MountedDaemon, _ name: String, tcti: String) throws -> StoredKeybag {
        try XCTUnwrap(try StateReader(daemon.state, tcti: tcti).keybag(of: name))
    }

    /// Wrong passphrases and login passwords also count in the TPM (swtpm locks out after 3), and
    /// while it is locked out even the right passphrase waits.
    func testWrongPassphrasesCountAgainstTheTPMsLockout() throws {
        let tcti = try startTPM("tpm-a")
        let daemon = try self.daemon(["--tpm2-tcti", tcti, "--multi-identity", "--lock-grace-period", "0"])
        _ = try aliceWithAFile(daemon)
        XCTAssertNotNil(try keybag(daemon, "alice-id", tcti: tcti).passphraseGate, "the passphrase has a gate in the TPM")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-id", "upn": "bob@contoso.com", "user": "root"}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/bob-id/login-protector", #"{"password": "root's login"}"#).status, 200)
        XCTAssertNotNil(try keybag(daemon, "bob-id", tcti: tcti).loginProtector?.gate, "the login password has one too")
        XCTAssertEqual(try dictionaryAttackFailures(daemon), 0)

        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/bob-id/lock").status, 200)
        XCTAssertEqual(try daemon.api("POST", "/v1/lock").status, 200)
        let login = try daemon.api("POST", "/v1/login/unlock", #"{"user": "root", "password": "a wrong login"}"#)
        XCTAssertTrue(login.body.contains("stillLocked") && login.body.contains("bob@contoso.com"), login.body)
        XCTAssertEqual(try dictionaryAttackFailures(daemon), 1, "a wrong login password, counted by the TPM")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "wrong 1"}"#).status, 403)
        XCTAssertEqual(try dictionaryAttackFailures(daemon), 2)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "wrong 2"}"#).status, 403)
        XCTAssertEqual(try dictionaryAttackFailures(daemon), 3)
        // The engine's own back-off (3 in a row) has not started for alice: the refusal is the TPM's.
        let refused = try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#)
        XCTAssertEqual(refused.status, 429, refused.body)
        XCTAssertTrue(refused.body.contains("dictionary-attack lockout"), refused.body)
        XCTAssertEqual(errnoOf { _ = try readFile(daemon.mnt("numbers.txt")) }, EACCES)
        let text = try daemon.ctl(["machine-key"]).output
        XCTAssertTrue(text.contains("dictionary-attack counter: 3 of 3"), text)
    }

    /// A passphrase set before the key moved to the TPM gets its gate at the next right unlock.
    func testAGateIsMadeAtTheFirstUnlockAfterMovingToTheTPM() throws {
        let tcti = try startTPM("tpm-a")
        let daemon = try self.daemon(["--tpm2-tcti", tcti, "--machine-key", "file"])
        _ = try aliceWithAFile(daemon)
        XCTAssertNil(try keybag(daemon, "alice-id", tcti: tcti).passphraseGate, "no gate while the key is a file")
        XCTAssertEqual(try daemon.ctl(["machine-key", "migrate", "--to", "tpm2"]).status, 0)
        XCTAssertNil(try keybag(daemon, "alice-id", tcti: tcti).passphraseGate, "a migration knows no passphrase")
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/lock").status, 200)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "alice pass"}"#).status, 200)
        XCTAssertNotNil(try keybag(daemon, "alice-id", tcti: tcti).passphraseGate)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "wrong"}"#).status, 403)
        XCTAssertEqual(try dictionaryAttackFailures(daemon), 1)
    }
}
