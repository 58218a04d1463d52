import CustodyCore
import CustodyCrypto
import Glibc

/// Every engine event as a structured journal entry (systemd's native protocol: one datagram of
/// `FIELD=value` lines), so that log collectors (journald forwarding, Vector, Fluent Bit) can
/// alert on wipes and failed unlocks without parsing text. Fields: `MESSAGE`, `MESSAGE_ID` (one
/// stable 128-bit ID per event kind), `PRIORITY`, `CUSTODY_EVENT`, `CUSTODY_CODE` (the SDK's code,
/// when there is one), `CUSTODY_IDENTITY` and one `CUSTODY_<DETAIL>` field per detail; every
/// value passes the log's scrubbing. Sent when stderr is the journal (under systemd) to
/// `/run/systemd/journal/socket`, or to the socket `CUSTODY_JOURNAL_SOCKET` names.
/// libsystemd's `sd_journal_send` always writes to the system's socket; the protocol is a few
/// lines, and speaking it here lets the tests read the datagrams on a socket of their own.
final class JournalEvents: Sendable {
    static let systemSocket = "/run/systemd/journal/socket"
    private let fd: Int32
    private let path: String

    /// The journal to send to, or nil when the daemon runs outside systemd.
    static func make() -> JournalEvents? {
        if let path = getenv("CUSTODY_JOURNAL_SOCKET").map({ String(cString: $0) }), !path.isEmpty { return JournalEvents(path: path) }
        return Systemd.stderrIsJournal ? JournalEvents(path: systemSocket) : nil
    }

    init?(path: String) {
        guard path.utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else { return nil }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        self.fd = fd
        self.path = path
    }

    deinit { close(fd) }

    /// Sends one event without waiting: a journal that is gone, or too far behind to take it,
    /// loses it (the text log still has it). Events are sent from the thread that made them, a
    /// wipe's or a lock's: a journal that stopped reading must not stop those.
    func send(_ event: EngineEvent, scrubber: Scrubber) {
        var datagram = Self.encode(Self.fields(event, scrubber: scrubber))
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8.prefix(raw.count - 1))
        }
        _ = datagram.withUnsafeMutableBytes { bytes in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT), $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
        }
    }

    static func fields(_ event: EngineEvent, scrubber: Scrubber) -> [(String, String)] {
        let scrub = scrubber.scrub
        var fields: [(String, String)] = [
            ("MESSAGE", scrub("\(event.kind.rawValue)\(event.code.map { " [\($0)]" } ?? ""): \(event.message)")),
            ("MESSAGE_ID", messageID(event.kind)),
            ("PRIORITY", String(priority(event.kind))),
            ("SYSLOG_IDENTIFIER", "custodyd"),
            ("CUSTODY_EVENT", event.kind.rawValue),
        ]
        if let code = event.code { fields.append(("CUSTODY_CODE", String(code))) }
        if let identity = event.identity { fields.append(("CUSTODY_IDENTITY", scrubber.scrubIdentity(identity))) }
        for (key, value) in event.details.sorted(by: { $0.key < $1.key }) {
            let name = fieldName(key)
            if !name.isEmpty { fields.append(("CUSTODY_" + name, scrub(value))) }
        }
        return fields
    }

    /// The native protocol: `NAME=value\n`, or for a value with a newline `NAME\n`, its length
    /// as 64-bit little-endian, the value and `\n`.
    static func encode(_ fields: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        for (name, value) in fields {
            out += Array(name.utf8)
            let bytes = Array(value.utf8)
            if bytes.contains(0x0A) {
                out.append(0x0A)
                withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { out += $0 }
                out += bytes
            } else {
                out.append(UInt8(ascii: "="))
                out += bytes
            }
            out.append(0x0A)
        }
        return out
    }

    /// A stable 128-bit ID per event kind (SHA-256 of its name), in the journal's hex form.
    static func messageID(_ kind: EngineEvent.Kind) -> String {
        let digest = Array("custody-event/\(kind.rawValue)".utf8).withUnsafeBytes { sha256($0) }
        return hexString(digest.prefix(16))
    }

    /// syslog priorities: failures are errors, refusals warnings, wipes and key changes notices.
    static func priority(_ kind: EngineEvent.Kind) -> Int {
        switch kind {
        case .wipeFailed, .enrollmentFailed: return 3
        case .tamperDetected: return 3
        case .unlockFailed, .unlockAttemptsExceeded, .transferBlocked, .saveBlocked, .openFromBlocked, .accountNotAllowed: return 4
        case .wipeStarted, .wipeFinished, .deregistered, .machineKeyChanged, .locked, .identityExported, .keysRotated: return 5
        case .wipeProgress, .reprotectProgress: return 7
        default: return 6
        }
    }

    /// A detail's key as a journal field name: `keysDestroyedSeconds` → `KEYS_DESTROYED_SECONDS`.
    static func fieldName(_ key: String) -> String {
        var name = ""
        for character in key {
            if character.isUppercase, !name.isEmpty, name.last != "_" { name.append("_") }
            if character.isLetter || character.isNumber { name += character.uppercased() } else if !name.isEmpty, name.last != "_" { name.append("_") }
        }
        return String(name.filter { $0.isASCII })
    }
}
