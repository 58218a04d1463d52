import CustodyClient
import CustodySystem
import Foundation
import Glibc
import XCTest

/// Save-to and open-from locations: the SDK's questions over the socket, the CLI and the client
/// library, and the confinement of `custodyctl run` (Landlock).
final class LocationTests: XCTestCase {
    var daemon: MountedDaemon!
    var work: String!
    var config: String!

    override func tearDown() {
        if let work, MountTable.entry(at: work + "/usb") != nil { _ = try? runCommand(["umount", "-l", work + "/usb"]) }
        // Started with --config, the daemon outlives an unmount: stop it first.
        if let daemon, daemon.pid > 0 { kill(daemon.pid, SIGTERM) }
        daemon?.destroy()
        daemon = nil
        if let work { _ = try? runCommand(["rm", "-rf", work]) }
    }

    /// A daemon whose configuration names a synced OneDrive folder.
    func start() throws {
        work = try makeTemporaryDirectory("custody-locations")
        XCTAssertEqual(chmod(work, 0o755), 0)
        try FileManager.default.createDirectory(atPath: work + "/OneDrive - Contoso", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: work + "/home", withIntermediateDirectories: true)
        config = work + "/custody.toml"
        try """
            [settings]
            MultiIdentity = true
            [locations]
            OneDriveForBusiness = ["\(work!)/OneDrive - Contoso"]
            """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon = try MountedDaemon(extraArguments: ["--config", config, "--allow-other", "--socket-mode", "0666"])
        try daemon.openToOtherUsers()
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "untilFirstAuth", "saveToLocations": ["AccountDocument", "OneDriveForBusiness"], "openFromLocations": ["AccountDocument"]}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
    }

    func testQueriesOverTheSocketTheCLIAndTheClient() throws {
        try start()
        // The socket.
        let blocked = try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalDrive", "account": "alice@contoso.com"}"#)
        XCTAssertEqual(blocked.status, 200, blocked.body)
        XCTAssertTrue(blocked.body.contains(#""allowed":false"#), blocked.body)
        XCTAssertTrue(try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalStorage", "account": "ALICE-OID"}"#).body.contains(#""allowed":false"#), "aliases and object IDs")
        XCTAssertTrue(try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "OneDriveForBusiness", "account": "alice@contoso.com"}"#).body.contains(#""allowed":true"#))
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "me-oid", "upn": "me@gmail.com", "enroll": false}"#).status, 201)
        XCTAssertTrue(try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalDrive", "account": "me@gmail.com"}"#).body.contains(#""allowed":true"#), "unmanaged: allowed")
        // A misspelt account is not an unmanaged one: it is unknown, and nothing is allowed for it.
        let typo = try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalDrive", "account": "alice@contoso.con"}"#)
        XCTAssertEqual(typo.status, 404, typo.body)
        XCTAssertTrue(typo.body.contains(#""name":"UnknownAccount""#) && typo.body.contains("alice@contoso.con"), typo.body)
        XCTAssertEqual(try daemon.api("GET", "/v1/locations?account=nobody@contoso.com").status, 404)
        XCTAssertTrue(try daemon.api("POST", "/v1/locations/open-from-allowed", #"{"location": "SharePoint", "account": "alice@contoso.com"}"#).body.contains(#""allowed":false"#))
        XCTAssertEqual(try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "Nowhere/../x", "account": "alice@contoso.com"}"#).status, 400)
        XCTAssertEqual(try daemon.api("POST", "/v1/locations/open-from-allowed", #"{"location": "NotConfigured", "account": ""}"#).status, 400, "a name that is neither the SDK's nor configured")
        // A user who does not own the account learns nothing of its policy: it is unknown to them.
        let uid = try testUser()
        let hidden = try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalDrive", "account": "alice@contoso.com"}"#, asUser: uid)
        XCTAssertEqual(hidden.status, 404, hidden.body)
        XCTAssertEqual(hidden.body, try daemon.api("POST", "/v1/locations/save-to-allowed", #"{"location": "LocalDrive", "account": "zed@contoso.com"}"#, asUser: uid).body
                        .replacingOccurrences(of: "zed@contoso.com", with: "alice@contoso.com"), "the same answer as for an account that does not exist")

        // Classifying paths.
        let cases = [(daemon.mnt("a/b.txt"), "AccountDocument"), (work + "/OneDrive - Contoso/Reports/q3.xlsx", "OneDriveForBusiness"),
                     (work + "/home/notes.txt", "LocalDrive"), ("/dev/shm/x", "LocalDrive")]
        for (path, expected) in cases {
            let located = try daemon.api("POST", "/v1/locations/classify", #"{"path": "\#(path)"}"#)
            XCTAssertEqual(located.status, 200, located.body)
            XCTAssertTrue(located.body.contains(#""location":"\#(expected)""#), "\(path): \(located.body)")
        }
        let listed = try daemon.api("GET", "/v1/locations?account=alice%40contoso.com").body
        XCTAssertTrue(listed.contains(#""name":"CameraRoll""#) && listed.contains(#""neverMatches":true"#), listed)

        // The CLI, with its exit codes.
        XCTAssertEqual(try daemon.ctl(["save-to-allowed", "LocalDrive", "--account", "alice@contoso.com"]).status, 2)
        XCTAssertEqual(try daemon.ctl(["save-to-allowed", "OneDriveForBusiness", "--account", "alice@contoso.com"]).status, 0)
        let misspelt = try daemon.ctl(["save-to-allowed", "LocalDrive", "--account", "alice@contoso.con"])
        XCTAssertEqual(misspelt.status, 1, "neither yes (0) nor no (2): an error")
        XCTAssertTrue(misspelt.error.contains("UnknownAccount") && misspelt.error.contains("alice@contoso.con"), misspelt.error)
        XCTAssertEqual(try daemon.ctl(["open-from-allowed", "AccountDocument", "--account", "alice@contoso.com"]).status, 0)
        let located = try daemon.ctl(["locate", work + "/OneDrive - Contoso/x"])
        XCTAssertTrue(located.output.contains("OneDriveForBusiness"), located.output + located.error)
        let list = try daemon.ctl(["locations", "--account", "alice@contoso.com"])
        XCTAssertTrue(list.output.contains("LocalDrive: /  save to: blocked"), list.output + list.error)
        let policy = try daemon.ctl(["policy", "alice@contoso.com", "--save-to", "all", "--send", "managed"])
        XCTAssertEqual(policy.status, 0, policy.error)
        XCTAssertTrue(policy.output.contains("save to: every location") && policy.output.contains("sends its data to other identities: managed"), policy.output)
        XCTAssertTrue(policy.output.contains("open from: AccountDocument"), "fields not named stay as they were: \(policy.output)")

        // The client library, with the SDK's names.
        let manager = PolicyManager(client: ControlClient(socketPath: daemon.socket))
        let expectation = XCTestExpectation()
        let socket = daemon.socket
        let mount = daemon.mountPoint
        Task {
            let save = try await manager.isSaveToAllowed(location: .localDrive, account: "alice@contoso.com")
            let open = try await manager.isOpenFromAllowed(location: .sharePoint, account: "alice@contoso.com")
            let where_ = try await manager.location(of: mount + "/x")
            XCTAssertTrue(save, "saveToLocations is every location now (\(socket))")
            XCTAssertFalse(open)
            XCTAssertEqual(where_.location, "AccountDocument")
            expectation.fulfill()
        }
        wait(for: [expectation], timeout: 10)
    }

    func testARunBlockedFromLocalDriveWritesOnlyWhereThePolicyAllows() throws {
        try start()
        let outside = work + "/home"
        let script = """
            set -u
            cd '\(daemon.mountPoint)'
            echo CORP > corp.txt && echo mount-ok
            echo synced > '\(work!)/OneDrive - Contoso/q3.txt' && echo onedrive-ok
            echo leak > '\(outside)/out.txt' 2>/dev/null || echo outside-refused
            cp corp.txt '\(outside)/copy.txt' 2>/dev/null || echo copy-refused
            sh -c "echo child > '\(outside)/child.txt'" 2>/dev/null || echo child-refused
            mkdir '\(outside)/dir' 2>/dev/null || echo mkdir-refused
            echo fine > /dev/null && echo devnull-ok
            echo leak > /dev/shm/custody-confined-$$ 2>/dev/null || echo shm-refused
            echo scratch > "$TMPDIR/scratch" && echo tmp-ok
            case "$TMPDIR" in '\(daemon.mountPoint)'/*) echo tmp-in-mount ;; esac
            """
        let result = try daemon.ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", script])
        XCTAssertEqual(result.status, 0, result.error)
        for line in ["mount-ok", "onedrive-ok", "outside-refused", "copy-refused", "child-refused", "mkdir-refused", "devnull-ok", "shm-refused", "tmp-ok", "tmp-in-mount"] {
            XCTAssertTrue(result.output.contains(line), "\(line) missing: \(result.output) \(result.error)")
        }
        for name in ["out.txt", "copy.txt", "child.txt", "dir"] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: outside + "/" + name), "\(name) was created outside")
        }
        XCTAssertEqual(xattr(daemon.mnt("corp.txt"), "user.custody.owner"), "alice@contoso.com")
        // The errno a program sees is EACCES.
        let errno = try daemon.ctl(["run", "--identity", "alice@contoso.com", "--", "/usr/bin/python3", "-c",
                                    "import os\ntry:\n  os.open('\(outside)/p.txt', os.O_CREAT|os.O_WRONLY)\nexcept OSError as e:\n  print(e.errno)"])
        XCTAssertEqual(errno.output.trimmingCharacters(in: .whitespacesAndNewlines), "13", errno.error)

        // Every way of copying out, as in the guard's test, through custodyctl run (Landlock),
        // onto the disk and onto a second file system standing for a USB stick.
        let usb = work + "/usb"
        try FileManager.default.createDirectory(atPath: usb, withIntermediateDirectories: true)
        try mustRun(["mount", "-t", "tmpfs", "-o", "size=8m", "custody-locations-usb", usb])
        let copies = """
            set -u
            cd '\(daemon.mountPoint)'
            echo CORP2 > plan2.txt
            tee '\(outside)/tee.txt' < corp.txt >/dev/null 2>&1 || echo tee-refused
            dd if=corp.txt of='\(outside)/dd.txt' status=none 2>/dev/null || echo dd-refused
            mv plan2.txt '\(usb)/' 2>/dev/null || echo mv-refused
            tar cf '\(outside)/a.tar' corp.txt 2>/dev/null || echo tar-refused
            cp corp.txt '\(usb)/stick.txt' 2>/dev/null || echo usb-refused
            /usr/bin/python3 -c "open('\(outside)/py.txt', 'w').write(open('corp.txt').read())" 2>/dev/null || echo python-refused
            /usr/bin/python3 -c "import os; s = os.open('corp.txt', os.O_RDONLY); d = os.open('\(usb)/cfr.txt', os.O_WRONLY | os.O_CREAT, 0o600); os.copy_file_range(s, d, 100)" 2>/dev/null || echo copy-range-refused
            /usr/bin/python3 -c "import os; open('\(outside)/.r.tmp', 'w').write(open('corp.txt').read()); os.rename('\(outside)/.r.tmp', '\(outside)/r.txt')" 2>/dev/null || echo atomic-save-refused
            """
        let copied = try daemon.ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", copies])
        for marker in ["tee-refused", "dd-refused", "mv-refused", "tar-refused", "usb-refused", "python-refused", "copy-range-refused", "atomic-save-refused"] {
            XCTAssertTrue(copied.output.contains(marker), "\(marker) missing: \(copied.output) \(copied.error)")
        }
        for path in [outside + "/tee.txt", outside + "/dd.txt", usb + "/plan2.txt", outside + "/a.tar", usb + "/stick.txt", outside + "/py.txt",
                     usb + "/cfr.txt", outside + "/.r.tmp", outside + "/r.txt"] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: path), "\(path) was created")
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: daemon.mnt("plan2.txt")), "mv kept its source")

        // Another identity, or the same one once its policy allows LocalDrive, is not confined.
        XCTAssertEqual(try daemon.ctl(["run", "--identity", "me@gmail.com", "--", "sh", "-c", "echo mine > '\(outside)/mine.txt'"]).status, 0)
        XCTAssertEqual(try daemon.ctl(["policy", "alice@contoso.com", "--save-to", "all"]).status, 0)
        XCTAssertEqual(try daemon.ctl(["run", "--identity", "alice@contoso.com", "--", "sh", "-c", "echo ok > '\(outside)/allowed.txt'"]).status, 0)
    }
}
