@testable import CustodyCore
import CustodyCrypto
import Foundation
import Synchronization
import XCTest
import CustodyTestSupport

/// A sealer standing in for a TPM: it keeps what it sealed in memory. `clear()` forgets it all
/// (as TPM2_Clear changes the storage seed); another instance is another machine's TPM.
final class MemorySealer: MachineKeySealer, @unchecked Sendable {
    private let sealed = Mutex<[Data: [UInt8]]>([:])
    var description: String { "memory TPM" }

    func seal(_ key: SecretBytes, pcrs: [Int]) throws(MachineKeyProblem) -> Data {
        let handle = Data((0..<16).map { _ in UInt8.random(in: 0...255) })
        sealed.withLock { $0[handle] = key.withUnsafeBytes { Array($0) } }
        return handle
    }

    func unseal(_ blob: Data, pcrs: [Int]) throws(MachineKeyProblem) -> SecretBytes {
        guard let bytes = sealed.withLock({ $0[blob] }) else { throw MachineKeyProblem("sealed to another TPM, or this TPM was cleared") }
        do { return try bytes.withUnsafeBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) } } catch { throw MachineKeyProblem("\(error)") }
    }

    func clear() { sealed.withLock { $0.removeAll() } }
}

final class MachineKeyTests: EngineTestCase {
    let alice = "alice@contoso.com", bob = "bob@contoso.com"

    func engine(_ sealer: MachineKeySealer?, mode: MachineKeyMode = .auto) throws -> Engine {
        var settings = testSettings()
        settings.machineKey = mode
        return try Engine(stateDirectory: directory, settings: settings, clock: ManualClock(), processes: FakeProcessTable(), machineKeySealer: sealer)
    }

    func enrollBoth(_ engine: Engine) throws -> (alice: [UInt8], bob: [UInt8]) {
        try engine.enroll(id: "alice-id", upn: alice, passphrase: try passphrase("alice pass"), uid: 1000)
        try engine.enroll(id: "bob-id", upn: bob, policy: Policy(protectionLevel: .none))
        return (try engine.protectData(Array("alice's".utf8), for: alice), try engine.protectData(Array("bob's".utf8), for: bob))
    }

