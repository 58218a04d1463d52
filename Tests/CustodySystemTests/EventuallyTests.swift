import CustodyTestSupport
import XCTest

/// The tests' one wait: it polls until the condition holds, and fails naming what was awaited.
final class EventuallyTests: XCTestCase {
    func testItPollsAMultiStatementConditionUntilItHolds() throws {
        var calls = 0
        try eventually("the third call", interval: 0.001) {
            calls += 1
            return calls >= 3
        }
        XCTAssertEqual(calls, 3)
    }

    func testItNamesWhatDidNotHappen() {
        var calls = 0
        XCTAssertThrowsError(try eventually("the impossible", timeout: 0.05, interval: 0.01) {
            calls += 1
            return false
        }) { error in
            XCTAssertTrue("\(error)".contains("the impossible"), "\(error)")
        }
        XCTAssertGreaterThan(calls, 1)
    }

    func testAValueIsReturnedOnceThereIsOne() throws {
        var calls = 0
        let value = try eventualValue("a value", interval: 0.001) { () -> Int? in
            calls += 1
            return calls == 2 ? 42 : nil
        }
        XCTAssertEqual(value, 42)
    }
}
