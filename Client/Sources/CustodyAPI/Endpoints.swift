/// One route of the control API: its method and its path, as `docs/api.md` lists them. The
/// daemon's route table, the client library and `custodyctl` all name routes by these, so a
/// path is spelled once.
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    public let method: String
    /// The path with its parameter, if any, in braces: `/v1/accounts/{identity}/lock`.
    public let pattern: String

    public init(_ method: String, _ pattern: String) {
        self.method = method
        self.pattern = pattern
    }

    public var description: String { "\(method) \(pattern)" }

    /// The path to request: the parameter (an identity, a process or job ID) escaped as one
    /// segment, then the query.
    public func path(_ parameter: String = "", query: [(String, String)] = []) -> String {
        var path = ""
        var rest = Substring(pattern)
        if let open = rest.firstIndex(of: "{"), let close = rest[open...].firstIndex(of: "}") {
            path = String(rest[..<open]) + Self.escapeComponent(parameter)
            rest = rest[rest.index(after: close)...]
        }
        path += rest
        if !query.isEmpty { path += "?" + query.map { "\($0.0)=\(Self.escapeComponent($0.1))" }.joined(separator: "&") }
        return path
    }

    /// Escapes one path segment or query value (an identity) for a URL: everything but
    /// letters, digits and `-._~@`.
    public static func escapeComponent(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            let safe = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || "-._~@".utf8.contains(byte)
            out += safe ? String(UnicodeScalar(byte)) : "%" + (byte < 16 ? "0" : "") + String(byte, radix: 16, uppercase: true)
        }
        return out
    }
}

/// Every route of the control API (`docs/api.md`, `docs/openapi.yaml`).
extension Endpoint {
    // Accounts
    public static let status = Endpoint("GET", "/v1/status")
    public static let accounts = Endpoint("GET", "/v1/accounts")
    public static let enroll = Endpoint("POST", "/v1/accounts")
    public static let account = Endpoint("GET", "/v1/accounts/{identity}")
    public static let deregister = Endpoint("DELETE", "/v1/accounts/{identity}")
    public static let wipe = Endpoint("POST", "/v1/accounts/{identity}/wipe")
    public static let ownedFiles = Endpoint("GET", "/v1/accounts/{identity}/files")
    public static let policy = Endpoint("GET", "/v1/accounts/{identity}/policy")
    public static let setPolicy = Endpoint("PUT", "/v1/accounts/{identity}/policy")
    public static let lock = Endpoint("POST", "/v1/accounts/{identity}/lock")
    public static let unlock = Endpoint("POST", "/v1/accounts/{identity}/unlock")
    public static let passphrase = Endpoint("POST", "/v1/accounts/{identity}/passphrase")
    public static let addLoginProtector = Endpoint("POST", "/v1/accounts/{identity}/login-protector")
    public static let removeLoginProtector = Endpoint("DELETE", "/v1/accounts/{identity}/login-protector")
    public static let createRecoveryKey = Endpoint("POST", "/v1/accounts/{identity}/recovery-key")
    public static let removeRecoveryKey = Endpoint("DELETE", "/v1/accounts/{identity}/recovery-key")
    public static let recover = Endpoint("POST", "/v1/accounts/{identity}/recover")
    // One identity on several hosts
    public static let hostKey = Endpoint("GET", "/v1/host-key")
    public static let exportIdentity = Endpoint("POST", "/v1/accounts/{identity}/export")
    public static let rotateKeys = Endpoint("POST", "/v1/accounts/{identity}/rotate")
    public static let importIdentity = Endpoint("POST", "/v1/identities/import")
    // Logins (the PAM module)
    public static let loginUnlock = Endpoint("POST", "/v1/login/unlock")
    public static let loginPassword = Endpoint("POST", "/v1/login/password")
    public static let loginOpen = Endpoint("POST", "/v1/login/open")
    public static let loginLock = Endpoint("POST", "/v1/login/lock")
    // The machine key
    public static let machineKey = Endpoint("GET", "/v1/machine-key")
    public static let migrateMachineKey = Endpoint("POST", "/v1/machine-key/migrate")
    public static let resetMachineKey = Endpoint("POST", "/v1/machine-key/reset")
    public static let allowedAccounts = Endpoint("GET", "/v1/allowed-accounts")
    // Every account of the caller at once
    public static let lockAll = Endpoint("POST", "/v1/lock")
    public static let unlockAll = Endpoint("POST", "/v1/unlock")
    // Identities of processes and threads
    public static let bind = Endpoint("POST", "/v1/bindings")
    public static let unbind = Endpoint("DELETE", "/v1/bindings/{pid}")
    public static let processIdentity = Endpoint("GET", "/v1/processes/{pid}/identity")
    // Files
    public static let fileInfo = Endpoint("POST", "/v1/files/info")
    public static let isEncrypted = Endpoint("POST", "/v1/files/is-encrypted")
    public static let protectFile = Endpoint("POST", "/v1/files/protect")
    public static let encryptFile = Endpoint("POST", "/v1/files/encrypt")
    public static let decryptFile = Endpoint("POST", "/v1/files/decrypt")
    public static let canReceive = Endpoint("POST", "/v1/files/can-receive")
    public static let repairFile = Endpoint("POST", "/v1/files/repair")
    // Locations
    public static let locations = Endpoint("GET", "/v1/locations")
    public static let classify = Endpoint("POST", "/v1/locations/classify")
    public static let saveToAllowed = Endpoint("POST", "/v1/locations/save-to-allowed")
    public static let openFromAllowed = Endpoint("POST", "/v1/locations/open-from-allowed")
    // Data (the data protection manager)
    public static let protectData = Endpoint("POST", "/v1/data/protect")
    public static let unprotectData = Endpoint("POST", "/v1/data/unprotect")
    public static let dataInfo = Endpoint("POST", "/v1/data/info")
    // Jobs, events, diagnostics, metrics
    public static let jobs = Endpoint("GET", "/v1/jobs")
    public static let job = Endpoint("GET", "/v1/jobs/{id}")
    public static let events = Endpoint("GET", "/v1/events")
    public static let diagnostics = Endpoint("GET", "/v1/diagnostics")
    public static let metrics = Endpoint("GET", "/v1/metrics")

    /// All of them, in the order `docs/api.md` lists them.
    public static let all: [Endpoint] = [
        status, accounts, enroll, account, deregister, wipe, ownedFiles, allowedAccounts, policy, setPolicy, lock, unlock, passphrase,
        addLoginProtector, removeLoginProtector, createRecoveryKey, removeRecoveryKey, recover, hostKey, exportIdentity, rotateKeys, importIdentity,
        loginUnlock, loginPassword, loginOpen, loginLock, machineKey, migrateMachineKey, resetMachineKey,
        lockAll, unlockAll, bind, unbind, processIdentity,
        fileInfo, isEncrypted, protectFile, encryptFile, decryptFile, canReceive, repairFile,
        locations, classify, saveToAllowed, openFromAllowed, protectData, unprotectData, dataInfo,
        jobs, job, events, diagnostics, metrics,
    ]
}
