import CustodyCore
import CustodyCrypto
import CustodySystem
import Glibc
import Logging
import Synchronization

/// Log output for the daemon (swift-log): one line per message on stderr, with the journal's
/// `<N>` priority prefix when stderr is the journal, and identities and configured values
/// scrubbed (`Scrubber`: on from the first line, unless `ScrubAccountIdentities = false`). Keys
/// and passphrases are never logged.
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
    /// What every line, journal entry and support bundle goes through.
    static let scrubber = Scrubber()
    nonisolated(unsafe) static var journal = false
    private static let output = Mutex(())

    static func bootstrap(level: Logger.Level) {
        journal = Systemd.stderrIsJournal || getenv("CUSTODY_LOG_JOURNAL").map { String(cString: $0) == "1" } == true
        self.level.withLock { $0 = level }
        LoggingSystem.bootstrap { label in DaemonLogHandler(label: label) }
    }

    static func scrub(_ text: String) -> String { scrubber.scrub(text) }

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
