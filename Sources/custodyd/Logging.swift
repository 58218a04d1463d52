import CustodyCore
import CustodyCrypto
import CustodySystem
import Glibc
import Logging
import Synchronization

/// Log output for the daemon (swift-log): one line per message on stderr, with the journal's
/// `<N>` priority prefix when stderr is the journal, and identities scrubbed: every configured
/// value (`ValuesToScrubFromLogging`), and with `ScrubAccountIdentities` every account's object
/// ID and UPN, is replaced by `[scrubbed:xxxxxxxx]`, a hash keyed per process, so lines about
/// one identity can be matched without naming it. Keys and passphrases are never logged.
struct DaemonLogHandler: LogHandler {
    let label: String
    var metadata: Logger.Metadata = [:]

    /// One level for every logger, changed by a reload.
    var logLevel: Logger.Level {
        get { DaemonLog.level.withLock { $0 } }
        set { DaemonLog.level.withLock { $0 = newValue } }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let level = event.level
        var text = event.message.description
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        if !all.isEmpty { text += " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
        text = DaemonLog.scrub(text)
        let line: String
        if DaemonLog.journal {
            line = "<\(DaemonLog.priority(level))>\(text)\n"
        } else {
            line = "custodyd: " + (level >= .warning ? "\(level): " : "") + text + "\n"
        }
        DaemonLog.write(line)
    }
}

enum DaemonLog {
    static let level = Mutex<Logger.Level>(.info)
    static let scrubbed = Mutex<[String]>([])
    nonisolated(unsafe) static var journal = false
    private static let salt: [UInt8] = (0..<16).map { _ in UInt8.random(in: 0...255) }
    private static let output = Mutex(())

    static func bootstrap(level: Logger.Level) {
        journal = Systemd.stderrIsJournal || getenv("CUSTODY_LOG_JOURNAL").map { String(cString: $0) == "1" } == true
        self.level.withLock { $0 = level }
        LoggingSystem.bootstrap { label in DaemonLogHandler(label: label) }
    }

    /// The strings to replace from now on (longest first, so an ID inside a UPN goes whole).
    static func setScrubbed(_ values: [String]) {
        let cleaned = Set(values.map { $0.trimmingWhitespace() }.filter { $0.count >= 3 })
        scrubbed.withLock { $0 = cleaned.sorted { $0.count > $1.count } }
    }

    static func scrub(_ text: String) -> String {
        let values = scrubbed.withLock { $0 }
        guard !values.isEmpty else { return text }
        var result = text
        for value in values {
            result = result.replacingCaseInsensitive(value, with: token(for: value))
        }
        return result
    }

    static func token(for value: String) -> String {
        let digest = (salt + Array(value.lowercased().utf8)).withUnsafeBytes { sha256($0) }
        let hex = hexString(digest.prefix(4))
        return "[scrubbed:\(hex)]"
    }

    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    static func write(_ line: String) {
        output.withLock { _ in
            var line = line
            line.withUTF8 { bytes in
                var offset = 0
                while offset < bytes.count {
                    let n = Glibc.write(2, bytes.baseAddress! + offset, bytes.count - offset)
                    if n <= 0 { break }
                    offset += n
                }
            }
        }
    }
}

extension String {
    /// Replaces every occurrence of `target`, compared without case (ASCII), with `replacement`.
    func replacingCaseInsensitive(_ target: String, with replacement: String) -> String {
        let haystack = Array(utf8), needle = Array(target.lowercased().utf8)
        guard !needle.isEmpty, haystack.count >= needle.count else { return self }
        func lower(_ byte: UInt8) -> UInt8 { byte >= 65 && byte <= 90 ? byte + 32 : byte }
        var out: [UInt8] = []
        var index = 0
        while index < haystack.count {
            if index + needle.count <= haystack.count, needle.indices.allSatisfy({ lower(haystack[index + $0]) == needle[$0] }) {
                out += Array(replacement.utf8)
                index += needle.count
            } else {
                out.append(haystack[index])
                index += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
