import CustodySystem
import Glibc
import XCTest

final class ErrnoTests: XCTestCase {
    struct Damage: ErrnoConvertible { var errnoValue: Errno { .ioError } }

    func testAsErrnoPassesValuesAndMapsErrors() {
        XCTAssertEqual(try asErrno { () throws(Damage) in 7 }, 7)
        XCTAssertThrowsError(try asErrno { () throws(Damage) -> Int in throw Damage() }) { error in
            XCTAssertEqual(error as? Errno, .ioError)
        }
        var seen: [Errno] = []
        XCTAssertThrowsError(try asErrno({ () throws(Errno) -> Int in throw .noSpace }, failed: { seen.append($0) })) { error in
            XCTAssertEqual(error as? Errno, .noSpace)
        }
        XCTAssertEqual(seen, [.noSpace])
        _ = try? asErrno({ () throws(Errno) in 1 }, failed: { seen.append($0) })
        XCTAssertEqual(seen, [.noSpace], "failed runs only on failure")
    }

    func testNamesAreSwiftSystemsAndTheKernels() {
        XCTAssertEqual(Errno.tooManyLinks.rawValue, EMLINK)
        XCTAssertEqual(Errno.tooManySymbolicLinkLevels.rawValue, ELOOP)
        XCTAssertEqual(Errno.tooManySymbolicLinkLevels.name, "ELOOP")
        XCTAssertEqual(Errno.resourceBusy.name, "EBUSY")
    }
}