    func storeFiles() throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: directory + "/machine-keys").sorted() }

    func testAutoSealsToATPMWhenThereIsOneAndKeepsAFileOtherwise() throws {
        let tpm = MemorySealer()
        let sealed = try engine(tpm)
        XCTAssertEqual(sealed.machineKeyStatus().store, .tpm2)
        XCTAssertNil(sealed.machineKeyStatus().warning)
        let stores = try storeFiles()
        XCTAssertTrue(stores.allSatisfy { $0.hasSuffix(".json") }, "no key in the clear: \(stores)")
        try FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let plain = try engine(nil)
        XCTAssertEqual(plain.machineKeyStatus().store, .file)
        XCTAssertTrue(plain.machineKeyStatus().warning?.contains("offline") == true)
        XCTAssertThrowsError(try engine(nil, mode: .tpm2)) { XCTAssertEqual(($0 as? EngineError)?.code, 316, "\($0)") }
    }

    func testMigrationToTheTPMAndBackRewrapsEveryKeybag() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(nil)
        let (a, b) = try enrollBoth(engine)
        let fileKey = try XCTUnwrap(engine.machineKeyStatus().id)
        engine = try self.engine(tpm)
        XCTAssertTrue(engine.machineKeyStatus().warning?.contains("migrate --to tpm2") == true)
        let status = try engine.migrateMachineKey(to: .tpm2)
        XCTAssertEqual(status.store, .tpm2)
        XCTAssertNotEqual(status.id, fileKey, "a fresh key")
        XCTAssertEqual(status.keys.count, 1, "the file key is destroyed once no keybag names it")
        XCTAssertFalse(try storeFiles().contains { $0.hasSuffix(".key") })
        // After a restart: the passphrase still unlocks, the files' keys are the same.
        engine = try self.engine(tpm)
        try engine.unlock(alice, passphrase: try passphrase("alice pass"))
        XCTAssertEqual(try engine.unprotectData(a), Array("alice's".utf8))
        XCTAssertEqual(try engine.unprotectData(b), Array("bob's".utf8))
        // The configured store wins at start: "file" moves it back.
        engine = try self.engine(tpm, mode: .file)
        XCTAssertEqual(engine.machineKeyStatus().store, .file)
        XCTAssertEqual(try storeFiles().count, 1)
        tpm.clear()
        engine = try self.engine(tpm, mode: .file)
        try engine.unlock(alice, passphrase: try passphrase("alice pass"))
        XCTAssertEqual(try engine.unprotectData(a), Array("alice's".utf8), "the TPM no longer matters")
    }

    /// A daemon killed midway: the new key and the pointer are written, one keybag of two is moved.
    func testAMigrationStoppedMidwayIsFinishedAtStart() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(tpm, mode: .file)
        let (a, b) = try enrollBoth(engine)
        let old = try XCTUnwrap(engine.machineKeyStatus().id)
        let new = try engine.machineKeys.create(.tpm2, pcrs: [])
        let aliceBag = engine.files.keybagName("alice-id")
        let stored = try XCTUnwrap(try engine.files.read(StoredKeybag.self, from: aliceBag))
        let secret = try Engine.machineSecret(stored, keys: engine.machineKeys, file: aliceBag)
        try engine.files.write(try Keybags.bind(stored, secret: secret, to: new), to: aliceBag)
        XCTAssertEqual(try storeFiles().count, 2)
        // The restart finishes the move (no mode given: the key stays where it now is).
        engine = try self.engine(tpm, mode: .auto)
        XCTAssertEqual(engine.machineKeyStatus().id, new.id)
        XCTAssertEqual(try storeFiles(), [new.id + ".json"], "the old key \(old) is gone once nothing names it")
        for name in ["alice-id", "bob-id"] {
            XCTAssertEqual(try engine.files.read(StoredKeybag.self, from: engine.files.keybagName(name))?.machineKeyID, new.id)
        }
        try engine.unlock(alice, passphrase: try passphrase("alice pass"))
        XCTAssertEqual(try engine.unprotectData(a), Array("alice's".utf8))
        XCTAssertEqual(try engine.unprotectData(b), Array("bob's".utf8))

        // Killed before the pointer moved: the new key is named by nothing and goes.
        _ = try engine.machineKeys.create(.file, pcrs: [])
        try engine.files.write(MachineKeys.Pointer(current: new.id), to: MachineKeys.pointerFile)
        engine = try self.engine(tpm, mode: .auto)
        XCTAssertEqual(try storeFiles(), [new.id + ".json"])
        try engine.unlock(alice, passphrase: try passphrase("alice pass"))
    }

    /// A state directory of the version before machine keys moved: `machine.key`, keybags that name none.
    func testAnOlderStateDirectoryMovesToTheTPM() throws {
        var engine = try self.engine(nil, mode: .file)
        let (a, _) = try enrollBoth(engine)
        // Make it what the older version wrote: the keybags' secret is the machine key itself.
        let secret = try engine.machineSecret(of: try engine.account(alice))
        let bobSecret = try engine.machineSecret(of: try engine.account(bob))
        XCTAssertFalse(secret.constantTimeEquals(bobSecret), "each keybag has a secret of its own")
        try FileManager.default.removeItem(atPath: directory + "/keybags/" + String(engine.files.keybagName("bob-id").dropFirst("keybags/".count)))
        var stored = try XCTUnwrap(try engine.files.read(StoredKeybag.self, from: engine.files.keybagName("alice-id")))
        stored.machineSecret = nil
        stored.machineKeyID = nil
        try engine.files.write(stored, to: engine.files.keybagName("alice-id"))
        try engine.files.writeBytes(secret.withUnsafeBytes { Array($0) }, to: MachineKeys.legacyFile)
        try FileManager.default.removeItem(atPath: directory + "/machine-keys")
        try FileManager.default.removeItem(atPath: directory + "/" + MachineKeys.pointerFile)
        var accounts = try XCTUnwrap(try engine.files.read(Engine.AccountsFile.self, from: "accounts.json"))
        accounts.accounts.removeAll { $0.upn == bob }
        try engine.files.write(accounts, to: "accounts.json")
        // And before the state key: everything in clear, keybags named by a plain hash.
        try writeAsBeforeTheStateKey(engine, directory: directory)
        let legacyName = StateSeal.legacyName(of: "alice-id", in: "keybags")
        XCTAssertTrue(try String(contentsOfFile: directory + "/accounts.json", encoding: .utf8).contains(alice))

        let tpm = MemorySealer()
        engine = try self.engine(tpm, mode: .tpm2)
        XCTAssertEqual(engine.machineKeyStatus().store, .tpm2)
        // Sealed at the start, under a state key the new machine key wraps; renamed by a keyed hash.
        XCTAssertTrue(FileManager.default.fileExists(atPath: directory + "/" + StateSeal.keyFile))
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory + "/" + legacyName))
        XCTAssertNotEqual(engine.files.keybagName("alice-id"), legacyName)
        for name in ["accounts.json", engine.files.keybagName("alice-id")] {
            let text = try String(contentsOfFile: directory + "/" + name, encoding: .utf8)
            XCTAssertTrue(text.contains("sealedState"), name)
            XCTAssertFalse(text.contains("alice"), "\(name): \(text)")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory + "/" + MachineKeys.legacyFile), "the old key file is destroyed")
        try engine.unlock(alice, passphrase: try passphrase("alice pass"))
        XCTAssertEqual(try engine.unprotectData(a), Array("alice's".utf8))
    }

    func testACopyOnAnotherMachineUnlocksNothingAndSaysWhy() throws {
        var engine = try self.engine(MemorySealer())
        let (a, _) = try enrollBoth(engine)
        engine = try self.engine(MemorySealer())
        XCTAssertThrowsError(try engine.unlock(alice, passphrase: try passphrase("alice pass"))) {
            XCTAssertEqual(($0 as? EngineError)?.code, 316)
            XCTAssertTrue("\($0)".contains("another TPM"), "\($0)")
        }
        XCTAssertThrowsError(try engine.unprotectData(a)) { XCTAssertEqual(($0 as? EngineError)?.code, 316, "\($0)") }
        // The state is sealed: the daemon knows no more accounts than a thief with the disk would.
        XCTAssertTrue(engine.accounts().isEmpty)
        XCTAssertEqual(engine.machineKeyStatus().stranded, [])
        XCTAssertTrue(engine.machineKeyStatus().problem?.contains("sealed") == true, "\(engine.machineKeyStatus())")
        XCTAssertEqual(engine.stateProblems.map(\.kind), [.sealed])
        XCTAssertThrowsError(try engine.enroll(id: "carol-id", upn: "carol@contoso.com")) { XCTAssertEqual(($0 as? EngineError)?.code, 316) }
        XCTAssertThrowsError(try engine.migrateMachineKey(to: .file)) { XCTAssertEqual(($0 as? EngineError)?.code, 316) }
    }

    func testAClearedTPMIsRecoveredWithTheRecoveryKey() throws {
        let tpm = MemorySealer()
        var engine = try self.engine(tpm)
        let (a, b) = try enrollBoth(engine)
        let (key, _) = try engine.createRecoveryKey(alice)
        try engine.addLoginProtector(alice, password: try passphrase("login"))
        tpm.clear()
        engine = try self.engine(tpm)
        XCTAssertThrowsError(try engine.lockStatus(alice)) { XCTAssertEqual(($0 as? EngineError)?.code, 316) }
        // Recovery needs a new key first, then a new passphrase.
        XCTAssertThrowsError(try engine.recover(alice, with: key, newPassphrase: try passphrase("new"))) { XCTAssertEqual(($0 as? EngineError)?.code, 316) }
        let old = engine.machineKeyStatus().id
        let status = try engine.resetMachineKey()
        XCTAssertNotEqual(status.id, old)
        XCTAssertThrowsError(try engine.resetMachineKey()) { XCTAssertEqual(($0 as? EngineError)?.code, 317) }
        XCTAssertThrowsError(try engine.recover(alice, with: key, newPassphrase: nil)) { XCTAssertEqual(($0 as? EngineError)?.code, 302, "\($0)") }
        XCTAssertThrowsError(try engine.recover(alice, with: try RecoveryKey.generate(), newPassphrase: try passphrase("new"))) {
            XCTAssertEqual(($0 as? EngineError)?.code, 303)
        }
        try engine.recover(alice, with: key, newPassphrase: try passphrase("new"))
        XCTAssertEqual(try engine.lockStatus(alice), .unlocked)
        XCTAssertEqual(try engine.unprotectData(a), Array("alice's".utf8), "the same class keys")
        XCTAssertEqual(try engine.account(alice).hasLoginProtector, false, "the login protector needed the lost key")
        XCTAssertEqual(engine.machineKeyStatus().stranded, [bob], "bob has no recovery key")
        XCTAssertThrowsError(try engine.unprotectData(b))
        // Bob is wiped; the lost key is dropped once no keybag names it.
        try engine.deregister(bob, wipe: true)
        engine = try self.engine(tpm)
        XCTAssertEqual(engine.machineKeyStatus().keys.count, 1)
        try engine.unlock(alice, passphrase: try passphrase("new"))
        try engine.lock(alice, immediately: true)
        try engine.recover(alice, with: key, newPassphrase: nil)
        XCTAssertEqual(try engine.lockStatus(alice), .unlocked, "the recovery key still works on the new machine key")
    }
}
