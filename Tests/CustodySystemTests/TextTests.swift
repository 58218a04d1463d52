import CustodySystem
import XCTest

final class TextTests: XCTestCase {
    /// Identities in every spelling fold as `trimmingWhitespace().lowercased()` says, whether the
    /// fast path (printable ASCII without capitals) or the full one answers.
    func testFoldedIdentityIsTrimmedLowercase() {
        let spellings = [
            "alice@contoso.com", "Alice@Contoso.COM", "  bob@x ", "\tcarol@x\n", "oid-1234-ABCD",
            "dave@x\u{7F}", "Ärger@Beispiel.de", "émile@x", "\u{00A0}nbsp@x\u{00A0}", "\u{2003}em@x",
            "a b", "Z", "", " ", "ß@x", "İstanbul@x",
        ]
        for spelling in spellings {
            XCTAssertEqual(spelling.foldedIdentity(), spelling.trimmingWhitespace().lowercased(), spelling.debugDescription)
        }
        XCTAssertEqual("Alice@Contoso.COM".foldedIdentity(), "alice@contoso.com")
        XCTAssertEqual("  bob@x ".foldedIdentity(), "bob@x")
    }

    func testTrimmingWhitespace() {
        XCTAssertEqual("a b".trimmingWhitespace(), "a b")
        XCTAssertEqual("  a b\t\n".trimmingWhitespace(), "a b")
        XCTAssertEqual("\u{00A0}é\u{2003}".trimmingWhitespace(), "é")
        XCTAssertEqual("x\u{85}".trimmingWhitespace(), "x")
        XCTAssertEqual("\u{7F}x".trimmingWhitespace(), "\u{7F}x", "DEL is not whitespace")
        XCTAssertEqual("   ".trimmingWhitespace(), "")
        XCTAssertEqual("".trimmingWhitespace(), "")
    }
}
