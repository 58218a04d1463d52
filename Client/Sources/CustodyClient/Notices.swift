import CustodyAPI

/// What the person at the keyboard is told about an event of their own identities, as the SDK's
/// `showSharingBlockedMessage` tells a user of a managed app: a blocked save, open or share (which
/// identity, which location, which program), an identity locking and unlocking, a wipe. No notice
/// names a path: the events' paths are scrubbed as the daemon's logs are, but a notification is
/// shown to whoever looks at the screen.
public struct Notice: Equatable, Sendable {
    public var summary: String
    public var body: String
    /// A warning (blocked, wiped) rather than information (locked, unlocked).
    public var urgent: Bool

    public init(summary: String, body: String, urgent: Bool) {
        self.summary = summary
        self.body = body
        self.urgent = urgent
    }

    /// The notice for `event`, or nil for events a person need not see.
    public init?(_ event: CustodyEvent) {
        let identity = event.identity ?? "an identity"
        let program = Self.programName(event.details["executable"])
        let location = event.details["location"] ?? "there"
        switch event.kind {
        case "saveBlocked":
            self.init(summary: "Save blocked", body: "\(program) may not save \(identity)'s data to \(location).", urgent: true)
        case "openFromBlocked":
            self.init(summary: "Open blocked", body: "\(program) may not bring data from \(location) into \(identity)'s files.", urgent: true)
        case "transferBlocked":
            let from = event.details["from"].flatMap { $0.isEmpty ? nil : $0 } ?? "no identity"
            let to = event.details["to"].flatMap { $0.isEmpty ? nil : $0 } ?? "no identity"
            self.init(summary: "Sharing blocked", body: "\(program) may not move \(from)'s data to \(to).", urgent: true)
        case "locked":
            self.init(summary: "\(identity) locked", body: "Its protected files stay closed until it is unlocked.", urgent: false)
        case "unlocked":
            self.init(summary: "\(identity) unlocked", body: "Its protected files are available.", urgent: false)
        case "wipeStarted":
            self.init(summary: "\(identity) is being wiped", body: "Its data is being removed from this computer.", urgent: true)
        case "wipeFinished":
            self.init(summary: "\(identity) wiped", body: "Its data was removed from this computer.", urgent: true)
        default:
            return nil
        }
    }

    /// The program's file name ("a program" when unknown).
    static func programName(_ executable: String?) -> String {
        guard let executable, !executable.isEmpty, executable != "unknown" else { return "A program" }
        return String(executable.split(separator: "/").last ?? Substring(executable))
    }
}

/// At most one notice per kind and identity every `interval` seconds; the ones held back are
/// counted into the next ("and 3 more").
public struct NoticeLimiter: Sendable {
    public let interval: Double
    private var last: [String: Double] = [:]
    private var held: [String: Int] = [:]

    public init(interval: Double) { self.interval = interval }

    /// The notice to show for `event` at `now`, or nil (nothing to show, or held back).
    public mutating func admit(_ event: CustodyEvent, now: Double) -> Notice? {
        guard var notice = Notice(event) else { return nil }
        let key = event.kind + "\u{0}" + (event.identity ?? "")
        if let previous = last[key], now - previous < interval {
            held[key, default: 0] += 1
            return nil
        }
        last[key] = now
        if let count = held.removeValue(forKey: key), count > 0 {
            notice.body += " (and \(count) more like it)"
        }
        return notice
    }
}
