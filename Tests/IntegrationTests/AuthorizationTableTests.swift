import CustodySystem
import Foundation
import Glibc
import XCTest

/// The route × caller table of docs/api.md, cell by cell: the table is read from the document,
/// and every cell is a request by root, by the account's owner and by another user (both made
/// with `useradd`), each against a freshly enrolled account.
final class AuthorizationTableTests: XCTestCase {
    var daemon: MountedDaemon!
    var children: [pid_t] = []
    /// The owner's uid (set by the test).
    var ownerUID: UInt32 = 0
    static let account = "x@contoso.com"

    override func tearDown() {
        for child in children { kill(child, SIGKILL); waitForExit(child, seconds: 5) }
        daemon?.destroy()
        daemon = nil
    }

    struct Row {
        var method: String
        var path: String
        /// Administrator, owner, other user: the status, the refusal's name, what the answer shows.
        var cells: [(status: Int, name: String?, note: String)]
    }

    static func table() throws -> [Row] {
        let document = try String(contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/api.md").path, encoding: .utf8)
        guard let start = document.range(of: "### Route × caller") else { throw HarnessError("no route × caller table in docs/api.md") }
        var rows: [Row] = []
        for line in document[start.upperBound...].split(separator: "\n").drop(while: { !$0.hasPrefix("| route") }).dropFirst(2) {
            guard line.hasPrefix("|") else { break }
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count == 4, let open = cells[0].firstIndex(of: "`"), let close = cells[0].lastIndex(of: "`"), open < close else {
                throw HarnessError("cannot read the row \(line)")
            }
            let route = cells[0][cells[0].index(after: open)..<close].split(separator: " ")
            let parsed = try cells[1...].map { cell -> (Int, String?, String) in
                let words = cell.split(separator: " ")
                guard let status = words.first.flatMap({ Int($0) }) else { throw HarnessError("no status in \(cell)") }
                let name = words.dropFirst().first.flatMap { $0.hasPrefix("(") ? nil : String($0) }
                return (status, name, cell)
            }
            rows.append(Row(method: String(route[0]), path: String(route[1]), cells: parsed))
        }
        return rows
    }

    func testEveryCellOfTheTable() throws {
        let owner = try testUser("custody-test")
        ownerUID = owner
        let other = try testUser("custody-test2")
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--allow-other", "--socket-mode", "0666"])
        try daemon.openToOtherUsers()
        XCTAssertEqual(chmod(daemon.mountPoint, 0o1777), 0)
        let rows = try Self.table()
        XCTAssertGreaterThanOrEqual(rows.count, 20)
        let callers: [(name: String, uid: UInt32?)] = [("administrator", nil), ("owner", owner), ("other user", other)]
        let ownersProcess = try spawnSleeper(asUser: owner)
        children.append(ownersProcess)
        var serial = 0
        for row in rows {
            for (caller, cell) in zip(callers, row.cells) {
                serial += 1
                try freshAccount(owner: "custody-test")
                var path = row.path.replacingOccurrences(of: "/X", with: "/" + Self.account)
                    .replacingOccurrences(of: "{pid}", with: "\(ownersProcess)")
                if path == "/v1/events" { path += "?follow=false" }
                let body = try self.body(for: row, caller: caller.uid, serial: serial)
                let answer = try daemon.api(row.method, path, body, asUser: caller.uid)
                let what = "\(row.method) \(row.path) by \(caller.name)"
                XCTAssertEqual(answer.status, cell.status, "\(what): \(answer.body)")
                if let name = cell.name { XCTAssertTrue(answer.body.contains(#""name":"\#(name)""#), "\(what): \(answer.body)") }
                if cell.note.contains("(not X") {
                    XCTAssertFalse(answer.body.contains(Self.account), "\(what) shows X: \(answer.body)")
                } else if cell.note.contains("(X") || cell.note.contains("(every") {
                    XCTAssertTrue(answer.body.contains(Self.account), "\(what) does not show X: \(answer.body)")
                }
            }
        }
    }

    /// X, enrolled anew for the owner by name (nothing left of an earlier cell).
    func freshAccount(owner: String) throws {
        if try daemon.api("GET", "/v1/accounts/\(Self.account)").status == 200 {
            XCTAssertEqual(try daemon.api("DELETE", "/v1/accounts/\(Self.account)?wipe=true").status, 200)
        }
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "x-oid", "upn": "\#(Self.account)", "user": "\#(owner)", "policy": {"protectionLevel": "untilFirstAuth"}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
    }

    /// This host's key for receiving identities.
    func hostKey() throws -> String {
        try XCTUnwrap(field(try daemon.apiJSON("GET", "/v1/host-key").json, "publicKey"))
    }

    /// A body the route accepts, made with what the caller owns (its process, its file).
    func body(for row: Row, caller uid: UInt32?, serial: Int) throws -> String? {
        switch (row.method, row.path) {
        case ("POST", "/v1/accounts"):
            return #"{"id": "new-\#(serial)", "upn": "new\#(serial)@contoso.com"}"#
        case ("PUT", "/v1/accounts/X/policy"):
            return #"{"protectionLevel": "untilFirstAuth", "sendToOtherIdentities": "managed"}"#
        case ("POST", "/v1/accounts/X/unlock"):
            return "{}"
        case ("POST", "/v1/accounts/X/passphrase"):
            return #"{"new": "a new passphrase"}"#
        case ("POST", "/v1/accounts/X/login-protector"), ("POST", "/v1/login/unlock"):
            return #"{"password": "a login password"}"#
        case ("POST", "/v1/bindings"):
            let process = try spawnSleeper(asUser: uid)
            children.append(process)
            return #"{"pid": \#(process), "identity": "\#(Self.account)"}"#
        case ("POST", "/v1/files/protect"), ("POST", "/v1/files/can-receive"):
            let name = daemon.mnt("file-\(serial).txt")
            var command = ["sh", "-c", "echo \(serial) > '\(name)'"]
            if let uid { command = ["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + command }
            try mustRun(command)
            return #"{"path": "\#(name)", "identity": "\#(Self.account)"}"#
        case ("POST", "/v1/files/repair"):
            // A file of X (written by its owner), whoever asks.
            let name = daemon.mnt("x-file-\(serial).txt")
            try mustRun(["setpriv", "--reuid=\(ownerUID)", "--regid=\(ownerUID)", "--clear-groups", "sh", "-c", "echo \(serial) > '\(name)'"])
            return #"{"path": "\#(name)"}"#
        case ("POST", "/v1/machine-key/migrate"):
            return #"{"to": "file"}"#
        case ("POST", "/v1/accounts/X/export"):
            return #"{"hostKey": "\#(try hostKey())"}"#
        case ("POST", "/v1/identities/import"):
            // X's keys sealed to this very host, by the administrator.
            let export = try daemon.api("POST", "/v1/accounts/\(Self.account)/export", #"{"hostKey": "\#(try hostKey())"}"#)
            XCTAssertEqual(export.status, 200, export.body)
            return #"{"export": \#(export.body)}"#
        case ("POST", "/v1/data/protect"):
            return #"{"identity": "\#(Self.account)", "string": "secret"}"#
        case ("POST", "/v1/locations/save-to-allowed"):
            return #"{"location": "LocalDrive", "account": "\#(Self.account)"}"#
        case ("POST", _):
            return nil
        default:
            return nil
        }
    }
}
