import CustodyAPI
import XCTest

/// Request bodies decoded strictly: every key a document holds is one its type reads.
final class StrictJSONTests: XCTestCase {
    struct Inner: Decodable, Equatable {
        var kind: String
        var size: UInt32?
    }

    struct Outer: Decodable, Equatable {
        var name: String
        var inner: Inner?
        var items: [Inner]?
        var labels: [String: String]?
        var count: Int8?
    }

    func decode(_ text: String) throws -> Outer { try StrictJSON.decode(Outer.self, from: Array(text.utf8)) }

    func unknown(_ text: String) -> StrictJSON.UnknownKey? {
        do {
            _ = try decode(text)
            return nil
        } catch let error as StrictJSON.UnknownKey {
            return error
        } catch {
            XCTFail("\(text): \(error)")
            return nil
        }
    }

    func testKnownKeysDecodeAsJSONDecoderWould() throws {
        let text = #"{"name": "a", "inner": {"kind": "k", "size": 7}, "items": [{"kind": "x"}, {"kind": "y", "size": null}], "labels": {"any": "key"}, "count": -3}"#
        XCTAssertEqual(try decode(text), try JSONDecoder().decode(Outer.self, from: Data(text.utf8)))
        XCTAssertEqual(try decode(#"{"name": "a", "inner": null}"#).inner, nil, "null is left out")
    }

    func testUnknownKeysAreNamedWithTheirPlaceAndTheKeyTheyResemble() {
        XCTAssertEqual(unknown(#"{"name": "a", "nmae": "b"}"#), StrictJSON.UnknownKey(path: "nmae", suggestion: "name"))
        XCTAssertEqual(unknown(#"{"name": "a", "inner": {"kind": "k", "sise": 1}}"#), StrictJSON.UnknownKey(path: "inner.sise", suggestion: "size"))
        XCTAssertEqual(unknown(#"{"name": "a", "items": [{"kind": "x"}, {"kind": "y", "colour": 1}]}"#), StrictJSON.UnknownKey(path: "items[1].colour", suggestion: nil))
        XCTAssertEqual(unknown(#"{"name": "a", "extra": null}"#)?.path, "extra", "a null value of an unknown key is still unknown")
        XCTAssertEqual("\(StrictJSON.UnknownKey(path: "policy.saveToLocation", suggestion: "saveToLocations"))",
                       "unknown field policy.saveToLocation (did you mean saveToLocations?)")
        XCTAssertNil(unknown(#"{"name": "a", "labels": {"whatever": "x", "else": "y"}}"#), "a dictionary's keys are its data")
    }

    func testValuesAreCheckedAsStrictlyAsJSONDecoder() {
        for bad in [#"{"name": 5}"#, #"{"name": "a", "count": 200}"#, #"{"name": "a", "count": 1.5}"#, #"{"name": "a", "inner": {"size": -1, "kind": "k"}}"#,
                    #"{"name": "a", "inner": {"size": 1}}"#, #"[1]"#, #"{"name": "a", "items": {"kind": "x"}}"#, "{not json"] {
            XCTAssertThrowsError(try decode(bad), bad) { XCTAssertFalse($0 is StrictJSON.UnknownKey, "\(bad): \($0)") }
        }
    }

    func testSpelling() {
        XCTAssertEqual(Spelling.closest(to: "saveToLocation", in: ["openFromLocations", "saveToLocations"]), "saveToLocations")
        XCTAssertEqual(Spelling.closest(to: "MULTIIDENTITY", in: ["MultiIdentity"]), "MultiIdentity", "case does not count")
        XCTAssertNil(Spelling.closest(to: "remember", in: ["passphrase"]))
        XCTAssertNil(Spelling.closest(to: "ab", in: ["xy"]), "two edits of two letters is another word")
        XCTAssertEqual(Spelling.closest(to: "a", in: ["b", "ab"]), "ab", "the nearest, then the first in order")
    }
}
