import CustodyClient
import XCTest

final class ByteCountTests: XCTestCase {
    func testSizesReadAsBinaryUnitsWithOneDecimalRoundedDown() {
        XCTAssertEqual(humanBytes(0), "0 B")
        XCTAssertEqual(humanBytes(1023), "1023 B")
        XCTAssertEqual(humanBytes(1024), "1.0 KiB")
        XCTAssertEqual(humanBytes(1536), "1.5 KiB")
        XCTAssertEqual(humanBytes(1024 * 1024 - 1), "1023.9 KiB")
        XCTAssertEqual(humanBytes(20 * 1024 * 1024), "20.0 MiB")
        XCTAssertEqual(humanBytes(3 << 40), "3.0 TiB")
        // Past the largest unit the count grows in it.
        XCTAssertEqual(humanBytes(2048 << 40), "2048.0 TiB")
    }
}
