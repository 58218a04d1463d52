import Foundation
import Glibc
import XCTest

/// The example package a developer would write (`examples/file-provider`: the SDK guide's
/// file-provider steps, depending on `Client/` alone) builds on its own and runs to the end against
/// a real daemon and mount.
final class ClientExampleTests: XCTestCase {
    var daemon: MountedDaemon!
    var scratch: [String] = []

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
        for path in scratch { _ = try? runCommand(["rm", "-rf", path]) }
    }

    func testTheFileProviderExampleRunsAgainstARealDaemon() throws {
        // The example copies items out of the mount as root, exempt from the transfer rules.
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--transfer-exempt-uid", "0"])
        let exports = try makeTemporaryDirectory("example-exports")
        let build = try makeTemporaryDirectory("example-build")
        scratch = [exports, build]
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
        let built = try runCommand(["swift", "build", "--package-path", root + "/examples/file-provider", "--scratch-path", build,
                                    "--disable-automatic-resolution"])
        XCTAssertEqual(built.status, 0, built.output + built.error)
        let run = try runCommand([build + "/debug/file-provider-example", daemon.socket, daemon.mountPoint, exports])
        XCTAssertEqual(run.status, 0, run.output + run.error)
        XCTAssertTrue(run.output.hasSuffix("✓ the file-provider flow works\n"), run.output)
        XCTAssertEqual(run.output.components(separatedBy: "\n").filter { $0.hasPrefix("• ") }.count, 6, run.output)
        // What the example left: nothing of the account, in the mount or among the exports.
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: exports), [])
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.mnt("Q3 plan.txt")))
    }
}
