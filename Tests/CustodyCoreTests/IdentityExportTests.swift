@testable import CustodyCore
import CustodyCrypto
import CustodyTestSupport
import Foundation
import XCTest

/// An identity's keys sealed to another host's key and enrolled there: two engines with state
/// directories (and machine keys) of their own.
final class IdentityExportTests: HostsEngineTestCase {
    func testTheKeysTravelSealedAndOpenWhatTheOtherHostProtected() throws {
        let first = try makeEngine(), second = try otherEngine()
        XCTAssertNotEqual(try first.hostKey(), try second.hostKey(), "each host has its own key")
        XCTAssertEqual(try first.hostKey(), try first.hostKey(), "derived, the same each time")
        try first.enroll(id: "alice-id", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        let blob = try first.protectData(Array("protected on the first host".utf8), for: "alice-id")
        XCTAssertThrowsError(try second.unprotectData(blob))

        let export = try first.exportIdentity("alice@contoso.com", to: try second.hostKey().publicKey)
        XCTAssertEqual(export.toFingerprint, try second.hostKey().fingerprint)
        XCTAssertEqual(export.from, try first.hostKey().fingerprint)
        XCTAssertEqual(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil, checking: true), .imported(nil))
        XCTAssertTrue(second.accounts().isEmpty, "checking enrolls nothing")
        guard case .imported(let imported?) = try second.importIdentity(export, passphrase: try passphrase("the second host's"), policy: nil, uid: nil) else {
            return XCTFail("not imported")
        }
        let account = imported
        XCTAssertEqual(account.policy?.protectionLevel, .untilFirstAuthentication, "the policy travels")
        XCTAssertEqual(account.keyIDs, try first.account("alice-id").keyIDs, "the same class keys, by ID")
        XCTAssertEqual(account.hasPassphrase, true)
        XCTAssertEqual(try second.unprotectData(blob), Array("protected on the first host".utf8))
        let back = try second.protectData(Array("protected on the second host".utf8), for: "alice-id")
        XCTAssertEqual(try first.unprotectData(back), Array("protected on the second host".utf8))
        XCTAssertEqual(second.nameKey(for: "alice-id")?.tag, first.nameKey(for: "alice-id")?.tag, "names open on both")

        // The second host's keybag is its own: the passphrase is the second host's.
        try second.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try second.unlock("alice-id", passphrase: nil))
        try second.unlock("alice-id", passphrase: try passphrase("the second host's"))
        // Again: nothing to do (idempotent), checking or not.
        XCTAssertEqual(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil), .alreadyHere(try second.account("alice-id")))
        XCTAssertEqual(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil, checking: true), .alreadyHere(try second.account("alice-id")))
        // The same account with other keys (enrolled anew on a third host) is refused.
        let third = try otherEngine()
        try third.enroll(id: "alice-id", upn: "alice@contoso.com")
        let other = try third.exportIdentity("alice-id", to: try second.hostKey().publicKey)
        for checking in [true, false] {
            XCTAssertThrowsError(try second.importIdentity(other, passphrase: nil, policy: nil, uid: nil, checking: checking)) {
                XCTAssertEqual(($0 as? EngineError)?.code, 208, "\($0)")
            }
        }
    }

    func testAnExportForAnotherHostOrChangedIsRefused() throws {
        let first = try makeEngine(), second = try otherEngine()
        try first.enroll(id: "alice-id", upn: "alice@contoso.com")
        // Sealed to the first host itself: the second cannot open it.
        let own = try first.exportIdentity("alice-id", to: try first.hostKey().publicKey)
        XCTAssertThrowsError(try second.importIdentity(own, passphrase: nil, policy: nil, uid: nil)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
        }
        var export = try first.exportIdentity("alice-id", to: try second.hostKey().publicKey)
        export.upn = "mallory@contoso.com"
        export.accountID = "mallory-id"
        XCTAssertThrowsError(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
        }
        XCTAssertTrue(second.accounts().isEmpty, "nothing enrolled")
        XCTAssertThrowsError(try first.exportIdentity("alice-id", to: [1, 2, 3])) {
            XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
        }
        // Keys kept here from an earlier enrolment are not overwritten by an import.
        let fresh = try first.exportIdentity("alice-id", to: try second.hostKey().publicKey)
        try second.enroll(id: "alice-id", upn: "alice@contoso.com")
        try second.deregister("alice-id", wipe: false)
        for checking in [true, false] {
            XCTAssertThrowsError(try second.importIdentity(fresh, passphrase: nil, policy: nil, uid: nil, checking: checking)) {
                XCTAssertEqual(($0 as? EngineError)?.code, 321, "\($0)")
            }
        }
    }

    func testTheSealedContentReadsBackAndRefusesWhatDoesNotAddUp() throws {
        let host = try IdentityTransfer.hostKeyPair(machineKey: try SecretBytes.random(count: 32))
        let keys = TransferredClassKeys(symmetric: [.complete: ([1, 1, 1, 1, 1, 1, 1, 1], try SecretBytes.random(count: 32)),
                                                    .untilFirstAuthentication: ([3, 3, 3, 3, 3, 3, 3, 3], try SecretBytes.random(count: 32)),
                                                    .none: ([4, 4, 4, 4, 4, 4, 4, 4], try SecretBytes.random(count: 32))],
                                        classB: ([2, 2, 2, 2, 2, 2, 2, 2], try SecretBytes.random(count: 32)))
        let description = IdentityTransfer.Description(format: IdentityExport.currentFormat, accountID: "a", upn: "a@b.c", identity: "a", to: "k",
                                                       keyIDs: ["A": "0101010101010101", "B": "0202020202020202", "C": "0303030303030303", "D": "0404040404040404"],
                                                       policy: nil)
        let sealed = try IdentityTransfer.seal(description, keys: [keys], to: host.key.publicKey)
        let (read, all) = try XCTUnwrap(try IdentityTransfer.open(sealed, host: host))
        XCTAssertEqual(all.generations.count, 1)
        XCTAssertEqual(all.current, 0)
        let opened = try XCTUnwrap(all.generations.first)
        XCTAssertEqual(read.upn, "a@b.c")
        XCTAssertEqual(opened.classB.id, [2, 2, 2, 2, 2, 2, 2, 2])
        XCTAssertTrue(try XCTUnwrap(opened.symmetric[.none]).key.constantTimeEquals(try XCTUnwrap(keys.symmetric[.none]).key))
        XCTAssertTrue(opened.classB.privateKey.constantTimeEquals(keys.classB.privateKey))
        // Another host's key opens nothing.
        let other = try IdentityTransfer.hostKeyPair(machineKey: try SecretBytes.random(count: 32))
        XCTAssertNil(try IdentityTransfer.open(sealed, host: other))
        // A key ID missing from the description: refused, typed.
        var missing = description
        missing.keyIDs["C"] = nil
        XCTAssertThrowsError(try IdentityTransfer.open(try IdentityTransfer.seal(missing, keys: [keys], to: host.key.publicKey), host: host)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
        }
        // Two generations: the second's keys follow the first's, and the current one is named.
        var rotated = description
        rotated.generations = [["A": "0505050505050505", "B": "0606060606060606", "C": "0707070707070707", "D": "0808080808080808"]]
        rotated.current = 1
        var later = keys
        later.symmetric[.none] = ([8, 8, 8, 8, 8, 8, 8, 8], try SecretBytes.random(count: 32))
        let (_, both) = try XCTUnwrap(try IdentityTransfer.open(try IdentityTransfer.seal(rotated, keys: [keys, later], to: host.key.publicKey), host: host))
        XCTAssertEqual(both.current, 1)
        XCTAssertEqual(both.generations.map { $0.symmetric[.none]?.id ?? [] }, [[4, 4, 4, 4, 4, 4, 4, 4], [8, 8, 8, 8, 8, 8, 8, 8]])
        XCTAssertTrue(try XCTUnwrap(both.generations.last?.symmetric[.none]).key.constantTimeEquals(try XCTUnwrap(later.symmetric[.none]).key))
        // Keys for two generations where the description names one, or the other way round, or a
        // current generation that is not there: refused, typed.
        for (named, sent) in [(description, [keys, later]), (rotated, [keys])] {
            XCTAssertThrowsError(try IdentityTransfer.open(try IdentityTransfer.seal(named, keys: sent, to: host.key.publicKey), host: host)) {
                XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
            }
        }
        var beyond = rotated
        beyond.current = 2
        XCTAssertThrowsError(try IdentityTransfer.open(try IdentityTransfer.seal(beyond, keys: [keys, later], to: host.key.publicKey), host: host)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 320, "\($0)")
        }
    }
}
