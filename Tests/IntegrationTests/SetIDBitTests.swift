import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Set-user-ID and set-group-ID bits and file capabilities go when a local file system drops
/// them: at a write, truncation or open with O_TRUNC by a process without CAP_FSETID (buffered or
/// direct), and at a chown. The daemon holds CAP_FSETID, so its own writes to the backing file
/// would keep them; the kernel leaves this to the daemon (FUSE_HANDLE_KILLPRIV_V2) and says in
/// each request when the bits must go.
final class SetIDBitTests: XCTestCase {
    var daemon: MountedDaemon?
    let nobody: uid_t = 65534

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    /// `arguments` run as nobody, with no supplementary groups.
    private func asNobody(_ arguments: [String]) -> [String] {
        ["setpriv", "--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups"] + arguments
    }

    /// Every case: a file made by nobody with `mode`, then the step (run as `who`).
    private static let cases: [(name: String, mode: String, who: String, step: String)] = [
        ("append-4755", "4755", "nobody", "echo b >> F"),
        ("append-2775", "2775", "nobody", "echo b >> F"),
        ("append-6755", "6755", "nobody", "echo b >> F"),
        ("append-2745", "2745", "nobody", "echo b >> F"),   // set-group-ID without group execution stays
        ("direct-4755", "4755", "nobody", "dd if=/dev/zero of=F bs=4096 count=1 oflag=direct conv=notrunc status=none"),
        ("direct-2775", "2775", "nobody", "dd if=/dev/zero of=F bs=4096 count=1 oflag=direct conv=notrunc status=none"),
        ("truncate-4755", "4755", "nobody", "truncate -s 1 F"),
        ("otrunc-6755", "6755", "nobody", "echo x > F"),
        ("root-append-4755", "4755", "root", "echo b >> F"),   // CAP_FSETID keeps them
        ("root-truncate-6755", "6755", "root", "truncate -s 1 F"),
        ("root-chown-4755", "4755", "root", "chown 65534:65534 F"),
        ("root-chown-2775", "2775", "root", "chown 65534:65534 F"),
        ("read-4755", "4755", "nobody", "cat F > /dev/null"),
    ]

    /// Runs every case in `directory`; the resulting modes, by case.
    private func modesAfterCases(in directory: String) throws -> [String: String] {
        var modes: [String: String] = [:]
        for item in Self.cases {
            let file = directory + "/" + item.name
            let make = try runCommand(asNobody(["sh", "-c",
                                       "head -c 4096 /dev/urandom > '\(file)' && chmod \(item.mode) '\(file)'"]))
            XCTAssertEqual(make.status, 0, "\(item.name): \(make.error)")
            let step = item.step.replacingOccurrences(of: "F", with: "'\(file)'")
            let command = item.who == "root" ? ["sh", "-c", step]
                : asNobody(["sh", "-c", step])
            let result = try runCommand(command)
            XCTAssertEqual(result.status, 0, "\(item.name): \(result.error)")
            modes[item.name] = String(try Syscall.lstat(file).st_mode & 0o7777, radix: 8)
        }
        // A new file made with O_TRUNC keeps the set-ID bits it is created with.
        let created = directory + "/create-trunc-4755"
        let create = try runCommand(asNobody(["/usr/bin/python3", "-c",
                                     "import os; os.umask(0); os.close(os.open('\(created)', os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o4755))"]))
        XCTAssertEqual(create.status, 0, create.error)
        modes["create-trunc-4755"] = String(try Syscall.lstat(created).st_mode & 0o7777, radix: 8)
        return modes
    }

