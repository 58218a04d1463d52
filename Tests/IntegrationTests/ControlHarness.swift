import CustodySystem
import Foundation
import Glibc
import XCTest

/// Helpers for the control API tests: JSON answers, custodyctl, a test user.
extension MountedDaemon {
    /// An account's lock state as the status shows it (unlocked, locking, locked; "unknown").
    func lockState(_ identity: String) throws -> String {
        let (_, status) = try apiJSON("GET", "/v1/status")
        let account = (status["accounts"] as? [[String: Any]])?.first { ($0["upn"] as? String) == identity }
        return account?["lock"] as? String ?? "unknown"
    }

    /// Calls the API and decodes the JSON answer (any shape).
    func apiJSON(_ method: String, _ path: String, _ body: String? = nil, asUser uid: UInt32? = nil) throws -> (status: Int, json: [String: Any]) {
        let (status, text) = try api(method, path, body, asUser: uid)
        let object = (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
        return (status, object)
    }

    /// Runs custodyctl against this daemon (as another user with `asUser`).
    @discardableResult
    func ctl(_ arguments: [String], input: String? = nil, asUser uid: UInt32? = nil) throws -> CommandResult {
        var command = [MountedDaemon.tool("custodyctl"), "--socket", socket]
        if let first = arguments.first {
            command = [MountedDaemon.tool("custodyctl"), first, "--socket", socket] + arguments.dropFirst()
        }
        if let uid { command = ["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + command }
        return try runCommand(command, input: input.map { Data($0.utf8) })
    }

    /// A binary built next to custodyd.
    static func tool(_ name: String) -> String {
        URL(fileURLWithPath: binary).deletingLastPathComponent().appendingPathComponent(name).path
    }

    /// Lets other users reach the socket and the mount (the test root is 0700).
    func openToOtherUsers() throws {
        try mustRun(["chmod", "0755", root])
    }
}

/// A local user for authorization tests, created once (useradd) and kept.
func testUser(_ name: String = "custody-test") throws -> UInt32 {
    if let entry = getpwnam(name) { return entry.pointee.pw_uid }
    try mustRun(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
    guard let entry = getpwnam(name) else { throw HarnessError("useradd did not create \(name)") }
    return entry.pointee.pw_uid
}

/// Decodes a JSON answer's field path ("a.b") as a string, for short assertions.
func field(_ object: [String: Any], _ path: String) -> String? {
    var current: Any? = object
    for key in path.split(separator: ".") { current = (current as? [String: Any])?[String(key)] }
    switch current {
    case let value as String: return value
    case let value as NSNumber: return value.stringValue
    default: return current.map { "\($0)" }
    }
}

/// Starts a long-running process owned by `uid` (for binding tests); the caller kills it.
func spawnSleeper(asUser uid: UInt32? = nil) throws -> pid_t {
    if let uid { return try spawn("setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "sleep", "60"]) }
    return try spawn("sleep", ["60"])
}
