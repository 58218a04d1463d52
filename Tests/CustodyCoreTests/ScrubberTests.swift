@testable import CustodyCore
import XCTest

final class ScrubberTests: XCTestCase {
    func testUPNShapedWordsGoWhetherKnownOrNot() {
        let scrubber = Scrubber()
        let token = scrubber.token(for: "mallory@refused.example")
        XCTAssertEqual(scrubber.scrub("enrollment of Mallory@Refused.Example refused."), "enrollment of \(token) refused.",
                       "any case, one token; the sentence's dot stays")
        XCTAssertEqual(scrubber.scrub(#"{"upn":"carol@unmanaged.example","path":"/v1/accounts/bob@x.example/wipe"}"#),
                       #"{"upn":"\#(scrubber.token(for: "carol@unmanaged.example"))","path":"/v1/accounts/\#(scrubber.token(for: "bob@x.example"))/wipe"}"#)
        XCTAssertEqual(scrubber.scrub("a@ and @b and @ stay"), "a@ and @b and @ stay", "not UPNs")
    }

    func testKnownIdentitiesGoAlsoWhenTheyAreNoUPNs() {
        let scrubber = Scrubber()
        XCTAssertEqual(scrubber.scrub("registered alice-oid-7f3c"), "registered alice-oid-7f3c", "unknown and not UPN-shaped")
        scrubber.note(["alice-oid-7f3c", "Project X Team", "ab"])
        let token = scrubber.token(for: "alice-oid-7f3c")
        XCTAssertEqual(scrubber.scrub("registered ALICE-OID-7F3C (keybag alice-oid-7f3c.json)"), "registered \(token) (keybag \(token).json)")
        XCTAssertEqual(scrubber.scrub("bound to project x team now"), "bound to \(scrubber.token(for: "Project X Team")) now", "an identity with spaces")
        XCTAssertEqual(scrubber.scrub("malice-oid-7f3c is another word"), "malice-oid-7f3c is another word", "whole words only")
        XCTAssertEqual(scrubber.scrub("ab is too short to find in text"), "ab is too short to find in text")
        XCTAssertEqual(scrubber.scrubIdentity("ab"), scrubber.token(for: "ab"), "but as a whole field it goes")
    }

    func testConfiguredValuesGoInEveryModeAndIdentitiesOnlyWhenScrubbing() {
        let scrubber = Scrubber()
        scrubber.note(["alice-oid"])
        scrubber.configure(values: ["secret-project", " x "], scrubsIdentities: false)
        XCTAssertFalse(scrubber.scrubsIdentities)
        XCTAssertEqual(scrubber.scrub("alice@contoso.com alice-oid in Secret-Project"),
                       "alice@contoso.com alice-oid in \(scrubber.token(for: "secret-project"))")
        XCTAssertEqual(scrubber.scrubIdentity("alice@contoso.com"), "alice@contoso.com")
        scrubber.configure(values: [], scrubsIdentities: true)
        XCTAssertEqual(scrubber.scrub("alice-oid"), scrubber.token(for: "alice-oid"), "what was noted before stays known")
    }

    func testTokensAreStableWithinARunAndDifferAcrossRuns() {
        let one = Scrubber(), two = Scrubber()
        XCTAssertEqual(one.token(for: "alice@contoso.com"), one.token(for: "ALICE@contoso.com"))
        XCTAssertNotEqual(one.token(for: "alice@contoso.com"), two.token(for: "alice@contoso.com"), "keyed per run")
        XCTAssertTrue(one.token(for: "x").hasPrefix("[scrubbed:") && one.token(for: "x").count == 19)
    }

    func testTextThatIsNotUTF8AndLongLinesPassThrough() {
        let scrubber = Scrubber()
        let odd = String(decoding: [0x63, 0x61, 0x66, 0xE9, 0x20, 0x61, 0x40, 0x62], as: UTF8.self)
        XCTAssertFalse(scrubber.scrub(odd).contains("a@b"))
        let long = String(repeating: "word ", count: 20_000)
        XCTAssertEqual(scrubber.scrub(long), long)
    }
}
