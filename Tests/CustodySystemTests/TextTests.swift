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
    /// Names are bytes: what is not UTF-8 survives, and shows escaped.
    func testFileNamesKeepTheirBytes() {
        let latin1 = FileName(bytes: [0x63, 0x61, 0x66, 0xE9])
        XCTAssertEqual(latin1.bytes, [0x63, 0x61, 0x66, 0xE9])
        XCTAssertEqual(latin1.cString.last, 0)
        XCTAssertEqual(latin1.count, 4)
        XCTAssertNil(latin1.text)
        XCTAssertEqual(latin1.description, "caf\\xE9")
        XCTAssertEqual(FileName("café").text, "café")
        XCTAssertNotEqual(FileName("caf\u{E9}"), FileName("cafe\u{301}"), "canonically equivalent, but two names")
        XCTAssertTrue(FileName("..").isDotOrDotDot)
        XCTAssertTrue(FileName(".").isDotOrDotDot)
        XCTAssertFalse(FileName("...").isDotOrDotDot)
        XCTAssertTrue(FileName(".custody-x").hasPrefix(".custody-"))
        XCTAssertEqual(FileName("b").appended(to: FileName("/a")).bytes, Array("/a/b".utf8))
        XCTAssertEqual(FileName(bytes: [0x61, 0, 0x62]).bytes, [0x61], "a name ends at a NUL")
        XCTAssertEqual(FileName("a\u{0}b").bytes, [0x61], "a name ends at a NUL, from text too")
        XCTAssertEqual(FileName(bytes: [0x61, 0x62].lazy.map { $0 }).bytes, [0x61, 0x62], "from a sequence with no storage")
        XCTAssertEqual(FileName(bytes: []).cString, [0])
        XCTAssertEqual(FileName(terminated: [0x61, 0x62, 0]), FileName("ab"), "a C string built in place")
        XCTAssertEqual(FileName(terminated: [0x61, 0x62]).cString, [0x61, 0x62, 0], "given no NUL, it gets one")
        XCTAssertEqual(FileName(terminated: [0x61, 0, 0x62, 0]).cString, [0x61, 0], "cut at its first NUL")
        var seen: [UInt8] = []
        FileName("ab").withBytes { seen = Array($0) }
        XCTAssertEqual(seen, [0x61, 0x62], "its bytes, without the NUL")
        XCTAssertEqual(FileName(bytes: [0xF0, 0x9F, 0x8F, 0xBB, 0xFF]).description, "\u{1F3FB}\\xFF")
    }

    /// Paths are compared and split as bytes: a slash followed by a combining mark is a slash,
    /// and canonically equivalent spellings are different paths.
    func testPathsAreComparedAsBytes() {
        let marked = "/mnt/\u{301}x"
        XCTAssertFalse(marked.hasPrefix("/mnt/"), "as Characters (why the byte-wise forms exist)")
        XCTAssertTrue(marked.hasBytePrefix("/mnt/"))
        XCTAssertTrue(marked.isPath(inside: "/mnt"))
        XCTAssertTrue("/\u{1F3FB}x".isAbsolutePath)
        XCTAssertEqual(marked.pathComponents, ["mnt", "\u{301}x"])
        XCTAssertEqual(marked.droppingBytes(5), "\u{301}x")
        XCTAssertTrue("/mnt/caf\u{E9}" == "/mnt/cafe\u{301}", "as Strings")
        XCTAssertFalse("/mnt/caf\u{E9}".bytesEqual("/mnt/cafe\u{301}"))
        XCTAssertFalse("/mnt/cafe\u{301}/x".isPath(inside: "/mnt/caf\u{E9}"))
        XCTAssertTrue("/a/b".isPath(inside: "/"))
        XCTAssertTrue("/a".isPath(inside: "/a"))
        XCTAssertFalse("/ab".isPath(inside: "/a"))
        XCTAssertEqual(Syscall.split("/d/\u{301}x").directory, "/d")
        XCTAssertEqual(Syscall.split("/d/\u{301}x").name, "\u{301}x")
        let split = Syscall.split(FileName(bytes: Array("/d/caf".utf8) + [0xE9]))
        XCTAssertEqual(split.directory, FileName("/d"))
        XCTAssertEqual(split.name.bytes, Array("caf".utf8) + [0xE9])
        XCTAssertEqual(Syscall.split(FileName("/x")).directory, FileName("/"))
    }
}
