import CustodyClient
import Foundation
import Glibc
import XCTest

/// What an identity owns, and a wipe's preview: `custodyctl files --owner`, `custodyctl wipe
/// --dry-run` and the question a wipe asks on a terminal, through a real mount.
final class WipePreviewTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    static let arguments = ["--multi-identity", "--allow-other", "--default-identity", "0=alice@contoso.com",
                            "--default-identity", "65534=bob@personal.example"]

    /// Alice (managed, encrypted) makes a tree with a hard link, a symlink and many files; Bob
    /// (registered, unmanaged) puts files in two of her directories and one at the top.
    func makeTree(manyFiles: Int) throws {
        daemon = try MountedDaemon(extraArguments: Self.arguments)
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@personal.example", "enroll": false}"#).status, 201)
        try mustRun(["sh", "-c", """
            cd '\(daemon.mountPoint)' && mkdir -m 777 work work/deep work/mine && printf 'alice one\\n' > work/a1.txt && \
            printf 'alice two, longer\\n' > work/deep/a2.txt && printf 'alice 3\\n' > work/mine/a3.txt && \
            ln work/a1.txt work/a1-again.txt && ln -s a1.txt work/link && \
            i=0; while [ $i -lt \(manyFiles) ]; do printf 'many %05d\\n' $i > work/mine/many-$i; i=$((i+1)); done
            """])
        let bob = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                  "cd '\(daemon.mountPoint)' && echo bob > work/bob.txt && echo bob deep > work/deep/bob-deep.txt && echo bob top > bob-top.txt"])
        XCTAssertEqual(bob.status, 0, bob.error)
    }

    func lines(_ text: String) -> [[String: Any]] {
        text.split(separator: "\n").compactMap { (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any] }
    }

    func mountTree() throws -> [String] {
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && find . | sort"]).split(separator: "\n").map(String.init)
    }

    func testTheListingAndTheDryRunAreExactlyWhatTheWipeDeletes() throws {
        let many = 1500
        try makeTree(manyFiles: many)
        let m = daemon.mountPoint

        // Everything Alice owns, as the mount shows it (names decrypted), in lines of JSON.
        let listing = try daemon.ctl(["files", "--owner", "alice@contoso.com", "--json"])
        XCTAssertEqual(listing.status, 0, listing.error)
        let all = lines(listing.output)
        let objects = all.filter { $0["path"] != nil }
        let byPath = Dictionary(objects.map { ($0["path"] as? String ?? "", $0) }, uniquingKeysWith: { a, _ in a })
        XCTAssertEqual(objects.count, 3 + 4 + 1 + many, "three directories, four names of files, a symlink and the many")
        XCTAssertEqual(byPath["\(m)/work"]?["kind"] as? String, "directory")
        XCTAssertEqual(byPath["\(m)/work"]?["wipeDeletes"] as? Bool, false, "Bob's files are in it")
        XCTAssertEqual(byPath["\(m)/work/deep"]?["wipeDeletes"] as? Bool, false)
        XCTAssertEqual(byPath["\(m)/work/mine"]?["wipeDeletes"] as? Bool, true, "only hers inside")
        XCTAssertEqual(byPath["\(m)/work/deep/a2.txt"]?["size"] as? Int, 18, "the plaintext size")
        XCTAssertEqual(byPath["\(m)/work/deep/a2.txt"]?["encrypted"] as? Bool, true)
        XCTAssertEqual(byPath["\(m)/work/link"]?["kind"] as? String, "symlink")
        let links = ["\(m)/work/a1.txt", "\(m)/work/a1-again.txt"].map { byPath[$0]?["otherLink"] as? Bool ?? false }
        XCTAssertEqual(links.filter { $0 }.count, 1, "one of the two names of the same file is the other link: \(links)")
        XCTAssertNil(byPath["\(m)/work/bob.txt"], "Bob's files are not hers")
        // A directory comes after what is in it.
        let order = objects.compactMap { $0["path"] as? String }
        XCTAssertLessThan(try XCTUnwrap(order.firstIndex(of: "\(m)/work/mine/a3.txt")), try XCTUnwrap(order.firstIndex(of: "\(m)/work/mine")))
        let summary = try XCTUnwrap(all.last?["summary"] as? [String: Any], "the last line is the summary")
        XCTAssertEqual(summary["files"] as? Int, 4 + many)
        XCTAssertEqual(summary["encryptedFiles"] as? Int, 4 + many)
        XCTAssertEqual(summary["directories"] as? Int, 3)
        XCTAssertEqual(summary["symlinks"] as? Int, 1)
        XCTAssertEqual(summary["keptDirectories"] as? Int, 2)
        XCTAssertEqual(summary["complete"] as? Bool, true)
        XCTAssertEqual(summary["size"] as? Int, 10 + 18 + 8 + many * 11, "each file once, plaintext bytes")
        // The same in text: a line per object, then the totals.
        let text = try daemon.ctl(["files", "--owner", "alice-oid"])
        XCTAssertEqual(text.status, 0, text.error)
        XCTAssertTrue(text.output.contains("file            18 B  encrypted  \(m)/work/deep/a2.txt"), text.output)
        XCTAssertTrue(text.output.contains("(another name of a file listed above)"), text.output)
        XCTAssertTrue(text.output.hasSuffix("alice@contoso.com owns \(4 + many) files (\(4 + many) encrypted, \(humanBytes(UInt64(10 + 18 + 8 + many * 11))); "
                                            + "\(humanBytes(UInt64(summary["bytesOnDisk"] as? Int ?? 0))) on disk), 3 directories and 1 symlink in the mounts; "
                                            + "a wipe would leave 2 directories that hold other owners' objects.\n"), String(text.output.suffix(300)))
        // Bob's, plain.
        let bobs = lines(try daemon.ctl(["files", "--owner", "bob@personal.example", "--json"]).output).filter { $0["path"] != nil }
        XCTAssertEqual(Set(bobs.compactMap { $0["path"] as? String }), ["\(m)/work/bob.txt", "\(m)/work/deep/bob-deep.txt", "\(m)/bob-top.txt"])
        XCTAssertTrue(bobs.allSatisfy { $0["encrypted"] as? Bool == false })

        // Unknown and not allowed: refused before anything is listed.
        let unknown = try daemon.ctl(["files", "--owner", "nobody@contoso.com"])
        XCTAssertEqual(unknown.status, 1)
        XCTAssertTrue(unknown.error.contains("nobody@contoso.com") && unknown.error.contains("300"), unknown.error)
        XCTAssertEqual(try daemon.ctl(["files", "--owner", "alice@contoso.com"], asUser: 65534).status, 77)
        // A reader that goes away stops the walk; the daemon carries on.
        _ = try runCommand(["sh", "-c", "'\(MountedDaemon.tool("custodyctl"))' files --socket '\(daemon.socket)' --owner alice@contoso.com --json | head -n 1"])
        XCTAssertEqual(try daemon.api("GET", "/v1/status").status, 200)

        // The preview: only what goes, and nothing changes.
        let before = try mountTree()
        let dryRun = try daemon.ctl(["wipe", "alice@contoso.com", "--dry-run", "--json"])
        XCTAssertEqual(dryRun.status, 0, dryRun.error)
        let previewLines = lines(dryRun.output)
        let preview = Set(previewLines.compactMap { $0["path"] as? String })
        XCTAssertEqual(preview, Set(objects.filter { $0["wipeDeletes"] as? Bool == true }.compactMap { $0["path"] as? String }))
        XCTAssertEqual(preview.count, 4 + 1 + 1 + many)
        let previewSummary = try XCTUnwrap(previewLines.last?["summary"] as? [String: Any])
        XCTAssertEqual(previewSummary["directories"] as? Int, 1)
        XCTAssertEqual(previewSummary["keptDirectories"] as? Int, 2)
        let dryText = try daemon.ctl(["wipe", "alice@contoso.com", "--dry-run"])
        XCTAssertTrue(dryText.output.contains("would delete  symlink            -             \(m)/work/link"), dryText.output)
        XCTAssertTrue(dryText.output.contains("then deletes \(4 + many) files"), dryText.output)
        XCTAssertTrue(dryText.output.contains("1 directory and 1 symlink. 2 directories of it stay, holding other owners' objects"), dryText.output)
        XCTAssertTrue(dryText.output.hasSuffix("Nothing was changed.\n"), dryText.output)
        XCTAssertEqual(try mountTree(), before, "a dry run changes nothing")
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice@contoso.com").status, 200)

        // The wipe does what the preview said: the same objects go, the same bytes are freed.
        let (status, result) = try daemon.apiJSON("POST", "/v1/accounts/alice@contoso.com/wipe")
        XCTAssertEqual(status, 200, "\(result)")
        XCTAssertEqual(result["deleted"] as? Int, 4 + many + 1, "files and the symlink")
        XCTAssertEqual(result["bytesFreed"] as? Int, previewSummary["bytesOnDisk"] as? Int)
        let after = try mountTree()
        XCTAssertEqual(after.count, before.count - preview.count, "\(after)")
        XCTAssertEqual(after.filter { $0.hasSuffix("bob.txt") || $0.hasSuffix("bob-deep.txt") || $0.hasSuffix("bob-top.txt") }.count, 3)
    }

    /// `script` gives custodyctl a terminal; what is typed comes from its stdin.
    func onTerminal(_ arguments: [String], typing: String) throws -> CommandResult {
        let command = ([MountedDaemon.tool("custodyctl"), arguments[0], "--socket", daemon.socket] + arguments.dropFirst())
            .map { "'\($0)'" }.joined(separator: " ")
        return try runCommand(["script", "-qec", command, "/dev/null"], input: Data(typing.utf8))
    }

    func testOnATerminalAWipeAsksForTheIdentityFirst() throws {
        try makeTree(manyFiles: 2)
        let before = try mountTree()
        // A wrong answer, or none, changes nothing.
        let wrong = try onTerminal(["wipe", "alice@contoso.com"], typing: "bob@personal.example\n")
        XCTAssertEqual(wrong.status, 1, wrong.output)
        XCTAssertTrue(wrong.output.contains("A wipe of alice@contoso.com destroys its keys"), wrong.output)
        XCTAssertTrue(wrong.output.contains("then deletes 6 files"), wrong.output)
        XCTAssertTrue(wrong.output.contains("Type the identity (alice@contoso.com) to wipe it:"), wrong.output)
        XCTAssertTrue(wrong.output.contains("bob@personal.example is not alice@contoso.com: nothing was wiped"), wrong.output)
        let none = try onTerminal(["deregister", "alice@contoso.com", "--wipe"], typing: "\n")
        XCTAssertEqual(none.status, 1, none.output)
        XCTAssertTrue(none.output.contains("not confirmed: nothing was wiped"), none.output)
        XCTAssertEqual(try mountTree(), before)
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice@contoso.com").status, 200)
        // The identity, in any case or by its ID, goes ahead.
        let confirmed = try onTerminal(["wipe", "alice@contoso.com"], typing: "ALICE-OID\n")
        XCTAssertEqual(confirmed.status, 0, confirmed.output)
        XCTAssertTrue(confirmed.output.contains("wiped alice@contoso.com: 104 UnenrollmentSuccess"), confirmed.output)
        XCTAssertEqual(try daemon.api("GET", "/v1/accounts/alice@contoso.com").status, 404)
        // --yes asks nothing; nor does a run without a terminal (scripts, as before).
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "carol-oid", "upn": "carol@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        let yes = try onTerminal(["wipe", "carol@contoso.com", "--yes"], typing: "")
        XCTAssertEqual(yes.status, 0, yes.output)
        XCTAssertFalse(yes.output.contains("Type the identity"), yes.output)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "carol-oid", "upn": "carol@contoso.com", "policy": {"protectionLevel": "none"}}"#).status, 201)
        let script = try daemon.ctl(["wipe", "carol@contoso.com"])
        XCTAssertEqual(script.status, 0, script.error)
        XCTAssertFalse(script.error.contains("Type the identity"))
    }
}