    private func startDaemon(_ arguments: [String], encrypted: Bool) throws -> MountedDaemon {
        var all = ["--allow-other"] + arguments
        if encrypted { all += ["--multi-identity", "--default-identity", "\(nobody)=nobody@custody.example"] }
        let daemon = try MountedDaemon(extraArguments: all)
        self.daemon = daemon
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        if encrypted {
            let enrolled = try daemon.api("POST", "/v1/accounts",
                                          #"{"id": "nobody-oid", "upn": "nobody@custody.example", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
            XCTAssertEqual(enrolled.status, 201, enrolled.body)
        }
        return daemon
    }

    /// The same steps on a local directory and through the mount (plain and encrypted, through
    /// the request rings and through /dev/fuse) leave the same modes, seen through the mount and
    /// on the backing store.
    func testSetIDBitsGoWhereALocalFileSystemDropsThem() throws {
        let local = try makeTemporaryDirectory("custody-setid-local")
        defer { _ = try? runCommand(["rm", "-rf", local]) }
        XCTAssertEqual(chmod(local, 0o1777), 0)
        let expected = try modesAfterCases(in: local)
        // What a local file system does, spelled out (so that this test cannot pass vacuously).
        XCTAssertEqual(expected["append-4755"], "755")
        XCTAssertEqual(expected["append-2745"], "2745")
        XCTAssertEqual(expected["direct-4755"], "755")
        XCTAssertEqual(expected["root-append-4755"], "4755")
        XCTAssertEqual(expected["root-chown-4755"], "755")
        XCTAssertEqual(expected["read-4755"], "4755")
        XCTAssertEqual(expected["create-trunc-4755"], "4755")

        for (arguments, encrypted) in [([], false), (["--no-request-rings"], false), ([], true), (["--no-request-rings"], true)] {
            let what = "\(encrypted ? "encrypted" : "plain") \(arguments)"
            let daemon = try startDaemon(arguments, encrypted: encrypted)
            let seen = try modesAfterCases(in: daemon.mountPoint)
            XCTAssertEqual(seen, expected, "through the mount, \(what)")
            for name in Self.cases.map(\.name) + ["create-trunc-4755"] {
                let stored = String(try Syscall.lstat(daemon.back(name)).st_mode & 0o7777, radix: 8)
                XCTAssertEqual(stored, expected[name], "on the backing store: \(name), \(what)")
            }
            if encrypted {
                // The content stayed encrypted and readable through all of it.
                for name in ["append-4755", "direct-4755", "truncate-4755", "otrunc-6755"] {
                    XCTAssertEqual(Array(try readFile(daemon.back(name)).prefix(8)), FileHeader.magic, "\(name) is stored encrypted")
                }
                // Readable by their owner (root is another identity here).
                let read = try runCommand(asNobody(["sh", "-c",
                                           "wc -c < '\(daemon.mnt("truncate-4755"))'; cat '\(daemon.mnt("otrunc-6755"))'"]))
                XCTAssertEqual(read.output, "1\nx\n", what + read.error)
            }
            daemon.destroy()
            self.daemon = nil
        }
    }

    /// A file capability goes at a write by another process, as on a local file system.
    func testFileCapabilityGoesAtAWrite() throws {
        let daemon = try startDaemon([], encrypted: false)
        let file = daemon.mnt("tool")
        XCTAssertEqual(try runCommand(asNobody(["sh", "-c", "echo a > '\(file)'"])).status, 0)
        let set = try runCommand(["setcap", "cap_net_raw+ep", file])
        XCTAssertEqual(set.status, 0, set.error)
        XCTAssertTrue(try runCommand(["getcap", file]).output.contains("cap_net_raw"))
        let write = try runCommand(asNobody(["sh", "-c", "echo b >> '\(file)'"]))
        XCTAssertEqual(write.status, 0, write.error)
        XCTAssertEqual(try runCommand(["getcap", file]).output.trimmingCharacters(in: .whitespacesAndNewlines), "")
        XCTAssertEqual(try runCommand(["getcap", daemon.back("tool")]).output.trimmingCharacters(in: .whitespacesAndNewlines), "")
        XCTAssertEqual(try readFile(file), bytes("a\nb\n"))
    }

    /// With the daemon clearing the bits, the kernel no longer asks for security.capability
    /// before every write of a file (only the first, until its attributes change) nor for the
    /// attributes before a chown.
    func testTheKernelLeavesTheChecksToTheDaemon() throws {
        for arguments in [[], ["--no-request-rings"]] {
            let daemon = try startDaemon(arguments, encrypted: false)
            // The mount point's attributes, fresh for a second: the walk to the file asks nothing.
            _ = try Syscall.lstat(daemon.mountPoint)
            let before = MetricsTests.parse(try daemon.api("GET", "/v1/metrics").body)
            _ = try Syscall.lstat(daemon.mountPoint)
            let fd = open(daemon.mnt("f"), O_WRONLY | O_CREAT | O_EXCL, 0o644)
            XCTAssertGreaterThanOrEqual(fd, 0)
            for _ in 0..<5 { XCTAssertEqual(write(fd, "0123456789", 10), 10) }
            XCTAssertEqual(fchown(fd, 0, 0), 0)
            close(fd)
            let after = MetricsTests.parse(try daemon.api("GET", "/v1/metrics").body)
            func delta(_ op: String) -> Double {
                let series = #"custody_fuse_requests_total{op=""# + op + #""}"#
                return (after[series] ?? 0) - (before[series] ?? 0)
            }
            XCTAssertEqual(delta("getxattr"), 2, "one before the first write, one at the chown (\(arguments))")
            XCTAssertEqual(delta("getattr"), 0, "no attributes fetched before the chown (\(arguments))")
            XCTAssertEqual(try readFile(daemon.mnt("f")), Array(repeating: bytes("0123456789"), count: 5).flatMap { $0 })
            daemon.destroy()
            self.daemon = nil
        }
    }
}
