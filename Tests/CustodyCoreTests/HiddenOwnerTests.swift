@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import XCTest

/// Owners found by key ID: the IDs an account keeps (also while its keybag is locked or after a
/// restart), none once it is wiped, the new ones after it enrolls again.
final class HiddenOwnerTests: EngineTestCase {
    func testKeyIDsFindTheirAccountUntilItIsWiped() throws {
        var engine: Engine? = try makeEngine()
        try engine?.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))
        try engine?.register(id: "bob", upn: "bob@personal.example")
        let ownerID = try XCTUnwrap(engine?.ownerKeyID(for: "alice@contoso.com"))
        XCTAssertNil(engine?.ownerKeyID(for: "bob@personal.example"), "an unmanaged identity is recorded by name")
        XCTAssertEqual(engine?.account(forKeyID: ownerID)?.upn, "alice@contoso.com")
        let classKey = try XCTUnwrap(engine?.classKey(for: "alice", .complete, purpose: .create))
        XCTAssertEqual(engine?.account(forKeyID: classKey.id)?.upn, "alice@contoso.com", "every class's ID names her")
        let header = try FileHeader.encrypted(owner: nil, protectionClass: .complete, classKey: classKey, fileKey: try SecretBytes.random(count: 32))
        XCTAssertEqual(engine?.ownerName(of: header), "alice@contoso.com")
        XCTAssertEqual(engine?.ownerName(of: OwnerRecord(ownerKeyID: ownerID)), "alice@contoso.com")
        XCTAssertEqual(engine?.ownerKeyID(for: "alice@contoso.com"), ownerID, "asked again: the same")
        XCTAssertEqual(try engine?.identityKey(of: header), IdentityKey("alice"), "her account's key")

        // After a restart, locked: the IDs the account keeps still name her.
        engine = nil
        engine = try makeEngine()
        XCTAssertEqual(engine?.account(forKeyID: ownerID)?.upn, "alice@contoso.com")
        XCTAssertEqual(try engine?.account(of: header).upn, "alice@contoso.com")

        // Wiped, then enrolled again: the old IDs name nobody, the new ones her.
        try engine?.unlock("alice", passphrase: try passphrase("correct horse"))
        XCTAssertEqual(engine?.ownerKeyID(for: "alice@contoso.com"), ownerID)
        try engine?.deregister("alice", wipe: true)
        XCTAssertNil(engine?.account(forKeyID: ownerID))
        XCTAssertNil(engine?.ownerKeyID(for: "alice@contoso.com"), "no ID kept from before the wipe")
        XCTAssertThrowsError(try engine?.identityKey(of: header))
        XCTAssertTrue(engine?.ownerName(of: header).contains("not known here") == true)
        try engine?.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))
        XCTAssertNil(engine?.account(forKeyID: ownerID))
        let renewed = try XCTUnwrap(engine?.ownerKeyID(for: "alice"))
        XCTAssertNotEqual(renewed, ownerID)
        XCTAssertEqual(engine?.ownerKeyID(for: "alice@contoso.com"), renewed)
        XCTAssertEqual(engine?.account(forKeyID: renewed)?.upn, "alice@contoso.com")
    }
}
