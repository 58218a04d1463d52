@testable import CustodyCore
import CustodySystem
import Foundation
import XCTest

/// The transfer rules (docs/identity.md, "Transfers"), decision by decision.
final class TransferTests: EngineTestCase {
    let process = TransferParty(uid: 1000, pid: 42) { program("/usr/bin/cat") }

    func engineWithTwoManagedIdentities(_ settings: Settings = testSettings(multiIdentity: true)) throws -> Engine {
        let engine = try makeEngine(settings)
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com")
        try engine.enroll(id: "carol-id", upn: "carol@fabrikam.com")
        return engine
    }

    func policy(send: TransferScope = .none, receive: TransferScope = .all) -> Policy {
        var policy = Policy()
        policy.sendToOtherIdentities = send
        policy.receiveFromOtherIdentities = receive
        return policy
    }

    func testSendScopes() throws {
        let engine = try engineWithTwoManagedIdentities()
        let readers: [String?] = ["alice@contoso.com", "ALICE-ID", "carol@fabrikam.com", "me@gmail.com", nil]
        let expected: [TransferScope: [Bool]] = [
            .none: [true, true, false, false, false],
            .managed: [true, true, true, false, false],
            .all: [true, true, true, true, true],
        ]
        for (scope, answers) in expected {
            try engine.setPolicy("alice-id", policy(send: scope))
            for (reader, allowed) in zip(readers, answers) {
                let decision = engine.transferDecision(from: "Alice@Contoso.com", to: reader, by: process)
                XCTAssertEqual(decision.allowed, allowed, "send \(scope) to \(reader ?? "none"): \(decision.reason)")
                if !allowed { XCTAssertEqual(decision.code, 312); XCTAssertEqual(decision.name, "SharingNotAllowed") }
            }
        }
        XCTAssertFalse(engine.transferDecision(from: "alice-id", to: "alice@contoso.com", by: process).crossesIdentities)
        XCTAssertTrue(engine.transferDecision(from: "me@gmail.com", to: "someone@else", by: process).allowed, "nothing managed: no rule")
    }

    func testReceiveScopes() throws {
        let engine = try engineWithTwoManagedIdentities()
        try engine.setPolicy("carol-id", policy(send: .all))
        let writers: [String?] = ["carol@fabrikam.com", "me@gmail.com", nil, "alice@contoso.com"]
        let expected: [TransferScope: [Bool]] = [
            .all: [true, true, true, true],
            .managed: [true, false, false, true],
            .none: [false, false, false, true],
        ]
        for (scope, answers) in expected {
            try engine.setPolicy("alice-id", policy(receive: scope))
            for (writer, allowed) in zip(writers, answers) {
                let decision = engine.transferDecision(from: writer, to: "alice@contoso.com", by: process)
                XCTAssertEqual(decision.allowed, allowed, "receive \(scope) from \(writer ?? "none"): \(decision.reason)")
                if !allowed { XCTAssertEqual(decision.code, 313) }
            }
        }
    }

    func testExemptionsFromSettingsAndPolicy() throws {
        var settings = testSettings(multiIdentity: true)
        settings.transferExemptUids = [34]
        settings.transferExemptExecutables = ["/usr/bin/md5sum"]
        let engine = try engineWithTwoManagedIdentities(settings)
        let checksum = TransferParty(uid: 1000, pid: 1) { program("/usr/bin/md5sum") }
        let byUid = TransferParty(uid: 34, pid: 1) { nil }
        let root = TransferParty(uid: 0, pid: 1) { program("/usr/bin/cat") }
        XCTAssertTrue(engine.transferDecision(from: "alice-id", to: nil, by: checksum).exempt)
        XCTAssertTrue(engine.transferDecision(from: "alice-id", to: nil, by: byUid).allowed)
        XCTAssertFalse(engine.transferDecision(from: "alice-id", to: nil, by: root).allowed, "root is not exempt by default")
        var exempting = policy()
        exempting.transferExemptUids = [0]
        try engine.setPolicy("alice-id", exempting)
        XCTAssertTrue(engine.transferDecision(from: "alice-id", to: nil, by: root).allowed, "the owner's policy exempts root")
        XCTAssertFalse(engine.transferDecision(from: "carol-id", to: nil, by: root).allowed, "Carol's does not")
        XCTAssertFalse(engine.transferDecision(from: "alice-id", to: nil, by: .ownerChange).allowed, "an owner change has no exemption")
    }

    /// A process is the exempt program only by what the kernel says in the daemon's view (see
    /// `ExemptProgramTests` for each way of faking it); a refusal says why it is not exempt.
    func testAFakedExemptProgramIsRefusedAndTold() throws {
        var settings = testSettings(multiIdentity: true)
        settings.transferExemptExecutables = ["/usr/bin/md5sum"]
        let engine = try engineWithTwoManagedIdentities(settings)
        var faked = program("/usr/bin/cat")
        faked.path = "/usr/bin/md5sum"
        faked.sharesNamespaces = false
        let impostor = faked
        let decision = engine.transferDecision(from: "alice-id", to: nil, by: TransferParty(uid: 1000, pid: 7) { impostor })
        XCTAssertFalse(decision.allowed)
        XCTAssertFalse(decision.exempt)
        XCTAssertTrue(decision.reason.contains("not exempt: process runs /usr/bin/md5sum in a mount or user namespace of its own"), decision.reason)
        XCTAssertEqual(decision.code, 312)
    }

