@testable import CustodyCore
import CustodyCrypto
import Foundation
import Glibc
import Synchronization
import XCTest
import CustodyTestSupport

/// The state directory names no identity (`StateSeal`): every file that would is sealed under the
/// state key, keybags are named by a keyed hash, and without a machine key the state is sealed to
/// the daemon as it is to a thief, until a recovery key opens it.
final class StateSealTests: EngineTestCase {
    /// (Long enough that a sealed file's base64 cannot hold one by chance.)
    let identities = ["alice@", "alice-oid", "contoso", "bob@", "bob-oid", "fabrikam", "carol@", "carol-oid"]

    func engine(_ sealer: MachineKeySealer? = nil, processes: ProcessTable = FakeProcessTable()) throws -> Engine {
        var settings = testSettings()
        settings.multiIdentity = true
        return try Engine(stateDirectory: directory, settings: settings, clock: ManualClock(), processes: processes, machineKeySealer: sealer)
    }

    /// Every file name and body of the state directory, lowercased.
    func everything() throws -> [(name: String, body: String)] {
        var found: [(String, String)] = []
        let walker = FileManager.default.enumerator(atPath: directory)
        while let name = walker?.nextObject() as? String {
            var isDirectory: ObjCBool = false
            _ = FileManager.default.fileExists(atPath: directory + "/" + name, isDirectory: &isDirectory)
            let body = isDirectory.boolValue ? "" : String(decoding: (try? Data(contentsOf: URL(fileURLWithPath: directory + "/" + name))) ?? Data(), as: UTF8.self)
            found.append((name.lowercased(), body.lowercased()))
        }
        return found
    }

    func plainHash(_ identity: String) -> String {
        String(StateSeal.legacyName(of: identity, in: "keybags").dropFirst("keybags/".count).dropLast(".json".count))
    }

    func testNoStateFileNamesAnIdentity() throws {
        let processes = FakeProcessTable()
        processes.add(700, start: 7)
        let engine = try engine(processes: processes)
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.enroll(id: "carol-oid", upn: "carol@fabrikam.com")
        try engine.register(id: "bob-oid", upn: "bob@contoso.com")
        try engine.bindProcess(700, to: "carol@fabrikam.com")
        XCTAssertThrowsError(try engine.unlock("alice-oid", passphrase: try passphrase("wrong")))
        try engine.unlock("alice-oid", passphrase: try passphrase("pw"))
        _ = try engine.createRecoveryKey("alice-oid")
        try engine.writeStateFile(["carol@fabrikam.com"], to: "holders.json")

        let files = try everything()
        XCTAssertTrue(files.contains { $0.name == "accounts.json" } && files.contains { $0.name == "bindings.json" }
                      && files.contains { $0.name == "attempts.json" } && files.contains { $0.name == "holders.json" }, "\(files.map(\.name))")
        XCTAssertEqual(files.filter { $0.name.hasPrefix("keybags/") }.count, 2)
        for identity in identities {
            for file in files {
                XCTAssertFalse(file.name.contains(identity), "\(file.name) names \(identity)")
                XCTAssertFalse(file.body.contains(identity), "\(file.name) holds \(identity)")
            }
        }
        for id in ["alice-oid", "carol-oid"] {
            XCTAssertFalse(files.contains { $0.name.contains(plainHash(id)) }, "a keybag named by a plain hash of \(id) can be tested against a guess")
        }
        // Everything reads back after a restart.
        let again = try self.engine(processes: processes)
        XCTAssertEqual(Set(again.accounts().map(\.upn)), ["alice@contoso.com", "carol@fabrikam.com", "bob@contoso.com"])
        XCTAssertEqual(again.resolve(thread: 700, uid: 0).identity, "carol@fabrikam.com")
        XCTAssertEqual(again.unlockAttempts("alice-oid").failures, 0)
        XCTAssertEqual(try again.readStateFile([String].self, from: "holders.json"), ["carol@fabrikam.com"])
        // A sealed file moved to another name does not open there.
        try FileManager.default.removeItem(atPath: directory + "/bindings.json")
        try FileManager.default.copyItem(atPath: directory + "/attempts.json", toPath: directory + "/bindings.json")
        let swapped = try self.engine(processes: processes)
        XCTAssertEqual(swapped.stateProblems.first { $0.file == "bindings.json" }?.kind, .setAside, "\(swapped.stateProblems)")
    }

    func testWithoutItsMachineKeyTheStateOpensOnlyWithARecoveryKey() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(tpm)
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.enroll(id: "carol-oid", upn: "carol@fabrikam.com")
        let blob = try engine.protectData(Array("alice's".utf8), for: "alice-oid")
        let (key, _) = try engine.createRecoveryKey("alice-oid")
        tpm.clear()

