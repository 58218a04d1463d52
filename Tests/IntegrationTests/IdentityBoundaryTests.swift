import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// The identity boundary at run time (docs/identity.md, "Transfers"): every row of the table is
/// a real process, started with `custodyctl run --identity` or by a user made with `useradd`,
/// opening files in a real mount.
final class IdentityBoundaryTests: XCTestCase {
    var daemon: MountedDaemon!
    var work: String!
    var children: [pid_t] = []

    static let alice = "alice@contoso.com"
    static let carol = "carol@fabrikam.com"
    static let personal = "me@gmail.com"

    override func tearDown() {
        for child in children { kill(child, SIGKILL); waitForExit(child, seconds: 5) }
        daemon?.destroy()
        daemon = nil
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    func start(_ extra: [String] = []) throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--allow-other", "--socket-mode", "0666"] + extra)
        work = try makeTemporaryDirectory("custody-boundary")
        XCTAssertEqual(chmod(work, 0o755), 0)
        try daemon.openToOtherUsers()
        XCTAssertEqual(chmod(daemon.mountPoint, 0o1777), 0)
        for (id, upn) in [("alice-oid", Self.alice), ("carol-oid", Self.carol)] {
            let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "\#(id)", "upn": "\#(upn)", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
            XCTAssertEqual(enrolled.status, 201, enrolled.body)
        }
    }

