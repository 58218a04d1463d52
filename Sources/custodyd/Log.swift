import Glibc

/// Minimal stderr logging for the daemon (stderr is the journal under systemd).
enum Log {
    static func info(_ message: String) { emit("custodyd: \(message)\n") }
    static func error(_ message: String) { emit("custodyd: error: \(message)\n") }

    private static func emit(_ line: String) {
        var line = line
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if n <= 0 { break }
                offset += n
            }
        }
    }
}

enum CustodyVersion {
    static let string = "0.1.0"
}