        engine = try self.engine(tpm)
        XCTAssertTrue(engine.accounts().isEmpty, "no account is known without the machine key")
        XCTAssertEqual(engine.stateProblems.map(\.kind), [.sealed])
        for refused in [{ _ = try engine.account("alice@contoso.com") }, { _ = try engine.unprotectData(blob) },
                        { _ = try engine.enroll(id: "dave-oid", upn: "dave@contoso.com") }, { _ = try engine.register(id: "x", upn: "x@y") }] {
            XCTAssertThrowsError(try refused()) { XCTAssertEqual(($0 as? EngineError)?.code, 316, "\($0)") }
        }
        let sealedFiles = try everything()
        // A wrong recovery key opens nothing; the right one opens the state, and the accounts are back.
        XCTAssertThrowsError(try engine.recover("alice@contoso.com", with: try RecoveryKey.generate(), newPassphrase: try passphrase("new"))) {
            XCTAssertEqual(($0 as? EngineError)?.code, 303, "\($0)")
        }
        XCTAssertTrue(engine.accounts().isEmpty)
        try engine.resetMachineKey()
        XCTAssertEqual(try everything().filter { $0.name != "state-key.json" && !$0.name.hasPrefix("machine-key") }.map(\.body),
                       sealedFiles.filter { $0.name != "state-key.json" && !$0.name.hasPrefix("machine-key") }.map(\.body),
                       "nothing sealed is written while the state is sealed")
        try engine.recover("alice@contoso.com", with: key, newPassphrase: try passphrase("new"))
        XCTAssertEqual(Set(engine.accounts().map(\.upn)), ["alice@contoso.com", "carol@fabrikam.com"])
        XCTAssertEqual(try engine.unprotectData(blob), Array("alice's".utf8))
        XCTAssertEqual(engine.machineKeyStatus().stranded, ["carol@fabrikam.com"], "carol has no recovery key")
        XCTAssertFalse(engine.stateProblems.contains { $0.kind == .sealed })

        // The new machine key opens the state at the next start.
        engine = try self.engine(tpm)
        XCTAssertEqual(engine.accounts().count, 2)
        try engine.unlock("alice-oid", passphrase: try passphrase("new"))
        // A wipe takes the recovery key's wrap of the state key with the keybag.
        try engine.deregister("alice-oid", wipe: true)
        XCTAssertFalse(engine.files.seal?.hasRecoveryWrap(of: "alice-oid") ?? true)
    }

    /// A wipe journaled before the state was sealed (the daemon stopped midway, then the TPM was
    /// cleared) finishes as soon as a recovery key opens the state, not at the next start.
    func testAWipeJournaledBeforeTheStateWasSealedFinishesWhenItOpens() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(tpm)
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com")
        try engine.enroll(id: "carol-oid", upn: "carol@fabrikam.com")
        let (key, _) = try engine.createRecoveryKey("alice-oid")
        let carol = try engine.account("carol-oid")
        try engine.files.write(carol, to: engine.files.wipeJournalName(carol.id))
        tpm.clear()

        engine = try self.engine(tpm)
        XCTAssertTrue(engine.pendingWipes.isEmpty, "a sealed journal is not known")
        func journals() -> [String] { ((try? FileManager.default.contentsOfDirectory(atPath: directory + "/wipes")) ?? []).filter { $0.hasSuffix(".json") } }
        XCTAssertEqual(journals().count, 1, "the journal stays while sealed")
        let finished = Mutex<[String]>([])
        let subscription = engine.events.subscribe { event in
            if event.kind == .wipeFinished { finished.withLock { $0.append(event.identity ?? "") } }
        }
        defer { engine.events.unsubscribe(subscription) }
        try engine.resetMachineKey()
        try engine.recover("alice@contoso.com", with: key, newPassphrase: nil)
        XCTAssertEqual(finished.withLock { $0 }, ["carol@fabrikam.com"])
        XCTAssertTrue(engine.pendingWipes.isEmpty)
        XCTAssertEqual(journals(), [], "the journal went")
        XCTAssertFalse(FileManager.default.fileExists(atPath: engine.files.path(engine.files.keybagName(carol.id))), "the keybag went")
        XCTAssertEqual(engine.accounts().map(\.upn), ["alice@contoso.com"])
    }

    func testAStateWithNoRecoveryKeyStaysSealedAndSaysWhy() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(tpm)
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com")
        tpm.clear()
        engine = try self.engine(tpm)
        XCTAssertThrowsError(try engine.recover("alice@contoso.com", with: try RecoveryKey.generate(), newPassphrase: nil)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 316)
            XCTAssertTrue("\($0)".contains("no recovery key"), "\($0)")
        }
    }

    /// A recovery key made before the state key recovers its identity but not sealed state: the
    /// status says so until it is made again, or used once (then it opens the state too).
    func testARecoveryKeyFromBeforeTheStateKeyIsReportedAndHealedByUse() throws {
        var engine = try self.engine()
        try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", passphrase: try passphrase("pw"))
        try engine.unlock("alice-oid", passphrase: try passphrase("pw"))
        let (key, _) = try engine.createRecoveryKey("alice-oid")
        try writeAsBeforeTheStateKey(engine, directory: directory)
        engine = try self.engine()
        let outdated = try XCTUnwrap(engine.stateProblems.first { $0.kind == .recoveryKeyOutdated })
        XCTAssertEqual(outdated.identity, "alice-oid")
        try engine.recover("alice-oid", with: key, newPassphrase: nil)
        XCTAssertTrue(engine.files.seal?.hasRecoveryWrap(of: "alice-oid") == true)
        XCTAssertFalse(engine.stateProblems.contains { $0.kind == .recoveryKeyOutdated })
        XCTAssertFalse(try self.engine().stateProblems.contains { $0.kind == .recoveryKeyOutdated })
    }
}
