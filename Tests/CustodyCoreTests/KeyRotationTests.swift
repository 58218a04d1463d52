@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodyTestSupport
import Foundation
import XCTest

/// New keys for an identity (`Engine.rotateKeys`): what it protects from then on uses the new
/// generation, what it protected before still opens, every protector still unlocks it, and the
/// new generation travels to its other hosts, where an import adds it to the keys they have.
final class KeyRotationTests: HostsEngineTestCase {
    private func keyID(of blob: [UInt8]) throws -> [UInt8] {
        try ProtectedFile.readHeader(from: MemoryStorage(blob)).classKeyID
    }

    func testNewDataTakesTheNewKeysAndEverythingOpensAfterALockAndARestart() throws {
        var engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", policy: Policy(protectionLevel: .complete), passphrase: try passphrase("hers"))
        let before = try engine.protectData(Array("before".utf8), for: "alice-id")
        let idsBefore = try engine.account("alice-id").keyIDs ?? []
        let tagBefore = try XCTUnwrap(engine.nameKey(for: "alice-id")?.tag)
        let events = recorded(engine)

        let rotated = try engine.rotateKeys("alice@contoso.com")
        XCTAssertEqual(rotated.keyIDs?.count, 8, "two generations of four keys")
        XCTAssertTrue(Set(idsBefore).isSubset(of: Set(rotated.keyIDs ?? [])))
        XCTAssertTrue(rotated.reprotectPending, "its files are to be brought to the new keys")
        let tagAfter = try XCTUnwrap(engine.nameKey(for: "alice-id")?.tag)
        XCTAssertNotEqual(tagAfter, tagBefore, "new names get a new name key")
        XCTAssertEqual(rotated.nameTag, tagAfter)
        XCTAssertEqual(rotated.earlierNameTags, [tagBefore])
        XCTAssertEqual(rotated.nameTags, [tagAfter, tagBefore])
        XCTAssertEqual(events.withLock { $0.map(\.kind) }, [.keysRotated])

        let after = try engine.protectData(Array("after".utf8), for: "alice-id")
        XCTAssertFalse(idsBefore.contains(hexString(try keyID(of: after))), "new data is under the new class A key")
        XCTAssertTrue(idsBefore.contains(hexString(try keyID(of: before))))
        XCTAssertEqual(try engine.unprotectData(before), Array("before".utf8))
        XCTAssertEqual(try engine.unprotectData(after), Array("after".utf8))
        XCTAssertEqual(try engine.account(of: ProtectedFile.readHeader(from: MemoryStorage(before))).id, "alice-id", "an earlier key's data is still hers")

        // Locked: neither generation's class A opens; unlocked with her passphrase: both do.
        try engine.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try engine.unprotectData(before))
        XCTAssertThrowsError(try engine.unprotectData(after))
        try engine.unlock("alice-id", passphrase: try passphrase("hers"))
        XCTAssertEqual(try engine.unprotectData(before), Array("before".utf8))

        // The keybag as stored: a restart finds both generations, the new one current.
        engine = try makeEngine()
        try engine.unlock("alice-id", passphrase: try passphrase("hers"))
        XCTAssertEqual(try engine.unprotectData(before), Array("before".utf8))
        XCTAssertEqual(try engine.unprotectData(after), Array("after".utf8))
        XCTAssertEqual(engine.nameKey(for: "alice-id")?.tag, tagAfter)
        XCTAssertEqual(Set(engine.nameKeys().byTag.keys), [tagBefore, tagAfter], "listings show both generations' names")
        XCTAssertEqual(engine.nameKeys().all.map(\.tag).sorted(), [tagBefore, tagAfter].sorted(), "and lookups try both while files are brought over")
        try engine.reprotectFinished("alice-id")
        XCTAssertEqual(engine.nameKeys().all.map(\.tag), [tagAfter], "then only the current one")
        let again = try engine.protectData(Array("again".utf8), for: "alice-id")
        XCTAssertEqual(try keyID(of: again), try keyID(of: after))

