import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Keys and plaintext never reach the disk through a core dump: the daemon crashes (a test-only
/// trigger) while a class A file is open and unlocked, with `core_pattern` and its limits set so
/// that a dump would land in the test's directory, and none appears.
final class CoreDumpTests: XCTestCase {
    var daemon: MountedDaemon?
    var savedPattern: String?
    var work: String?

    static let patternFile = "/proc/sys/kernel/core_pattern"

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
        if let savedPattern { try? savedPattern.write(toFile: Self.patternFile, atomically: false, encoding: .utf8) }
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    func dumps(in directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix("core.") }
    }

    func waitForDump(in directory: String, seconds: Double) -> [String] {
        (try? eventualValue("a core dump in \(directory)", timeout: seconds) { () -> [String]? in
            let found = dumps(in: directory)
            return found.isEmpty ? nil : found
        }) ?? []
    }

    func testACrashWhileUnlockedWritesNoCoreDump() throws {
        let directory = try makeTemporaryDirectory("custody-core")
        work = directory
        let saved = try String(contentsOfFile: Self.patternFile, encoding: .utf8)
        savedPattern = saved
        guard (try? (directory + "/core.%e.%p").write(toFile: Self.patternFile, atomically: false, encoding: .utf8)) != nil else {
            throw XCTSkip("core_pattern cannot be set here")
        }
        // The set-up can fail: a process that may dump does leave a dump here.
        _ = try runCommand(["prlimit", "--core=unlimited", "sh", "-c", "kill -SEGV $$"])
        let control = waitForDump(in: directory, seconds: 5)
        guard !control.isEmpty else { throw XCTSkip("this machine writes no core dumps at all (core_pattern \(saved))") }
        for name in control { unlink(directory + "/" + name) }

        // The daemon, started with cores allowed, an identity unlocked and its class A file open.
        let started = try MountedDaemon(extraArguments: ["--multi-identity", "--transfer-exempt-uid", "0"], wrapper: ["prlimit", "--core=unlimited"])
        daemon = started
        XCTAssertEqual(try started.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "complete"}, "passphrase": "correct horse"}"#).status, 201)
        let wrote = try started.ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", "echo TOP-SECRET-PLAINTEXT > '\(started.mnt("secret.txt"))'"])
        XCTAssertEqual(wrote.status, 0, wrote.error)
        let fd = try Syscall.open(started.mnt("secret.txt"), O_RDONLY)
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 64)
        XCTAssertGreaterThan(read(fd, &bytes, 64), 0)
        let status = readTextFile("/proc/\(started.pid)/status") ?? ""
        let locked = status.split(separator: "\n").first { $0.hasPrefix("VmLck:") }.flatMap { $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first }.flatMap { Int($0) } ?? 0
        XCTAssertGreaterThan(locked, 0, "keys and plaintext buffers are locked in memory: \(status)")
        let limits = readTextFile("/proc/\(started.pid)/limits") ?? ""
        XCTAssertTrue(limits.split(separator: "\n").contains { $0.hasPrefix("Max core file size") && $0.contains(" 0 ") }, limits)

        // Crash it.
        let pid = started.pid
        _ = try runCommand(["curl", "-s", "--max-time", "5", "--unix-socket", started.socket, "http://localhost/v1/status?custody-test-trap=daemon-abort"])
        var exitStatus: Int32 = 0
        XCTAssertTrue(waitForExit(pid, seconds: 10, status: &exitStatus), "the daemon crashed")
        started.pid = 0
        XCTAssertTrue(exitStatus & 0x7f == SIGABRT, "killed by SIGABRT: \(exitStatus)")
        XCTAssertEqual(waitForDump(in: directory, seconds: 2), [], "no core dump of the daemon")
        XCTAssertEqual(try runCommand(["grep", "-rl", "TOP-SECRET-PLAINTEXT", directory]).output, "")
    }
}