    func setPolicy(_ identity: String, _ fields: String) throws {
        let response = try daemon.api("PUT", "/v1/accounts/\(identity)/policy", #"{"protectionLevel": "untilFirstAuth", \#(fields)}"#)
        XCTAssertEqual(response.status, 200, response.body)
    }

    /// Runs `script` with `sh -c` in the mount as `identity` (nil: no identity, as root).
    func run(as identity: String?, _ script: String) throws -> CommandResult {
        var command = ["sh", "-c", "cd '\(daemon.mountPoint)' && \(script)"]
        if let identity { command = ["run", "--identity", identity, "--"] + command } else { return try runCommand(command) }
        return try daemon.ctl(command)
    }

    /// Writes `text` into `name` as `identity` and checks the owner.
    func write(_ name: String, _ text: String, as identity: String) throws {
        let result = try run(as: identity, "printf '%s' '\(text)' > '\(name)'")
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(xattr(daemon.mnt(name), "user.custody.owner"), identity)
    }

    /// Whether `identity` can read `name`: its content, or the shell's error.
    func read(_ name: String, as identity: String?) throws -> (ok: Bool, text: String) {
        let result = try run(as: identity, "cat '\(name)'")
        return (result.status == 0, result.status == 0 ? result.output : result.error)
    }

    func blockedEvents() throws -> [[String: Any]] {
        let body = try daemon.api("GET", "/v1/events?follow=false").body
        return body.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any]
        }.filter { $0["kind"] as? String == "transferBlocked" }
    }

    // MARK: The issue's walk-through

    func testTheDefaultPolicyKeepsCorporateDataFromOtherIdentities() throws {
        try start()
        try write("corp.txt", "CORP", as: Self.alice)
        XCTAssertEqual(try read("corp.txt", as: Self.alice).text, "CORP", "the owner reads its own data")

        let copy = try run(as: Self.personal, "cp corp.txt mine.txt")
        XCTAssertNotEqual(copy.status, 0, "a personal identity may not copy corporate data")
        XCTAssertTrue(copy.error.contains("Permission denied"), copy.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.mnt("mine.txt")), "nothing was created")
        let out = work + "/out.txt"
        let outside = try run(as: Self.personal, "cp corp.txt '\(out)'")
        XCTAssertNotEqual(outside.status, 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: out), "no plaintext outside the mount")

        // Names and attributes stay visible; only content is guarded.
        let listing = try run(as: Self.personal, "ls -l corp.txt && stat -c %s corp.txt")
        XCTAssertEqual(listing.status, 0, listing.error)
        XCTAssertTrue(listing.output.hasSuffix("4\n"), listing.output)

        // Each refusal is an event naming who tried and whose data it was.
        let events = try blockedEvents()
        XCTAssertGreaterThanOrEqual(events.count, 2)
        let details = try XCTUnwrap(events.first?["details"] as? [String: String])
        XCTAssertEqual(details["from"], Self.alice)
        XCTAssertEqual(details["to"], Self.personal)
        XCTAssertEqual(details["operation"], "read")
        XCTAssertEqual(details["path"], "corp.txt")
        XCTAssertEqual(details["code"], "312")
        XCTAssertEqual(details["executable"], "/usr/bin/cp")
        XCTAssertNotNil(details["pid"].flatMap { Int32($0) })
        XCTAssertEqual(events.first?["identity"] as? String, Self.alice)
    }

    // MARK: Reads: reader identity × the owner's sendToOtherIdentities

    func testReadsFollowTheOwnersSendScope() throws {
        try start()
        try write("corp.txt", "CORP", as: Self.alice)
        // reader → allowed, for none / managed / all
        let rows: [(scope: String, reader: String?, allowed: Bool)] = [
            ("none", Self.alice, true), ("none", Self.carol, false), ("none", Self.personal, false), ("none", nil, false),
            ("managed", Self.alice, true), ("managed", Self.carol, true), ("managed", Self.personal, false), ("managed", nil, false),
            ("all", Self.alice, true), ("all", Self.carol, true), ("all", Self.personal, true), ("all", nil, true),
        ]
        for row in rows {
            try setPolicy(Self.alice, #""sendToOtherIdentities": "\#(row.scope)""#)
            let result = try read("corp.txt", as: row.reader)
            XCTAssertEqual(result.ok, row.allowed, "send \(row.scope), reader \(row.reader ?? "none"): \(result.text)")
            if row.allowed { XCTAssertEqual(result.text, "CORP") } else { XCTAssertTrue(result.text.contains("Permission denied"), result.text) }
            // The control API's answer agrees with the mount's.
            let asked = try daemon.api("POST", "/v1/files/can-receive", #"{"path": "\#(daemon.mnt("corp.txt"))", "identity": "\#(row.reader ?? "")"}"#)
            if let reader = row.reader {
                XCTAssertEqual(asked.status, 200, asked.body)
                XCTAssertTrue(asked.body.contains(#""allowed":\#(row.allowed)"#), "can-receive for \(reader) under \(row.scope): \(asked.body)")
            }
        }
        // The older boolean maps onto the scope.
        try setPolicy(Self.alice, #""canShareWithOtherIdentities": false"#)
        XCTAssertFalse(try read("corp.txt", as: Self.personal).ok)
        try setPolicy(Self.alice, #""canShareWithOtherIdentities": true"#)
        XCTAssertTrue(try read("corp.txt", as: Self.personal).ok)
    }

    func testARefusedOpenGetsNothingThatAnAllowedReaderCached() throws {
        try start()
        try write("cached.txt", String(repeating: "secret ", count: 2000), as: Self.alice)
        // Alice reads it: its pages are in the page cache (keep_cache).
        XCTAssertTrue(try read("cached.txt", as: Self.alice).ok)
        let mapped = try run(as: Self.personal, "python3 -c 'import mmap,sys; f=open(\"cached.txt\",\"rb\"); print(mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ)[:6])'")
        XCTAssertNotEqual(mapped.status, 0, "no mapping either: the open fails first")
        XCTAssertFalse(mapped.output.contains("secret"), mapped.output)
        let dd = try run(as: Self.personal, "dd if=cached.txt bs=4096 count=1 status=none")
        XCTAssertNotEqual(dd.status, 0)
        XCTAssertEqual(dd.output, "")
    }

    func testAPolicyChangeFailsTheNextReadOfAnOpenHandle() throws {
        try start()
        try setPolicy(Self.alice, #""sendToOtherIdentities": "all""#)
        try write("shared.txt", String(repeating: "x", count: 10000), as: Self.alice)
        let text = try withOpenHandle(as: Self.personal, open: #"os.open("shared.txt", os.O_RDONLY)"#, use: "len(os.pread(fd, 100, 0))") {
            // Alice reads the same file meanwhile: her pages must not serve the other handle later.
            XCTAssertTrue(try read("shared.txt", as: Self.alice).ok)
            try setPolicy(Self.alice, #""sendToOtherIdentities": "none""#)
        }
        XCTAssertTrue(text.contains("first 100"), text)
        XCTAssertTrue(text.contains("second errno 13"), "the open handle's next read fails: \(text)")
    }

    func testAPolicyChangeFailsTheNextWriteOfAnOpenHandle() throws {
        try start()
        try write("inbox.txt", "A", as: Self.alice)
        let text = try withOpenHandle(as: Self.personal, open: #"os.open("inbox.txt", os.O_WRONLY | os.O_APPEND)"#, use: #"os.write(fd, b"1")"#) {
            try setPolicy(Self.alice, #""receiveFromOtherIdentities": "managed""#)
        }
        XCTAssertTrue(text.contains("first 1"), text)
        XCTAssertTrue(text.contains("second errno 13"), "the open handle's next write fails: \(text)")
        XCTAssertEqual(try read("inbox.txt", as: Self.alice).text, "A1")
    }

    /// Runs a Python process as `identity` in the mount that opens a file (`open`, the
    /// descriptor is `fd`) and uses it (`use`) once, runs `meanwhile`, and uses the same handle
    /// again; returns its report ("first …", then "second …" or "second errno N").
    func withOpenHandle(as identity: String, open: String, use: String, meanwhile: () throws -> Void) throws -> String {
        let gate = work + "/gate", ready = work + "/ready", out = work + "/handle.out"
        try """
            import os, time
            fd = \(open)
            print("first", \(use), flush=True)
            open("\(ready)", "w").close()
            while not os.path.exists("\(gate)"): time.sleep(0.02)
            try:
                print("second", \(use), flush=True)
            except OSError as e:
                print("second errno", e.errno, flush=True)
            """.write(toFile: work + "/handle.py", atomically: true, encoding: .utf8)
        let process = try spawn(MountedDaemon.tool("custodyctl"), ["run", "--socket", daemon.socket, "--identity", identity, "--",
                                                                   "sh", "-c", "cd '\(daemon.mountPoint)' && exec /usr/bin/python3 '\(work!)/handle.py' > '\(out)' 2>&1"])
        children.append(process)
        _ = try? eventually("the child to be ready") { access(ready, F_OK) == 0 }
        try meanwhile()
        XCTAssertTrue(FileManager.default.createFile(atPath: gate, contents: nil))
        XCTAssertTrue(waitForExit(process, seconds: 10))
        children.removeAll { $0 == process }
        return try String(contentsOfFile: out, encoding: .utf8)
    }

    // MARK: Exceptions

    func testExemptExecutablesAndUidsReadAcrossIdentities() throws {
        let uid = try testUser()
        try start(["--transfer-exempt-executable", "/usr/bin/sha256sum", "--transfer-exempt-uid", "\(uid)"])
        try write("corp.txt", "CORP", as: Self.alice)
        XCTAssertEqual(chmod(daemon.mnt("corp.txt"), 0o644), 0)
        let summed = try run(as: Self.personal, "sha256sum corp.txt")
        XCTAssertEqual(summed.status, 0, "an exempt program reads: \(summed.error)")
        XCTAssertTrue(summed.output.hasPrefix(try mustRun(["sh", "-c", "printf CORP | sha256sum | cut -c1-64"]).trimmingCharacters(in: .whitespacesAndNewlines)))
        XCTAssertFalse(try read("corp.txt", as: Self.personal).ok, "another program of the same identity does not")
        // A user in TransferExemptUids, with no identity of its own.
        let user = try runCommand(["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "cat", daemon.mnt("corp.txt")])
        XCTAssertEqual(user.status, 0, user.error)
        XCTAssertEqual(user.output, "CORP")
        // Root is not exempt unless configured.
        XCTAssertFalse(try read("corp.txt", as: nil).ok)
        // Per policy: exempt executables of the owner's policy.
        try setPolicy(Self.alice, #""transferExemptExecutables": ["/usr/bin/cat"]"#)
        XCTAssertTrue(try read("corp.txt", as: nil).ok, "the owner's policy exempts cat")
    }

    /// A user whose reads of alice's file are refused tries every way of passing for the exempt
    /// program (docs/identity.md, "What an exemption trusts"): none reads a byte of it. The
    /// genuine program, run the ordinary way, is exempt.
    func testAFakedExemptProgramReadsNothing() throws {
        let uid = try testUser()
        // A program only root controls: a copy of md5sum in a directory of root's, and a script.
        let programs = try makeTemporaryDirectory("custody-exempt")
        defer { _ = try? runCommand(["rm", "-rf", programs]) }
        XCTAssertEqual(chmod(programs, 0o755), 0)
        let agent = programs + "/agent", script = programs + "/indexer"
        try mustRun(["cp", "/usr/bin/md5sum", agent])
        try "#!/bin/sh\nexec cat \"$@\"\n".write(toFile: script, atomically: true, encoding: .utf8)
        XCTAssertEqual(chmod(script, 0o755), 0)
        try start(["--transfer-exempt-executable", agent, "--transfer-exempt-executable", script])
        XCTAssertTrue(daemon.log.contains("\(script) is a script"), daemon.log)
        try write("corp.txt", "CORP-SECRET", as: Self.alice)
        XCTAssertEqual(chmod(daemon.mnt("corp.txt"), 0o644), 0)
        // The user's own directory, with the tools of the attempts.
        let home = work + "/home"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        XCTAssertEqual(chown(home, uid, uid), 0)
        try """
            #include <fcntl.h>
            #include <stdio.h>
            #include <unistd.h>
            /* Runs before main in whatever program it is preloaded into: prints the file. */
            __attribute__((constructor)) static void leak(void) {
                char buffer[256];
                int fd = open("\(daemon.mnt("corp.txt"))", O_RDONLY);
                ssize_t n = fd < 0 ? -1 : read(fd, buffer, sizeof buffer);
                if (n > 0) write(1, buffer, (size_t)n);
            }
            """.write(toFile: home + "/leak.c", atomically: true, encoding: .utf8)
        try mustRun(["cc", "-shared", "-fPIC", "-o", home + "/leak.so", home + "/leak.c"])
        // A hard link to the agent (a user cannot make one: fs.protected_hardlinks; root makes it).
        XCTAssertEqual(link(agent, home + "/agent-link"), 0)
        for file in ["leak.so", "leak.c"] { XCTAssertEqual(chown(home + "/" + file, uid, uid), 0) }
        let file = daemon.mnt("corp.txt")
        func asUser(_ script: String) throws -> CommandResult {
            try runCommand(["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "sh", "-c", "cd '\(home)' && \(script)"])
        }

        let genuine = try asUser("'\(agent)' '\(file)'")
        XCTAssertEqual(genuine.status, 0, "the genuine program is exempt: \(genuine.error)")
        XCTAssertTrue(genuine.output.hasPrefix(try mustRun(["sh", "-c", "printf CORP-SECRET | md5sum | cut -c1-32"]).trimmingCharacters(in: .whitespacesAndNewlines)))
        XCTAssertFalse(try asUser("cat '\(file)'").status == 0, "the user reads nothing otherwise")

        let attempts: [(String, String)] = [
            ("cat bind-mounted over the agent in a namespace of the user's own",
             "unshare -rm sh -c \"mount --bind /bin/cat '\(agent)' && '\(agent)' '\(file)'\""),
            ("the agent run in a namespace of the user's own", "unshare -rm '\(agent)' '\(file)'"),
            ("a copy of the agent", "cp '\(agent)' ./copy && ./copy '\(file)'"),
            ("a hard link to the agent", "./agent-link '\(file)'"),
            ("the agent run by the dynamic loader", "/lib64/ld-linux-x86-64.so.2 '\(agent)' '\(file)'"),
            ("an exempt script (its interpreter runs)", "'\(script)' '\(file)'"),
            ("an interpreter running the script", "sh '\(script)' '\(file)'"),
            ("a library preloaded into the agent", "LD_PRELOAD=./leak.so '\(agent)' '\(file)'"),
            ("a library found first on LD_LIBRARY_PATH", "mkdir -p lib && cp leak.so lib/libleak.so && LD_PRELOAD=libleak.so LD_LIBRARY_PATH=./lib '\(agent)' '\(file)'"),
        ]
        for (what, command) in attempts {
            let result = try asUser(command)
            XCTAssertFalse(result.output.contains("CORP-SECRET") || result.error.contains("CORP-SECRET"), "\(what): the plaintext leaked")
            XCTAssertTrue(result.error.contains("Permission denied"), "\(what): refused (\(result.status)): \(result.output) \(result.error)")
            XCTAssertFalse(result.output.hasPrefix(String(genuine.output.prefix(32))), "\(what): read as the agent")
        }
        // The refusals say why the process was not taken for the agent.
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains("namespace of its own"), events)
        XCTAssertTrue(events.contains("under another name"), events)
        XCTAssertTrue(events.contains("preloaded library"), events)
    }

    // MARK: Writes and new owners: the receiver's receiveFromOtherIdentities

    func testWritesIntoAManagedFileFollowTheReceiversScope() throws {
        try start()
        try write("inbox.txt", "A", as: Self.alice)
        try setPolicy(Self.carol, #""sendToOtherIdentities": "all""#)
        let rows: [(scope: String, writer: String?, allowed: Bool)] = [
            ("all", Self.personal, true), ("all", nil, true), ("all", Self.carol, true),
            ("managed", Self.personal, false), ("managed", nil, false), ("managed", Self.carol, true),
            ("none", Self.personal, false), ("none", Self.carol, false), ("none", Self.alice, true),
        ]
        // A file of each writer's, for asking can-receive the same question the write asks.
        for (index, writer) in [Self.personal, Self.carol].enumerated() { try write("from\(index).txt", "w", as: writer) }
        let fromNone = try run(as: nil, "printf w > from-none.txt")
        XCTAssertEqual(fromNone.status, 0, fromNone.error)
        let sample = [Self.personal: "from0.txt", Self.carol: "from1.txt"]
        for row in rows {
            try setPolicy(Self.alice, #""receiveFromOtherIdentities": "\#(row.scope)""#)
            let result = try run(as: row.writer, "printf x >> inbox.txt")
            XCTAssertEqual(result.status == 0, row.allowed, "receive \(row.scope), writer \(row.writer ?? "none"): \(result.error)")
            if !row.allowed { XCTAssertTrue(result.error.contains("Permission denied"), result.error) }
            guard row.writer != Self.alice else { continue }
            let file = row.writer.flatMap { sample[$0] } ?? "from-none.txt"
            let asked = try daemon.api("POST", "/v1/files/can-receive", #"{"path": "\#(daemon.mnt(file))", "identity": "\#(Self.alice)"}"#)
            XCTAssertTrue(asked.body.contains(#""allowed":\#(row.allowed)"#), "can-receive agrees with the write under \(row.scope) from \(row.writer ?? "none"): \(asked.body)")
        }
        XCTAssertEqual(xattr(daemon.mnt("inbox.txt"), "user.custody.owner"), Self.alice, "appending does not change the owner")
        let events = try blockedEvents().compactMap { $0["details"] as? [String: String] }
        XCTAssertTrue(events.contains { $0["operation"] == "write" && $0["code"] == "313" }, "\(events)")

        // A sender's own policy applies to writes too: Carol's data goes nowhere under "none".
        try setPolicy(Self.alice, #""receiveFromOtherIdentities": "all""#)
        try setPolicy(Self.carol, #""sendToOtherIdentities": "none""#)
        XCTAssertNotEqual(try run(as: Self.carol, "printf y >> inbox.txt").status, 0)
    }

    func testNoIdentityCreatingInAManagedDirectoryNeedsTheOwnersConsent() throws {
        try start()
        let made = try run(as: Self.alice, "mkdir corp")
        XCTAssertEqual(made.status, 0, made.error)
        let owned = try daemon.api("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("corp"))", "identity": "\#(Self.alice)"}"#)
        XCTAssertEqual(owned.status, 200, owned.body)
        XCTAssertEqual(try run(as: nil, "echo one > corp/personal.txt").status, 0, "receive all: the new file becomes Alice's")
        XCTAssertEqual(xattr(daemon.mnt("corp/personal.txt"), "user.custody.owner"), Self.alice)
        try setPolicy(Self.alice, #""receiveFromOtherIdentities": "managed""#)
        let refused = try run(as: nil, "echo two > corp/other.txt")
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.mnt("corp/other.txt")))
    }

    func testCanReceiveAgreesWithTheMountForNewOwners() throws {
        try start()
        try write("personal.txt", "P", as: Self.personal)
        try write("corp.txt", "C", as: Self.alice)
        for scope in ["all", "managed", "none"] {
            try setPolicy(Self.alice, #""receiveFromOtherIdentities": "\#(scope)""#)
            let asked = try daemon.api("POST", "/v1/files/can-receive", #"{"path": "\#(daemon.mnt("personal.txt"))", "identity": "\#(Self.alice)"}"#)
            let allowed = asked.body.contains(#""allowed":true"#)
            XCTAssertEqual(allowed, scope == "all", asked.body)
            if !allowed { XCTAssertTrue(asked.body.contains(#""code":313"#), asked.body) }
            let protect = try daemon.api("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("personal.txt"))", "identity": "\#(Self.alice)"}"#)
            XCTAssertEqual(protect.status == 200, allowed, "re-owning agrees with can-receive under \(scope): \(protect.body)")
            if allowed {
                let back = try daemon.api("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("personal.txt"))", "identity": "\#(Self.personal)"}"#)
                XCTAssertEqual(back.status, 403, "Alice's data may not go back to a personal identity: \(back.body)")
                XCTAssertTrue(back.body.contains("312"), back.body)
                try setPolicy(Self.alice, #""receiveFromOtherIdentities": "\#(scope)", "sendToOtherIdentities": "all""#)
                XCTAssertEqual(try daemon.api("POST", "/v1/files/protect", #"{"path": "\#(daemon.mnt("personal.txt"))", "identity": "\#(Self.personal)"}"#).status, 200)
            } else {
                XCTAssertTrue(protect.body.contains("313"), protect.body)
            }
        }
    }
}