        // A second rotation: three generations, each still opening its own.
        try engine.rotateKeys("alice-id")
        XCTAssertEqual(try engine.account("alice-id").keyIDs?.count, 12)
        for (blob, text) in [(before, "before"), (after, "after")] { XCTAssertEqual(try engine.unprotectData(blob), Array(text.utf8)) }
        XCTAssertEqual(try engine.account("alice-id").earlierNameTags?.count, 2)
    }

    func testEveryProtectorStillUnlocksAfterARotation() throws {
        var engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", policy: Policy(protectionLevel: .complete), passphrase: try passphrase("first"))
        let (recovery, _) = try engine.createRecoveryKey("alice-id")
        let before = try engine.protectData(Array("before".utf8), for: "alice-id")
        try engine.rotateKeys("alice-id")
        let after = try engine.protectData(Array("after".utf8), for: "alice-id")

        // A new passphrase wraps the keys the protectors hold; both generations still open.
        try engine.changePassphrase("alice-id", old: try passphrase("first"), new: try passphrase("second"))
        engine = try makeEngine()
        XCTAssertThrowsError(try engine.unlock("alice-id", passphrase: try passphrase("first")))
        try engine.unlock("alice-id", passphrase: try passphrase("second"))
        XCTAssertEqual(try engine.unprotectData(before), Array("before".utf8))
        XCTAssertEqual(try engine.unprotectData(after), Array("after".utf8))

        // The recovery key made before the rotation recovers her, and both generations open.
        try engine.lock("alice-id", immediately: true)
        try engine.recover("alice-id", with: recovery, newPassphrase: try passphrase("third"))
        XCTAssertEqual(try engine.unprotectData(before), Array("before".utf8))
        XCTAssertEqual(try engine.unprotectData(after), Array("after".utf8))
        engine = try makeEngine()
        try engine.unlock("alice-id", passphrase: try passphrase("third"))
        XCTAssertEqual(try engine.unprotectData(after), Array("after".utf8))
    }

    func testALockedIdentityIsNotRotated() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com", passphrase: try passphrase("hers"))
        try engine.lock("alice-id", immediately: true)
        XCTAssertThrowsError(try engine.rotateKeys("alice-id")) { XCTAssertEqual(($0 as? EngineError)?.code, EngineError.locked("", .complete).code) }
        XCTAssertEqual(try engine.account("alice-id").keyIDs?.count, 4)
        XCTAssertThrowsError(try engine.rotateKeys("nobody@contoso.com"))
    }

    func testTheNewKeysTravelAndAnImportAddsThemToTheOldOnes() throws {
        let first = try makeEngine(), second = try otherEngine(), third = try otherEngine()
        try first.enroll(id: "alice-id", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        guard case .imported = try second.importIdentity(try first.exportIdentity("alice-id", to: second.hostKey().publicKey),
                                                         passphrase: try passphrase("second"), policy: nil, uid: nil) else { return XCTFail("not imported") }
        let before = try first.protectData(Array("before".utf8), for: "alice-id")

        // The first host rotates (the third host, which never had her, stands for one that is lost).
        try first.rotateKeys("alice-id")
        let after = try first.protectData(Array("after".utf8), for: "alice-id")
        XCTAssertThrowsError(try second.unprotectData(after), "a host without the new keys opens nothing written with them")

        let export = try first.exportIdentity("alice-id", to: second.hostKey().publicKey)
        XCTAssertEqual(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil, checking: true), .rotated(nil))
        XCTAssertThrowsError(try second.unprotectData(after), "checking adds nothing")
        guard case .rotated(let account?) = try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil) else { return XCTFail("not rotated") }
        XCTAssertEqual(Set(account.keyIDs ?? []), Set(try first.account("alice-id").keyIDs ?? []))
        XCTAssertEqual(try second.unprotectData(after), Array("after".utf8))
        XCTAssertEqual(try second.unprotectData(before), Array("before".utf8))
        let fromSecond = try second.protectData(Array("from the second".utf8), for: "alice-id")
        XCTAssertEqual(try keyID(of: fromSecond), try keyID(of: after), "the second host writes with the new keys too")
        XCTAssertEqual(try first.unprotectData(fromSecond), Array("from the second".utf8))
        XCTAssertEqual(second.nameKey(for: "alice-id")?.tag, first.nameKey(for: "alice-id")?.tag)
        // Its own passphrase still unlocks it there.
        try second.lock("alice-id", immediately: true)
        try second.unlock("alice-id", passphrase: try passphrase("second"))
        XCTAssertEqual(try second.unprotectData(after), Array("after".utf8))
        // Again: nothing to do; an export from before the rotation: nothing to do either.
        XCTAssertEqual(try second.importIdentity(export, passphrase: nil, policy: nil, uid: nil), .alreadyHere(try second.account("alice-id")))

        // A host that never had her gets every generation at once.
        guard case .imported(let fresh?) = try third.importIdentity(try first.exportIdentity("alice-id", to: third.hostKey().publicKey),
                                                                   passphrase: nil, policy: nil, uid: nil) else { return XCTFail("not imported") }
        XCTAssertEqual(fresh.keyIDs?.count, 8)
        XCTAssertEqual(try third.unprotectData(before), Array("before".utf8))
        XCTAssertEqual(try third.unprotectData(after), Array("after".utf8))
        XCTAssertEqual(try keyID(of: try third.protectData(Array("x".utf8), for: "alice-id")), try keyID(of: after))
    }

    func testAnOlderExportChangesNothingAndAnotherIdentitysKeysAreRefused() throws {
        let first = try makeEngine(), second = try otherEngine()
        try first.enroll(id: "alice-id", upn: "alice@contoso.com")
        let old = try first.exportIdentity("alice-id", to: second.hostKey().publicKey)
        try first.rotateKeys("alice-id")
        guard case .imported = try second.importIdentity(try first.exportIdentity("alice-id", to: second.hostKey().publicKey),
                                                         passphrase: nil, policy: nil, uid: nil) else { return XCTFail("not imported") }
        XCTAssertEqual(try second.importIdentity(old, passphrase: nil, policy: nil, uid: nil), .alreadyHere(try second.account("alice-id")),
                       "an export from before the rotation: this host has its keys and later ones")
        XCTAssertEqual(try second.account("alice-id").keyIDs?.count, 8)
        // Keys that share nothing with hers here: another enrolment of the same account.
        let stranger = try otherEngine()
        try stranger.enroll(id: "alice-id", upn: "alice@contoso.com")
        try stranger.rotateKeys("alice-id")
        XCTAssertThrowsError(try second.importIdentity(try stranger.exportIdentity("alice-id", to: second.hostKey().publicKey),
                                                       passphrase: nil, policy: nil, uid: nil)) {
            XCTAssertEqual(($0 as? EngineError)?.code, 208, "\($0)")
        }
    }

    func testAWipeFindsEveryGenerationsNamesAndDestroysThemAll() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "alice-id", upn: "alice@contoso.com")
        let first = try XCTUnwrap(engine.nameKey(for: "alice-id")?.tag)
        try engine.rotateKeys("alice-id")
        let second = try XCTUnwrap(engine.nameKey(for: "alice-id")?.tag)
        let blob = try engine.protectData(Array("x".utf8), for: "alice-id")
        // After a restart the account still knows both tags, and a wipe's account carries them.
        let restarted = try makeEngine()
        XCTAssertEqual(try restarted.account("alice-id").nameTags, [second, first])
        try restarted.deregister("alice-id", wipe: true)
        XCTAssertThrowsError(try restarted.unprotectData(blob))
        XCTAssertTrue(restarted.nameKeys().byTag.isEmpty)
    }
}
