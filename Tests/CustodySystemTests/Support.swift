import CustodyTestSupport
import XCTest

/// A test case with a temporary directory of its own for each test, removed after it.
class TemporaryDirectoryTestCase: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-system").path
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
    }
}
