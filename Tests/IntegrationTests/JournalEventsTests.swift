import Foundation
import Glibc
import XCTest

/// Engine events as structured journal entries: a datagram socket of the test's own stands in for
/// journald's (`CUSTODY_JOURNAL_SOCKET`), and the test parses the native protocol it receives.
final class JournalEventsTests: XCTestCase {
    var daemon: MountedDaemon?
    var socketFD: Int32 = -1
    var work = ""

    override func tearDown() {
        daemon?.destroy()
        if socketFD >= 0 { close(socketFD) }
        unsetenv("CUSTODY_JOURNAL_SOCKET")
        _ = try? runCommand(["rm", "-rf", work])
    }

    /// Binds a datagram socket at `path`.
    func listen(_ path: String) throws {
        socketFD = try Self.bindDatagramSocket(path)
    }

    /// Every entry received so far, each as its fields.
    func entries() -> [[String: String]] { Self.receive(socketFD) }

    /// A datagram socket bound at `path` that stands in for journald's, with a short receive timeout.
    static func bindDatagramSocket(_ path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: path.utf8.prefix($0.count - 1)) }
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        guard bound == 0 else {
            close(fd)
            throw HarnessError("bind \(path): \(errno)")
        }
        var timeout = timeval(tv_sec: 0, tv_usec: 300_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    /// Every entry waiting on `fd`, each as its fields.
    static func receive(_ fd: Int32) -> [[String: String]] {
        var result: [[String: String]] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            guard count > 0 else { return result }
            result.append(parse(Array(buffer[0..<count])))
        }
    }

    /// The native protocol: `NAME=value\n`, or `NAME\n` + 64-bit little-endian length + value + `\n`.
    static func parse(_ bytes: [UInt8]) -> [String: String] {
        var fields: [String: String] = [:]
        var index = 0
        while index < bytes.count {
            guard let newline = bytes[index...].firstIndex(of: 0x0A) else { break }
            let line = bytes[index..<newline]
            if let equals = line.firstIndex(of: UInt8(ascii: "=")) {
                fields[String(decoding: bytes[index..<equals], as: UTF8.self)] = String(decoding: bytes[(equals + 1)..<newline], as: UTF8.self)
                index = newline + 1
            } else {
                let name = String(decoding: line, as: UTF8.self)
                var length: UInt64 = 0
                for shift in 0..<8 { length |= UInt64(bytes[newline + 1 + shift]) << (8 * UInt64(shift)) }
                let start = newline + 9
                fields[name] = String(decoding: bytes[start..<(start + Int(length))], as: UTF8.self)
                index = start + Int(length) + 1
            }
        }
        return fields
    }

    func testEveryEventIsAStructuredJournalEntryWithScrubbedIdentities() throws {
        work = try makeTemporaryDirectory("custody-journal")
        try listen(work + "/journal.sock")
        setenv("CUSTODY_JOURNAL_SOCKET", work + "/journal.sock", 1)
        try "[settings]\nScrubAccountIdentities = true\nMultiIdentity = true\n".write(toFile: work + "/custody.toml", atomically: true, encoding: .utf8)
        let daemon = try MountedDaemon(extraArguments: ["--config", work + "/custody.toml", "--default-identity", "0=alice@contoso.com"])
        self.daemon = daemon
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-id", "upn": "alice@contoso.com", "passphrase": "right"}"#).status, 201)
        try writeFile(daemon.mnt("report.txt"), bytes("numbers"))
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/unlock", #"{"passphrase": "wrong"}"#).status, 403)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice-id/wipe").status, 200)
        let received = entries()
        let byEvent = Dictionary(received.map { ($0["CUSTODY_EVENT"] ?? "", $0) }, uniquingKeysWith: { first, _ in first })

        let enrolled = try XCTUnwrap(byEvent["enrolled"], "\(received)")
        XCTAssertEqual(enrolled["CUSTODY_CODE"], "100")
        XCTAssertEqual(enrolled["PRIORITY"], "6")
        XCTAssertEqual(enrolled["SYSLOG_IDENTIFIER"], "custodyd")
        XCTAssertEqual(enrolled["MESSAGE_ID"], "59dd1bf252ab28f43d31faf0da5ab7c1", "the ID docs/service.md lists")
        let identity = try XCTUnwrap(enrolled["CUSTODY_IDENTITY"])
        XCTAssertTrue(identity.hasPrefix("[scrubbed:"), identity)

        let failed = try XCTUnwrap(byEvent["unlockFailed"], "\(received)")
        XCTAssertEqual(failed["PRIORITY"], "4")
        XCTAssertEqual(failed["CUSTODY_FAILURES"], "1")
        XCTAssertEqual(failed["CUSTODY_IDENTITY"], identity, "one identity, one scrubbed token")
        XCTAssertEqual(failed["MESSAGE_ID"], "6d071d2585ad56ae45ceab31f8826df5")

        let wiped = try XCTUnwrap(byEvent["wipeFinished"], "\(received)")
        XCTAssertEqual(wiped["CUSTODY_CODE"], "102")
        XCTAssertEqual(wiped["PRIORITY"], "5")
        XCTAssertEqual(wiped["MESSAGE_ID"], "52d7af3877983095aad34b00a64a52f9")
        XCTAssertNotNil(byEvent["wipeProgress"]?["CUSTODY_KEYS_DESTROYED_SECONDS"] ?? received.first { $0["CUSTODY_KEYS_DESTROYED_SECONDS"] != nil }?["CUSTODY_KEYS_DESTROYED_SECONDS"])
        XCTAssertEqual(byEvent["deregistered"]?["CUSTODY_CODE"], "104")

        // Nothing names alice in clear, in any field of any entry.
        for entry in received {
            for (name, value) in entry {
                XCTAssertFalse(value.lowercased().contains("alice"), "\(name)=\(value)")
            }
        }
    }
}