    func testPoliciesDecodeTheOlderBooleansAndCheckLocations() throws {
        let old = try JSONDecoder().decode(Policy.self, from: Data(#"{"canShareWithOtherIdentities": true, "canReceiveFromUnmanaged": false}"#.utf8))
        XCTAssertEqual(old.sendToOtherIdentities, .all)
        XCTAssertEqual(old.receiveFromOtherIdentities, .managed)
        let new = try JSONDecoder().decode(Policy.self, from: Data(#"{"sendToOtherIdentities": "managed", "canShareWithOtherIdentities": true, "saveToLocations": ["accountdocument", "LocalStorage"]}"#.utf8))
        XCTAssertEqual(new.sendToOtherIdentities, .managed, "the scope wins over the older boolean")
        XCTAssertEqual(new.saveToLocations, ["AccountDocument", "LocalDrive"], "names are canonical, aliases mapped")
        XCTAssertNil(new.openFromLocations)
        XCTAssertThrowsError(try JSONDecoder().decode(Policy.self, from: Data(#"{"sendToOtherIdentities": "some"}"#.utf8)))
        XCTAssertThrowsError(try JSONDecoder().decode(Policy.self, from: Data(#"{"transferExemptExecutables": ["cat"]}"#.utf8)))
        let encoded = String(decoding: try JSONEncoder().encode(Policy()), as: UTF8.self)
        XCTAssertTrue(encoded.contains(#""sendToOtherIdentities":"none""#) && encoded.contains(#""canShareWithOtherIdentities":false"#), encoded)

        let engine = try engineWithTwoManagedIdentities()
        var unknown = Policy()
        unknown.saveToLocations = ["Backups"]
        XCTAssertThrowsError(try engine.setPolicy("alice-id", unknown)) { XCTAssertEqual(($0 as? EngineError)?.code, 301) }
        var settings = testSettings(multiIdentity: true)
        settings.locations = ["Backups": ["/srv/backup"]]
        engine.updateSettings(settings)
        XCTAssertNoThrow(try engine.setPolicy("alice-id", unknown), "a configured location is known")
    }

    func testLocations() throws {
        var settings = testSettings(multiIdentity: true)
        settings.locations = ["OneDriveForBusiness": ["/home/alice/OneDrive - Contoso"], "Deep": ["/home/alice/OneDrive - Contoso/Deep"]]
        let engine = try engineWithTwoManagedIdentities(settings)
        XCTAssertEqual(try engine.locate("/home/alice/OneDrive - Contoso/a/../b.docx").location, "OneDriveForBusiness")
        XCTAssertEqual(try engine.locate("/home/alice/OneDrive - Contoso/Deep/x").location, "Deep", "the deepest directory wins")
        XCTAssertEqual(try engine.locate("/home/alice/OneDrive - Contoso2/x").location, "LocalDrive", "a prefix of a name is not inside")
        XCTAssertEqual(try engine.locate("/tmp/x").location, "LocalDrive")
        XCTAssertThrowsError(try engine.locate("relative/path"))
        var limited = Policy()
        limited.saveToLocations = ["AccountDocument", "OneDriveForBusiness"]
        limited.openFromLocations = ["AccountDocument"]
        try engine.setPolicy("alice-id", limited)
        XCTAssertTrue(engine.isSaveToAllowed(.oneDriveForBusiness, for: "alice@contoso.com"))
        XCTAssertFalse(engine.isSaveToAllowed(.localDrive, for: "alice@contoso.com"))
        XCTAssertFalse(engine.isSaveToAllowed(.cameraRoll, for: "alice@contoso.com"))
        XCTAssertTrue(engine.isSaveToAllowed(.localDrive, for: "carol-id"), "no list: every location")
        XCTAssertTrue(engine.isSaveToAllowed(.localDrive, for: "me@gmail.com"), "unmanaged: every location")
        XCTAssertFalse(engine.isOpenFromAllowed(.oneDriveForBusiness, for: "alice-id"))
        XCTAssertEqual(Location(name: "Camera"), .cameraRoll)
        XCTAssertTrue(Location.cameraRoll.neverMatches)
        XCTAssertNil(Location(name: "../etc"))
        let summary = engine.locationSummaries(answering: true, for: "alice-id")
        XCTAssertEqual(summary.first { $0.name == "LocalDrive" }?.saveToAllowed, false)
        XCTAssertEqual(summary.first { $0.name == "OneDriveForBusiness" }?.paths, ["/home/alice/OneDrive - Contoso"])
    }

    func testBlockedTransferEventsAreLimited() throws {
        let engine = try engineWithTwoManagedIdentities()
        let recorder = recorded(engine)
        let decision = engine.transferDecision(from: "alice-id", to: nil, by: process)
        for _ in 0..<100 {
            engine.reportBlockedTransfer(decision, source: "alice@contoso.com", target: nil, party: process, operation: "read", path: "corp.txt")
        }
        let blocked = recorder.withLock { $0.filter { $0.kind == .transferBlocked } }
        XCTAssertEqual(blocked.count, EventRateLimiter.perSecond, "a loop of refused opens does not flood the stream")
        XCTAssertEqual(blocked.first?.details["executable"], "/usr/bin/cat")
        XCTAssertEqual(blocked.first?.identity, "alice@contoso.com")
    }
}

/// The program at `path` as `RunningProgram.inspect` would find a process running it unaltered:
/// the file the path leads to, in the daemon's namespaces, untraced, with only root's files mapped.
func program(_ path: String) -> RunningProgram {
    var attributes = stat()
    _ = stat(path, &attributes)
    return RunningProgram(path: path, file: FileIdentity(attributes), sharesNamespaces: true, tracer: 0,
                          executableMappings: [MappedFile(file: FileIdentity(attributes), owner: 0, mode: 0o100755)])
}
