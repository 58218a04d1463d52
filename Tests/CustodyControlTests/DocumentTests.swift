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
}
