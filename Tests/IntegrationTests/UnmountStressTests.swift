import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// Ending a mount in the middle of work: a mixed workload runs from both CPUs (creates, writes,
/// fsyncs, reads, listings, removals) and the mount is ended by `fusermount3 -u`, SIGTERM and
/// SIGINT in turn. Every time the daemon exits with status 0, the mount is gone, and every file
/// the workload saw fsync'd holds exactly what was written. Rounds: `CUSTODY_STRESS_ROUNDS`
/// (default 200); every fourth round writes encrypted files, read back through a second mount.
final class UnmountStressTests: XCTestCase {
    var daemon: MountedDaemon?
    var workers: [pid_t] = []

    override func tearDown() {
        for worker in workers { kill(worker, SIGKILL); _ = waitForExit(worker, seconds: 5) }
        workers = []
        daemon?.destroy()
        daemon = nil
    }

    static var rounds: Int {
        ProcessInfo.processInfo.environment["CUSTODY_STRESS_ROUNDS"].flatMap { Int($0) } ?? 200
    }

    /// One CPU's share of the workload. Each file it fsyncs successfully goes into the journal
    /// (outside the mount) with its SHA-256, each removal too; an OSError means the mount went
    /// (exit 0); a read that differs from what was written exits 2.
    static let workload = #"""
    import hashlib, os, random, sys
    mount, journal_path, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.sched_setaffinity(0, {cpu})
    rng = random.Random(cpu * 7919 + os.getpid())
    directory = os.path.join(mount, f"cpu{cpu}")
    journal = open(journal_path, "a", buffering=1)
    kept = []
    try:
        os.makedirs(directory, exist_ok=True)
        i = 0
        while True:
            i += 1
            name = os.path.join(directory, f"f{i}")
            # Small files, and ones whose write-back arrives as large WRITEs (handed to workers).
            data = rng.randbytes(rng.choice([1, 700, 4096, 70000, 300000]))
            fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if i % 2 == 0:
                os.fsync(fd)
                journal.write(f"+ {name} {hashlib.sha256(data).hexdigest()}\n")
            os.close(fd)
            with open(name, "rb") as f:
                if f.read() != data:
                    print(f"{name}: read back differs", file=sys.stderr)
                    sys.exit(2)
            os.listdir(directory)
            kept.append(name)
            if len(kept) > 20:
                victim = kept.pop(rng.randrange(len(kept)))
                # Until the answer comes, the removal may or may not have happened.
                journal.write(f"? {victim}\n")
                os.unlink(victim)
                journal.write(f"- {victim}\n")
    except OSError:
        sys.exit(0)
    """#

    /// The files fsync'd and not removed afterwards, by path in the mount, with their SHA-256 and
    /// whether they must still be there (false: a removal was asked for and its answer never came,
    /// the mount went first, so the file may be there or not).
    static func synced(journal: String) -> [String: (digest: String, certain: Bool)] {
        var files: [String: (digest: String, certain: Bool)] = [:]
        let text = (try? String(contentsOfFile: journal, encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            if fields.count == 3, fields[0] == "+" { files[String(fields[1])] = (String(fields[2]), true) }
            if fields.count == 2, fields[0] == "?" { files[String(fields[1])]?.certain = false }
            if fields.count == 2, fields[0] == "-" { files[String(fields[1])] = nil }
        }
        return files
    }

    /// SHA-256 of each file that exists, by path (one `sha256sum` for all of them).
    static func sha256(_ paths: [String]) throws -> [String: String] {
        let existing = paths.filter { FileManager.default.fileExists(atPath: $0) }
        guard !existing.isEmpty else { return [:] }
        let result = try runCommand(["sha256sum"] + existing)
        XCTAssertEqual(result.error, "", "every file reads")
        var digests: [String: String] = [:]
        for line in result.output.split(separator: "\n") {
            let digest = line.prefix(while: { $0 != " " })
            digests[String(line.dropFirst(digest.count + 2))] = String(digest)
        }
        return digests
    }

    func testUnmountInTheMiddleOfWorkFromBothCPUs() throws {
        let ways = ["fusermount3", "SIGTERM", "SIGINT"]
        var lazy = 0, ended = 0
        for round in 0..<Self.rounds {
            let encrypted = round % 4 == 3
            let way = ways[round % ways.count]
            let arguments = encrypted ? ["--default-identity", "0=alice@contoso.com"] : []
            let daemon = try MountedDaemon(extraArguments: arguments)
            self.daemon = daemon
            if encrypted {
                let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com"}"#)
                XCTAssertEqual(enrolled.status, 201, enrolled.body)
            }
            let script = daemon.root + "/workload.py"
            try Self.workload.write(toFile: script, atomically: true, encoding: .utf8)
            var journals: [String] = []
            for cpu in 0..<min(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))) {
                let journal = daemon.root + "/journal\(cpu)"
                journals.append(journal)
                workers.append(try spawn("python3", [script, daemon.mountPoint, journal, "\(cpu)"], stderrPath: daemon.root + "/workload\(cpu).err"))
            }
            // In the middle: once each CPU has fsync'd a few files, and a little later.
            _ = try? eventually("three fsyncs per CPU", timeout: 20, interval: 0.005) { journals.allSatisfy({ Self.synced(journal: $0).count >= 3 }) }
            usleep(UInt32.random(in: 0...100_000))

            switch way {
            case "SIGTERM": kill(daemon.pid, SIGTERM)
            case "SIGINT": kill(daemon.pid, SIGINT)
            default:
                // A file held open at that moment makes a plain unmount busy: then lazily.
                if try runCommand(["fusermount3", "-u", daemon.mountPoint]).status != 0 {
                    lazy += 1
                    try mustRun(["fusermount3", "-u", "-z", daemon.mountPoint])
                }
            }
            var status: Int32 = 0
            let exited = waitForExit(daemon.pid, seconds: 30, status: &status)
            XCTAssertTrue(exited, "round \(round) (\(way)): the daemon exits; log: \(daemon.log)")
            guard exited else { break }
            daemon.pid = 0
            XCTAssertEqual(status, 0, "round \(round) (\(way)): custodyd \(describeExit(status)); log: \(daemon.log)")
            XCTAssertFalse(daemon.isMounted, "round \(round) (\(way)): the mount is gone")
            for worker in workers {
                var workerStatus: Int32 = 0
                if !waitForExit(worker, seconds: 10, status: &workerStatus) {
                    kill(worker, SIGKILL)
                    _ = waitForExit(worker, seconds: 5)
                    XCTFail("round \(round) (\(way)): a workload process still runs after the mount went")
                } else {
                    XCTAssertEqual(workerStatus, 0, "round \(round) (\(way)): what the workload read back: \(describeExit(workerStatus))")
                }
            }
            workers = []

            // Every byte fsync'd before the end is there.
            let files = journals.reduce(into: [String: (digest: String, certain: Bool)]()) { $0.merge(Self.synced(journal: $1)) { $1 } }
            XCTAssertGreaterThanOrEqual(files.count, 6, "round \(round): the workload ran")
            if encrypted {
                try daemon.start(extraArguments: arguments)
                let certain = files.first { $0.value.certain }?.key ?? ""
                XCTAssertEqual(xattr(certain, "user.custody.encrypted"), "1", "round \(round): encrypted files")
            }
            let stored = Dictionary(uniqueKeysWithValues: files.keys.map { path in
                (path, encrypted ? path : daemon.backing + path.dropFirst(daemon.mountPoint.count))
            })
            let digests = try Self.sha256(Array(stored.values))
            for (path, file) in files {
                let digest = stored[path].flatMap { digests[$0] }
                if digest == nil, !file.certain { continue }   // removed, though its answer never came
                XCTAssertEqual(digest, file.digest, "round \(round) (\(way)): \(path) holds what was fsync'd")
            }
            daemon.destroy()
            self.daemon = nil
            ended += 1
            if testRun?.failureCount ?? 0 > 0 { break }
        }
        print("unmount stress: \(ended) of \(Self.rounds) rounds, \(lazy) of the fusermount3 unmounts lazy (a file was open)")
    }
}
