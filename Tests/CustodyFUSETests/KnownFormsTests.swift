import CustodyCrypto
@testable import CustodyFUSE
import CustodyFormat
import CustodySystem
import XCTest

/// The few encrypted forms a directory keeps between a lookup and the creation that follows.
final class KnownFormsTests: XCTestCase {
    func form(_ name: String, _ key: NameKey) -> ResolvedName {
        ResolvedName(shown: FileName(name), stored: FileName("~c3" + key.tag + "." + name), longForm: nil, key: key)
    }

    func testKeepsTheLastFewAndOnePerNameAndKey() throws {
        let first = try NameKey(deriving: try SecretBytes.random(count: 32))
        let second = try NameKey(deriving: try SecretBytes.random(count: 32))
        var forms = KnownForms()
        forms.keep(form("a", first))
        forms.keep(form("a", second))
        XCTAssertEqual(forms.forms(of: FileName("a")).count, 2, "one per key")
        XCTAssertTrue(forms.form(of: FileName("a"), key: second) != nil)
        XCTAssertNil(forms.form(of: FileName("b"), key: first))
        // The same key made again (a later unlock) replaces the earlier one's form.
        let again = try NameKey(deriving: try SecretBytes.random(count: 32))
        let sameTag = ResolvedName(shown: FileName("a"), stored: FileName("~c3" + first.tag + ".other"), longForm: nil, key: again)
        forms.keep(sameTag)
        XCTAssertEqual(forms.forms(of: FileName("a")).count, 2 + (again.tag == first.tag ? 0 : 1))
        // A plain form is never kept.
        forms.keep(.plain(FileName("p")))
        XCTAssertTrue(forms.forms(of: FileName("p")).isEmpty)
        // Past its capacity the oldest go first; the newest stay.
        for index in 0..<(KnownForms.capacity * 3) { forms.keep(form("n\(index)", first)) }
        XCTAssertTrue(forms.forms(of: FileName("a")).isEmpty)
        for index in (KnownForms.capacity * 2)..<(KnownForms.capacity * 3) {
            XCTAssertEqual(forms.form(of: FileName("n\(index)"), key: first)?.stored, FileName("~c3" + first.tag + ".n\(index)"))
        }
        XCTAssertNil(forms.form(of: FileName("n\(KnownForms.capacity * 2 - 1)"), key: first))
    }
}
