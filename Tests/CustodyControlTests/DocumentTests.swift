import CustodyAPI
@testable import CustodyControl
@testable import CustodyCore
import Foundation
import XCTest

/// The engine's values and the API's documents (CustodyAPI) say the same thing both ways.
final class DocumentTests: XCTestCase {
    func testAPolicyKeepsEveryFieldThroughItsDocument() throws {
        var policy = Policy(fileEncryptionRequired: false, protectionLevel: .untilFirstAuthentication, fileProviderEncryptionRequired: true)
        policy.sendToOtherIdentities = .managed
        policy.receiveFromOtherIdentities = .none
        policy.saveToLocations = ["AccountDocument", "LocalDrive"]
        policy.openFromLocations = []
        policy.transferExemptExecutables = ["/usr/bin/rsync"]
        policy.transferExemptUids = [34]
        policy.lockOnSessionLock = false
        policy.lockOnSuspend = true
        for original in [Policy(), policy] {
            let document = try XCTUnwrap(ControlAPI.document(original))
            XCTAssertEqual(try ControlAPI.policy(document), original)
        }
        let document = try XCTUnwrap(ControlAPI.document(policy))
        XCTAssertEqual(document.protectionLevel, "untilFirstAuth")
        XCTAssertEqual(document.saveToLocations, ["AccountDocument", "LocalDrive"])
        XCTAssertEqual(document.openFromLocations, [])
        XCTAssertEqual(document.transferExemptUids, [34])
    }

    func testADocumentWithNamesTheEngineDoesNotKnowIsRefused() {
        var unknownLocation = CustodyPolicy()
        unknownLocation.saveToLocations = [""]
        var unknownScope = CustodyPolicy()
        unknownScope.sendToOtherIdentities = "some"
        for document in [CustodyPolicy(protectionLevel: "ultra"), unknownLocation, unknownScope] {
            XCTAssertThrowsError(try ControlAPI.policy(document)) { error in
                XCTAssertEqual((error as? ControlAPI.Failure)?.status, 400, "\(document)")
            }
        }
        // Apple's names and the older booleans are the engine's to accept.
        XCTAssertEqual(try ControlAPI.policy(CustodyPolicy(protectionLevel: "NSFileProtectionComplete")).protectionLevel, .complete)
        XCTAssertEqual(try ControlAPI.policy(CustodyPolicy(canShareWithOtherIdentities: true)).sendToOtherIdentities, .all)
    }

    func testAnAccountDocumentStatesItsKeysAndFlags() throws {
        var account = Account(id: "a-id", upn: "a@contoso.com", registeredAt: 0, policy: Policy(), uid: 1000)
        account.hasPassphrase = true
        let document = CustodyAccount(account)
        XCTAssertEqual(document.id, "a-id")
        XCTAssertTrue(document.enrolled)
        XCTAssertEqual(document.hasPassphrase, true)
        XCTAssertEqual(document.hasLoginProtector, false)
        XCTAssertEqual(document.reprotectPending, false)
        XCTAssertEqual(document.policy?.protectionLevel, "complete")
        let json = try JSONSerialization.jsonObject(with: JSONEncoder().encode(document)) as? [String: Any]
        XCTAssertEqual(json?["hasRecoveryKey"] as? Bool, false, "the flags are always stated")
    }

    /// The JSON of an engine value and of the document made from it, keys sorted.
    func same<E: Encodable, D: Encodable>(_ engine: E, _ document: D, file: StaticString = #filePath, line: UInt = #line) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        XCTAssertEqual(String(decoding: try encoder.encode(engine), as: UTF8.self), String(decoding: try encoder.encode(document), as: UTF8.self),
                       file: file, line: line)
    }

    /// Every engine value an answer carries comes out as its document with nothing lost or
    /// renamed: the converters in Documents.swift copy every field.
    func testEveryAnswerSaysWhatTheEngineSaid() throws {
        let info = CustodyCore.FileProtectionInfo(path: "/m/a", kind: "file", owner: "a@contoso.com", managed: true, encrypted: true,
                                                  protectionClass: "complete", size: 7, mountPoint: "/m")
        try same(info, CustodyAPI.FileProtectionInfo(info))
        let data = CustodyCore.DataProtectionInfo(isProtected: true, owner: "a", managed: false, encrypted: false, protectionClass: nil)
        try same(data, CustodyAPI.DataProtectionInfo(data))
        let decision = CustodyCore.SharingDecision(allowed: false, reason: "no", code: 312, name: "SharingNotAllowed")
        try same(decision, CustodyAPI.SharingDecision(decision))
        let summary = CustodyCore.LocationSummary(name: "LocalDrive", paths: ["/"], neverMatches: false, saveToAllowed: true, openFromAllowed: nil)
        try same(summary, CustodyAPI.LocationSummary(summary))
        let location = CustodyCore.PathLocation(path: "/home/a", location: "LocalDrive", under: "/")
        try same(location, CustodyAPI.PathLocation(location))
        let problem = StateProblem(kind: .setAside, file: "bindings.json", message: "unreadable", identity: "a", setAsideAs: "bindings.json.unreadable-1")
        try same(problem, CustodyStateProblem(problem))
        var status = MachineKeyStatus(store: .tpm2, id: "k1", pcrs: [7], tpm: "swtpm", dictionaryAttack: DictionaryAttackState(failures: 1, maxTries: 32, intervalSeconds: 600),
                                      problem: nil, keys: [.init(id: "k1", store: .tpm2, current: true, available: true, problem: nil)], warning: "w")
        status.stranded = ["b@contoso.com"]
        try same(status, CustodyMachineKey(status))
        let event = EngineEvent(sequence: 4, time: 1.5, kind: .wipeFinished, identity: "a", code: 102, message: "wiped", details: ["k": "v"])
        try same(event, CustodyEvent(event))
        let outcome = Engine.LoginOutcome(unlocked: ["a"], stillLocked: ["b"], protected: [])
        try same(outcome, LoginResult(outcome))
        let escrow = EscrowedRecoveryKey(accountID: "a-id", upn: "a", created: 2, publicKey: "cGs=", sealed: "c2Vh")
        try same(escrow, RecoveryEscrow(escrow))
    }
}
