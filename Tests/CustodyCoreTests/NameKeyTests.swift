@testable import CustodyCore
import CustodyCrypto
import CustodyFormat
import XCTest

/// An identity's name key: from class C, so from the first unlock until a wipe, and the same key
/// after a restart (names written before open after).
final class NameKeyTests: EngineTestCase {
    func testTheNameKeyFollowsClassC() throws {
        let tweak = [UInt8](repeating: 7, count: NameCipher.tweakSize)
        var engine: Engine? = try makeEngine()
        try engine?.enroll(id: "alice", upn: "alice@contoso.com", passphrase: try passphrase("correct horse"))
        try engine?.enroll(id: "bob", upn: "bob@contoso.com", passphrase: try passphrase("battery staple"))
        guard let key = engine?.nameKey(for: "alice@contoso.com"), let bobs = engine?.nameKey(for: "BOB") else { return XCTFail("enrolled: held") }
        XCTAssertNotEqual(key.tag, bobs.tag)
        XCTAssertNil(engine?.nameKey(for: "me@gmail.com"), "an unmanaged identity has none")
        XCTAssertTrue(engine?.nameKeys().byTag[key.tag] === key && engine?.nameKeys().byTag[bobs.tag] === bobs)
        XCTAssertEqual(engine?.nameKeys().all.count, 2)
        let stored = try NameCipher.encrypt(Array("acquisition-plan.txt".utf8), tweak: tweak, key: key)

        try engine?.lock("alice")
        XCTAssertNotNil(engine?.nameKey(for: "alice"), "a lock keeps class C, and the names with it")

        // A restart: nothing until the first unlock, then the same key.
        engine = nil
        engine = try makeEngine()
        XCTAssertNil(engine?.nameKey(for: "alice"), "before the first unlock the names stay closed")
        try engine?.unlock("alice", passphrase: try passphrase("correct horse"))
        guard let again = engine?.nameKey(for: "alice"), case .short(let text) = stored else { return XCTFail() }
        XCTAssertEqual(again.tag, key.tag)
        XCTAssertEqual(try NameCipher.decrypt(text, tweak: tweak, key: again), Array("acquisition-plan.txt".utf8))

        try engine?.deregister("alice", wipe: true)
        XCTAssertNil(engine?.nameKey(for: "alice"), "a wipe takes the name key with the others")
        XCTAssertEqual(engine?.nameKeys().all.count, 0, "bob is not unlocked since the restart")
    }
}
