@testable import CustodyFUSE
import CustodyFormat
import CustodySystem
import CustodyTestSupport
import Glibc
import XCTest

/// Which extended attributes a store keeps Custody's records in (`BackingStore.attributes`):
/// decided once, marked on the store's root, and held to afterwards.
final class StoreAttributesTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-store-attributes").path
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
    }

    private func marker(_ namespace: StoreAttributes.Namespace) -> Bool {
        (try? Syscall.getxattr(directory, StoreAttributes(namespace).namespaceMarker, nil, 0)) != nil
    }

    private func refusal(_ wanted: StoreAttributes.Namespace?) -> String? {
        do {
            _ = try BackingStore.attributes(of: directory, wanted: wanted)
            return nil
        } catch {
            return error.description
        }
    }

    func testAStoreThatKeepsTrustedAttributesUsesThemAndKeepsToThem() throws {
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: nil), .trusted)
        XCTAssertTrue(marker(.trusted))
        XCTAssertFalse(marker(.user))
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: nil), .trusted)
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: .trusted), .trusted)
        let refused = try XCTUnwrap(refusal(.user))
        XCTAssertTrue(refused.contains("its records are in trusted.* attributes"), refused)
        XCTAssertFalse(marker(.user), "nothing written for a refused mount")
    }

    func testUserAttributesWhenAskedAndFromThenOnByTheMarker() throws {
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: .user), .user)
        XCTAssertTrue(marker(.user))
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: nil), .user, "the marker decides when nothing is asked")
        XCTAssertNotNil(refusal(.trusted))
        // Both markers: refused whatever is asked.
        try Array("1".utf8).withBytes { (bytes) throws(Errno) in
            try Syscall.setxattr(directory, StoreAttributes.trusted.namespaceMarker, bytes.baseAddress, bytes.count, 0)
        }
        for wanted in [nil, StoreAttributes.Namespace.user] {
            XCTAssertTrue(refusal(wanted)?.contains("both") == true)
        }
    }

    func testRecordsOfAnEarlierMountInTrustedAttributesAreNotLeftBehind() throws {
        // A store mounted before namespaces were marked: its root holds trusted records only.
        try Array("v3:".utf8).withBytes { (bytes) throws(Errno) in
            try Syscall.setxattr(directory, StoreAttributes.trusted.upgraded, bytes.baseAddress, bytes.count, 0)
        }
        let refused = try XCTUnwrap(refusal(.user))
        XCTAssertTrue(refused.contains("trusted.* records of an earlier mount"), refused)
        XCTAssertFalse(marker(.user))
        XCTAssertEqual(try BackingStore.attributes(of: directory, wanted: nil), .trusted)
    }

    func testTheNamesOfEachNamespace() {
        XCTAssertEqual(StoreAttributes.trusted.owner, OwnerRecord.attributeName)
        XCTAssertEqual(StoreAttributes.trusted.directoryTweak, DirectoryTweak.attributeName)
        XCTAssertEqual(StoreAttributes.trusted.holes, "trusted.custody.holes")
        XCTAssertEqual(StoreAttributes.user.owner, "user.custody.store.owner")
        for names in [StoreAttributes.trusted, .user] {
            for name in [names.owner, names.holes, names.directoryTweak, names.longName, names.upgraded, names.namespaceMarker] {
                XCTAssertTrue(name.hasPrefix(names.prefix), name)
            }
        }
    }
}
