/// Custody's version, the one place it is written: custodyd and custodyctl print it, the status
/// answer and the metrics carry it, and the Debian package takes it from `custodyd --version`.
public enum CustodyVersion {
    public static let string = "0.3.0"
}
