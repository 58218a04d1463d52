import Glibc
import XCTest

/// A test case with a temporary directory of its own for each test, removed after it.
class TemporaryDirectoryTestCase: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        var template = Array("/tmp/custody-system.XXXXXX".utf8CString)
        directory = String(cString: try XCTUnwrap(mkdtemp(&template)))
    }

    override func tearDown() {
        _ = system("rm -rf '\(directory)'")
    }
}
