import CustodyAPI
import CustodyCore
import CustodyFormat
import CustodySystem
import Glibc
import TOMLKit

/// One problem in a configuration file: where it is (line and key) and what is wrong.
public struct ConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    public var file: String
    public var line: Int?
    /// The key's path, such as `settings.MaxFileProtectionLevel` or `mount[2].backing`.
    public var key: String
    public var message: String

    public var description: String {
        let place = line.map { "\(file):\($0)" } ?? file
        return key.isEmpty ? "\(place): \(message)" : "\(place): \(key): \(message)"
    }
}

/// Every problem found in a configuration file (at least one).
public struct ConfigurationErrors: Error, Sendable, CustomStringConvertible {
    public var errors: [ConfigurationError]
    public var description: String { errors.map(\.description).joined(separator: "\n") }
}

/// A mount the daemon serves.
public struct MountConfiguration: Equatable, Sendable {
    public var backing: String
    public var mountPoint: String
    public var allowOther = false
    public var allowNonEmpty = false
    public var cacheTimeout = 1.0
    public var writebackCache = true
    /// Ask for low CPU wake-up latency while the mount serves bursts of requests.
    public var lowLatency = true
    /// Serve requests on the CPU that sent them (FUSE over io_uring) where the kernel offers it.
    public var requestRings = true
    public var threads = 8
    /// Store the names of managed identities' new entries encrypted.
    public var encryptNames = true
    /// Create nothing until the declared accounts are enrolled (`policy_required`).
    public var policyRequired = false
    /// Other daemons serve the same backing directory (`shared_store`): close-to-open caching.
    public var sharedStore = false
    /// `store_attributes`: "trusted" or "user", the namespace of the store's records; nil decides
    /// by the store.
    public var storeAttributes: StoreAttributes.Namespace?

    public init(backing: String, mountPoint: String) {
        self.backing = backing
        self.mountPoint = mountPoint
    }
}

/// The daemon's configuration (`/etc/custody/custody.toml`, see `config/custody.toml`).
public struct DaemonConfiguration: Equatable, Sendable {
    public static let defaultPath = "/etc/custody/custody.toml"
    public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    public var stateDirectory: String?
    public var socket: String?
    public var socketMode: UInt32?
    public var socketGroup: String?
    public var adminGroup: String?
    public var logLevel = "info"
    /// Scrub identities from logs, journal entries and support bundles (`Scrubber`); false only
    /// to debug, by the administrator's explicit choice.
    public var scrubAccountIdentities = true
    public var settings = Settings()
    public var mounts: [MountConfiguration] = []
    /// Accounts the daemon provisions at start and at every reload (`[[account]]`;
    /// `CustodyCore/Provisioning.swift`). Their `user`s are resolved by `declaredAccounts()`.
    public var accounts: [DeclaredAccount] = []
    /// The local user each `[[account]]` names by name (by its index), resolved on this machine.
    public var accountUsers: [Int: String] = [:]
    /// Follow logind's sessions (screen lock, suspend, logout lock identities).
    public var followSessions = true
    /// A loopback address and port that also serves the metrics (`metrics-listen`), or nil.
    public var metricsListen: LoopbackAddress?
    /// The file systems the guard watches (`[guard] file_systems`).
    public var guardFileSystems: GuardedFileSystems = .all

    public init() {}

    /// Reads and checks `path` (syntax, keys, types, values; not the file system: see
    /// `environmentErrors`).
    public static func load(path: String) throws(ConfigurationErrors) -> DaemonConfiguration {
        guard let text = readTextFile(path) else {
            throw ConfigurationErrors(errors: [ConfigurationError(file: path, key: "", message: "cannot read the file: \(String(cString: strerror(errno)))")])
        }
        return try parse(text, file: path)
    }

    public static func parse(_ text: String, file: String) throws(ConfigurationErrors) -> DaemonConfiguration {
        let root: TOMLTable
        do {
            root = try TOMLTable(string: text)
        } catch let error as TOMLParseError {
            throw ConfigurationErrors(errors: [ConfigurationError(file: file, line: error.source.begin.line, key: "", message: "invalid TOML: \(error.description)")])
        } catch {
            throw ConfigurationErrors(errors: [ConfigurationError(file: file, key: "", message: "invalid TOML: \(error)")])
        }
        var reader = Reader(file: file, lines: text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init))
        let configuration = reader.read(root)
        if !reader.errors.isEmpty { throw ConfigurationErrors(errors: reader.errors) }
        return configuration
    }

    /// Problems only the machine can show: backing directories that are missing or unreadable,
    /// mount points that are missing, groups that do not exist.
    public func environmentErrors(file: String, text: String? = nil) -> [ConfigurationError] {
        let reader = Reader(file: file, lines: (text ?? readTextFile(file) ?? "").split(separator: "\n", omittingEmptySubsequences: false).map(String.init))
        var errors: [ConfigurationError] = []
        for (index, mount) in mounts.enumerated() {
            var info = stat()
            if stat(mount.backing, &info) != 0 || info.st_mode & S_IFMT != S_IFDIR {
                errors.append(reader.error(["mount", "backing"], index: index, "backing directory \(mount.backing) does not exist or is not a directory"))
            } else if access(mount.backing, R_OK | W_OK | X_OK) != 0 {
                errors.append(reader.error(["mount", "backing"], index: index, "backing directory \(mount.backing) is not readable and writable"))
            }
            if stat(mount.mountPoint, &info) != 0 || info.st_mode & S_IFMT != S_IFDIR {
                errors.append(reader.error(["mount", "mount_point"], index: index, "mount point \(mount.mountPoint) does not exist or is not a directory"))
            }
        }
        for (index, user) in accountUsers.sorted(by: { $0.key < $1.key }) where getpwnam(user) == nil {
            errors.append(reader.error(["account", "user"], index: index, "no local user named \(user)"))
        }
        for (key, group) in [("group", socketGroup), ("admin_group", adminGroup)] {
            if let group, gid_t(group) == nil, getgrnam(group) == nil {
                errors.append(reader.error(["control", key], "no group named \(group)"))
            }
        }
        return errors
    }

    /// The declared accounts, each `user` resolved to its uid (one that names no user is left
    /// without: `environmentErrors` reports it).
    public func declaredAccounts() -> [DeclaredAccount] {
        accounts.enumerated().map { index, account in
            var account = account
            if let user = accountUsers[index], let entry = getpwnam(user) { account.uid = entry.pointee.pw_uid }
            return account
        }
    }
}

/// Walks the parsed document, collecting every error with its line.
struct Reader {
    let file: String
    let lines: [String]
    var errors: [ConfigurationError] = []

    init(file: String, lines: [String]) {
        self.file = file
        self.lines = lines
    }

    /// The line of `key` in `table` (the `index`th `[[table]]` for arrays of tables).
    func line(of path: [String], index: Int? = nil) -> Int? {
        guard let key = path.last else { return nil }
        if path.count == 1, let index {
            // The header of the index-th [[key]].
            var seen = -1
            for (number, raw) in lines.enumerated() where raw.drop(while: { $0 == " " || $0 == "\t" }).hasPrefix("[[") {
                let name = raw.drop { $0 == " " || $0 == "\t" }.dropFirst(2).prefix { $0 != "]" }.trimmingCharacters(in: " \t")
                if name == key { seen += 1 }
                if seen == index { return number + 1 }
            }
            return nil
        }
        let table = path.dropLast().joined(separator: ".")
        var current = ""
        var arrayIndex: [String: Int] = [:]
        var currentIndex: Int?
        for (number, raw) in lines.enumerated() {
            let line = raw.drop { $0 == " " || $0 == "\t" }
            if line.hasPrefix("[[") {
                current = String(line.dropFirst(2).prefix { $0 != "]" }).trimmingCharacters(in: " \t")
                currentIndex = arrayIndex[current, default: -1] + 1
                arrayIndex[current] = currentIndex
                continue
            }
            if line.hasPrefix("[") {
                current = String(line.dropFirst().prefix { $0 != "]" }).trimmingCharacters(in: " \t")
                // A sub-table of the last [[array]] entry ([account.policy]) belongs to that entry.
                let parent = current.split(separator: ".").first.map(String.init) ?? current
                currentIndex = current.contains(".") ? arrayIndex[parent] : nil
                // A table's own header, for an error about the whole table.
                if current == path.joined(separator: "."), index == nil || currentIndex == index { return number + 1 }
                continue
            }
            guard current == table, index == nil || currentIndex == index else { continue }
            let name = line.prefix { $0 != "=" }.trimmingCharacters(in: " \t\"'")
            if name == key, line.contains("=") { return number + 1 }
        }
        return nil
    }

    func error(_ path: [String], index: Int? = nil, _ message: String) -> ConfigurationError {
        let shown = index.map { i in path.count > 1 ? "\(path[0])[\(i + 1)]." + path.dropFirst().joined(separator: ".") : "\(path[0])[\(i + 1)]" }
            ?? path.joined(separator: ".")
        return ConfigurationError(file: file, line: line(of: path, index: index), key: shown, message: message)
    }

    mutating func fail(_ path: [String], index: Int? = nil, _ message: String) {
        errors.append(error(path, index: index, message))
    }

    // MARK: Typed values

    mutating func string(_ table: TOMLTable, _ path: [String], index: Int? = nil) -> String? {
        guard let key = path.last, let value = table[key] else { return nil }
        guard let string = value.string else { wrongType(value, "a string", path, index); return nil }
        return string
    }

    mutating func bool(_ table: TOMLTable, _ path: [String], index: Int? = nil) -> Bool? {
        guard let key = path.last, let value = table[key] else { return nil }
        guard let bool = value.bool else { wrongType(value, "true or false", path, index); return nil }
        return bool
    }

    mutating func number(_ table: TOMLTable, _ path: [String], index: Int? = nil) -> Double? {
        guard let key = path.last, let value = table[key] else { return nil }
        if let int = value.int { return Double(int) }
        guard let double = value.double else { wrongType(value, "a number", path, index); return nil }
        return double
    }

    mutating func integer(_ table: TOMLTable, _ path: [String], index: Int? = nil) -> Int? {
        guard let key = path.last, let value = table[key] else { return nil }
        guard let int = value.int else { wrongType(value, "an integer", path, index); return nil }
        return int
    }

    mutating func strings(_ table: TOMLTable, _ path: [String]) -> [String]? {
        guard let key = path.last, let value = table[key] else { return nil }
        guard let array = value.array else { wrongType(value, "an array of strings", path, nil); return nil }
        var result: [String] = []
        for element in array {
            guard let string = element.string else { wrongType(element, "an array of strings", path, nil); return nil }
            result.append(string)
        }
        return result
    }

    mutating func table(_ root: TOMLTable, _ key: String) -> TOMLTable? {
        guard let value = root[key] else { return nil }
        guard let table = value.table else { wrongType(value, "a table ([\(key)])", [key], nil); return nil }
        return table
    }

    mutating func wrongType(_ value: TOMLValueConvertible, _ wanted: String, _ path: [String], _ index: Int?) {
        fail(path, index: index, "must be \(wanted), not \(value.type == .int ? "an integer" : "a \(value.type)")")
    }

    mutating func unknownKeys(_ table: TOMLTable, allowed: [String], in prefix: [String], index: Int? = nil) {
        for key in table.keys where !allowed.contains(key) {
            let close = Spelling.closest(to: key, in: allowed).map { " (did you mean \($0)?)" } ?? ""
            fail(prefix + [key], index: index, "unknown key" + close)
        }
    }

    // MARK: The document

    static let topKeys = ["state", "log_level", "machine-key", "tpm2-pcrs", "tpm2-tcti", "metrics-listen", "control", "guard", "settings", "default_identities", "locations", "mount", "account"]
    static let controlKeys = ["socket", "mode", "group", "admin_group"]
    static let settingsKeys = ["MaxFileProtectionLevel", "MultiIdentity", "LockGracePeriod", "VerboseLoggingEnabled",
                               "ValuesToScrubFromLogging", "ScrubAccountIdentities", "AllowedAccounts", "PassphraseCost",
                               "TransferExemptExecutables", "TransferExemptUids", "LockOnSessionLock", "LockOnSuspend", "LockOnLogout",
                               "MaxUnlockAttempts", "UnlockAttemptsAction", "AllowedAccountsAction"]
    static let accountKeys = ["id", "upn", "user", "uid", "enroll", "policy"]
    static let mountKeys = ["backing", "mount_point", "allow_other", "allow_nonempty", "cache_timeout", "writeback_cache", "low_latency", "request_rings", "threads", "encrypt_names", "policy_required", "shared_store", "store_attributes"]

    mutating func read(_ root: TOMLTable) -> DaemonConfiguration {
        var configuration = DaemonConfiguration()
        unknownKeys(root, allowed: Self.topKeys, in: [])
        configuration.stateDirectory = absolutePath(string(root, ["state"]), ["state"])
        if let level = string(root, ["log_level"]) {
            if DaemonConfiguration.logLevels.contains(level) { configuration.logLevel = level } else {
                fail(["log_level"], "unknown level \(level) (\(DaemonConfiguration.logLevels.joined(separator: ", ")))")
            }
        }
        if let value = string(root, ["machine-key"]) {
            if let mode = MachineKeyMode(rawValue: value) { configuration.settings.machineKey = mode } else {
                fail(["machine-key"], "must be auto, tpm2 or file, not \(value)")
            }
        }
        if let value = root["tpm2-pcrs"] {
            if let array = value.array, array.allSatisfy({ $0.int.map { (0...23).contains($0) } ?? false }) {
                configuration.settings.tpm2PCRs = array.compactMap(\.int)
            } else {
                fail(["tpm2-pcrs"], "must be an array of PCR numbers (0 to 23), such as [7]")
            }
        }
        if let value = string(root, ["tpm2-tcti"]) {
            if value.isEmpty { fail(["tpm2-tcti"], "empty TCTI (for example device:/dev/tpmrm0)") } else { configuration.settings.tpm2TCTI = value }
        }
        if let value = string(root, ["metrics-listen"]) {
            do throws(LoopbackAddress.Problem) { configuration.metricsListen = try LoopbackAddress(value) } catch {
                fail(["metrics-listen"], error.message)
            }
        }
        if let control = table(root, "control") {
            unknownKeys(control, allowed: Self.controlKeys, in: ["control"])
            configuration.socket = absolutePath(string(control, ["control", "socket"]), ["control", "socket"])
            if let mode = string(control, ["control", "mode"]) {
                if let value = UInt32(mode, radix: 8), value <= 0o777 { configuration.socketMode = value } else {
                    fail(["control", "mode"], "must be octal permissions such as \"0660\", not \(mode)")
                }
            }
            configuration.socketGroup = string(control, ["control", "group"])
            configuration.adminGroup = string(control, ["control", "admin_group"])
        }
        if let guardTable = table(root, "guard") {
            unknownKeys(guardTable, allowed: ["file_systems"], in: ["guard"])
            if let value = guardTable["file_systems"] {
                if let word = value.string, word == "all" || word == "none" {
                    configuration.guardFileSystems = word == "all" ? .all : .none
                } else if let array = value.array, array.allSatisfy({ $0.string?.hasPrefix("/") == true }) {
                    configuration.guardFileSystems = .holding(array.compactMap(\.string))
                } else {
                    fail(["guard", "file_systems"], "must be \"all\", \"none\" or an array of absolute paths")
                }
            }
        }
        if let settings = table(root, "settings") { readSettings(settings, into: &configuration) }
        if let identities = table(root, "default_identities") {
            for key in identities.keys {
                guard let uid = UInt32(key) else {
                    fail(["default_identities", key], "keys are uids (numbers), not \(key)")
                    continue
                }
                if let identity = string(identities, ["default_identities", key]) {
                    if identity.isEmpty { fail(["default_identities", key], "empty identity") } else { configuration.settings.defaultIdentities[uid] = identity }
                }
            }
        }
        if let locations = table(root, "locations") { readLocations(locations, into: &configuration) }
        for (index, mount) in arrayOfTables(root, "mount") {
            if let parsed = readMount(mount, index: index) { configuration.mounts.append(parsed) }
        }
        var accountIndexes: [Int] = []
        for (index, account) in arrayOfTables(root, "account") {
            if let parsed = readAccount(account, index: index, into: &configuration) {
                configuration.accounts.append(parsed)
                accountIndexes.append(index)
            }
        }
        checkDeclaredAccounts(configuration, indexes: accountIndexes)
        var seen: [String: Int] = [:]
        for (index, mount) in configuration.mounts.enumerated() {
            if let first = seen[mount.mountPoint] {
                fail(["mount", "mount_point"], index: index, "\(mount.mountPoint) is already mount \(first + 1)")
            }
            seen[mount.mountPoint] = index
        }
        return configuration
    }

    mutating func readSettings(_ table: TOMLTable, into configuration: inout DaemonConfiguration) {
        let path = ["settings"]
        unknownKeys(table, allowed: Self.settingsKeys, in: path)
        if let name = string(table, path + ["MaxFileProtectionLevel"]) {
            if let level = ProtectionClass(name: name) { configuration.settings.maxFileProtectionLevel = level } else {
                fail(path + ["MaxFileProtectionLevel"], "unknown level \(name) (NSFileProtectionComplete, NSFileProtectionCompleteUnlessOpen, NSFileProtectionCompleteUntilFirstUserAuthentication, NSFileProtectionNone, or complete, completeUnlessOpen, untilFirstAuth, none)")
            }
        }
        if let value = bool(table, path + ["MultiIdentity"]) { configuration.settings.multiIdentity = value }
        if let value = number(table, path + ["LockGracePeriod"]) {
            if value >= 0, value.isFinite { configuration.settings.lockGracePeriod = value } else {
                fail(path + ["LockGracePeriod"], "must be a number of seconds, 0 or more")
            }
        }
        if let value = bool(table, path + ["VerboseLoggingEnabled"]) {
            configuration.settings.verboseLoggingEnabled = value
            if value { configuration.logLevel = "debug" }
        }
        if let values = strings(table, path + ["ValuesToScrubFromLogging"]) { configuration.settings.valuesToScrubFromLogging = values }
        if let value = bool(table, path + ["ScrubAccountIdentities"]) { configuration.scrubAccountIdentities = value }
        if let values = strings(table, path + ["AllowedAccounts"]) { configuration.settings.allowedAccounts = values }
        if let values = strings(table, path + ["TransferExemptExecutables"]) {
            for value in values where !value.hasPrefix("/") {
                fail(path + ["TransferExemptExecutables"], "must be absolute paths of programs, not \(value)")
            }
            configuration.settings.transferExemptExecutables = values
        }
        if let value = table["TransferExemptUids"] {
            if let array = value.array, array.allSatisfy({ $0.int.map { (0...Int(UInt32.max)).contains($0) } ?? false }) {
                configuration.settings.transferExemptUids = array.compactMap { $0.int.map(UInt32.init) }
            } else {
                fail(path + ["TransferExemptUids"], "must be an array of uids (numbers)")
            }
        }
        if let value = bool(table, path + ["LockOnSessionLock"]) { configuration.settings.lockOnSessionLock = value }
        if let value = bool(table, path + ["LockOnSuspend"]) { configuration.settings.lockOnSuspend = value }
        if let value = bool(table, path + ["LockOnLogout"]) { configuration.settings.lockOnLogout = value }
        if let value = integer(table, path + ["MaxUnlockAttempts"]) {
            if (0...1_000_000).contains(value) { configuration.settings.maxUnlockAttempts = value } else {
                fail(path + ["MaxUnlockAttempts"], "must be 0 (no limit) or a number of attempts")
            }
        }
        if let value = string(table, path + ["UnlockAttemptsAction"]) {
            if ["backoff", "wipe"].contains(value) { configuration.settings.unlockAttemptsAction = value } else {
                fail(path + ["UnlockAttemptsAction"], "must be backoff or wipe, not \(value)")
            }
        }
        if let value = string(table, path + ["AllowedAccountsAction"]) {
            if let action = AllowedAccountsAction(rawValue: value) { configuration.settings.allowedAccountsAction = action } else {
                fail(path + ["AllowedAccountsAction"], "must be warn, deregister or wipe, not \(value)")
            }
        }
        if let cost = string(table, path + ["PassphraseCost"]) {
            if ["interactive", "moderate", "minimal"].contains(cost) { configuration.settings.passphraseCost = cost } else {
                fail(path + ["PassphraseCost"], "must be interactive, moderate or minimal")
            }
        }
    }

    /// `[locations]`: a name (an SDK location such as `OneDriveForBusiness`, or the
    /// administrator's own) = the absolute directories it covers.
    mutating func readLocations(_ table: TOMLTable, into configuration: inout DaemonConfiguration) {
        for key in table.keys.sorted() {
            let path = ["locations", key]
            guard let location = Location(name: key) else {
                fail(path, "not a location name (letters, digits, '.', '_', '-' and spaces, at most 64 bytes)")
                continue
            }
            if [Location.accountDocument, .localDrive, .other, .cameraRoll].contains(location) {
                fail(path, "\(location.name) is not a directory location: it is worked out from the mounts and file systems")
                continue
            }
            guard let directories = strings(table, path) else { continue }
            var kept: [String] = []
            for directory in directories {
                if let absolute = absolutePath(directory, path) { kept.append(absolute) }
            }
            configuration.settings.locations[location.name] = kept
        }
    }

    mutating func readMount(_ table: TOMLTable, index: Int) -> MountConfiguration? {
        unknownKeys(table, allowed: Self.mountKeys, in: ["mount"], index: index)
        let backing = absolutePath(string(table, ["mount", "backing"], index: index), ["mount", "backing"], index: index)
        let mountPoint = absolutePath(string(table, ["mount", "mount_point"], index: index), ["mount", "mount_point"], index: index)
        if table["backing"] == nil { fail(["mount"], index: index, "missing key backing") }
        if table["mount_point"] == nil { fail(["mount"], index: index, "missing key mount_point") }
        var mount = MountConfiguration(backing: backing ?? "", mountPoint: mountPoint ?? "")
        if let value = bool(table, ["mount", "allow_other"], index: index) { mount.allowOther = value }
        if let value = bool(table, ["mount", "allow_nonempty"], index: index) { mount.allowNonEmpty = value }
        if let value = bool(table, ["mount", "writeback_cache"], index: index) { mount.writebackCache = value }
        if let value = bool(table, ["mount", "low_latency"], index: index) { mount.lowLatency = value }
        if let value = bool(table, ["mount", "request_rings"], index: index) { mount.requestRings = value }
        if let value = bool(table, ["mount", "encrypt_names"], index: index) { mount.encryptNames = value }
        if let value = bool(table, ["mount", "policy_required"], index: index) { mount.policyRequired = value }
        if let value = bool(table, ["mount", "shared_store"], index: index) { mount.sharedStore = value }
        if let value = string(table, ["mount", "store_attributes"], index: index) {
            if let namespace = StoreAttributes.Namespace(rawValue: value) {
                mount.storeAttributes = namespace
            } else {
                fail(["mount", "store_attributes"], index: index, "must be \"trusted\" or \"user\"")
            }
        }
        if let value = number(table, ["mount", "cache_timeout"], index: index) {
            if value >= 0, value.isFinite { mount.cacheTimeout = value } else { fail(["mount", "cache_timeout"], index: index, "must be 0 or more seconds") }
        }
        if let value = integer(table, ["mount", "threads"], index: index) {
            if (1...256).contains(value) { mount.threads = value } else { fail(["mount", "threads"], index: index, "must be between 1 and 256") }
        }
        return backing == nil || mountPoint == nil ? nil : mount
    }

    /// One `[[account]]`: its names, its local user, managed or not, and its policy (the policy
    /// document's fields, as the control API takes them, checked as strictly).
    mutating func readAccount(_ table: TOMLTable, index: Int, into configuration: inout DaemonConfiguration) -> DeclaredAccount? {
        unknownKeys(table, allowed: Self.accountKeys, in: ["account"], index: index)
        let id = string(table, ["account", "id"], index: index)
        let upn = string(table, ["account", "upn"], index: index)
        for key in ["id", "upn"] where table[key] == nil { fail(["account"], index: index, "missing key \(key)") }
        var declared = DeclaredAccount(id: id ?? "", upn: upn ?? "")
        for (key, value) in [("id", id), ("upn", upn)] {
            if let value, (try? Account.checkedName(value)) == nil { fail(["account", key], index: index, "not an identity: \(value.debugDescription)") }
        }
        if let value = bool(table, ["account", "enroll"], index: index) { declared.enroll = value }
        if let value = integer(table, ["account", "uid"], index: index) {
            if let uid = UInt32(exactly: value) { declared.uid = uid } else { fail(["account", "uid"], index: index, "must be a uid (0 to 4294967295)") }
        }
        if let user = string(table, ["account", "user"], index: index) {
            if table["uid"] != nil { fail(["account", "user"], index: index, "give user or uid, not both") }
            configuration.accountUsers[index] = user
        }
        if let value = table["policy"] {
            if let policy = value.table {
                if !declared.enroll { fail(["account", "policy"], index: index, "an account with enroll = false has no policy") }
                declared.policy = readPolicy(policy, index: index)
            } else {
                wrongType(value, "a table ([account.policy])", ["account", "policy"], index)
            }
        }
        return id == nil || upn == nil ? nil : declared
    }

    /// A policy table, read as the control API reads a policy document: unknown fields refused
    /// by name (with the field they resemble), values as `PUT /v1/accounts/{identity}/policy` takes them.
    mutating func readPolicy(_ table: TOMLTable, index: Int) -> Policy? {
        let json = table.convert(to: .json)
        do {
            return try StrictJSON.decode(Policy.self, from: Array(json.utf8))
        } catch let unknown as StrictJSON.UnknownKey {
            fail(["account", "policy", unknown.path], index: index, unknown.description)
        } catch let DecodingError.dataCorrupted(context) {
            fail(["account", "policy"] + context.codingPath.map(\.stringValue), index: index, context.debugDescription)
        } catch let DecodingError.typeMismatch(_, context) {
            fail(["account", "policy"] + context.codingPath.map(\.stringValue), index: index, "wrong type: \(context.debugDescription)")
        } catch {
            fail(["account", "policy"], index: index, "\(error)")
        }
        return nil
    }

    /// The tables of `[[key]]` with their positions; an element that is not a table, or a `key`
    /// that is not an array of tables, is reported and left out.
    mutating func arrayOfTables(_ root: TOMLTable, _ key: String) -> [(index: Int, table: TOMLTable)] {
        guard let value = root[key] else { return [] }
        guard let array = value.array else {
            fail([key], "must be an array of tables ([[\(key)]])")
            return []
        }
        var tables: [(index: Int, table: TOMLTable)] = []
        for (index, element) in array.enumerated() {
            if let table = element.table { tables.append((index, table)) } else { fail([key], index: index, "each [[\(key)]] must be a table") }
        }
        return tables
    }

    /// What the accounts declare together: one object ID and UPN each, and (when the settings
    /// allow only some accounts) managed ones that are allowed.
    mutating func checkDeclaredAccounts(_ configuration: DaemonConfiguration, indexes: [Int]) {
        var seen: [String: Int] = [:]
        for (account, index) in zip(configuration.accounts, indexes) {
            let names = [account.id, account.upn]
            if let (name, first) = names.lazy.compactMap({ name in seen[IdentityKey(name).folded].map { (name, $0) } }).first {
                fail(["account"], index: index, "\(name) is already account[\(first + 1)]")
            }
            for name in names where seen[IdentityKey(name).folded] == nil { seen[IdentityKey(name).folded] = index }
            if account.enroll, !Engine.isAllowed(id: account.id, upn: account.upn, configuration.settings.allowedAccounts) {
                fail(["account", "upn"], index: index, "\(account.upn) is declared managed but settings.AllowedAccounts does not name it")
            }
        }
    }

    /// Paths must be absolute; a trailing slash is dropped.
    mutating func absolutePath(_ value: String?, _ path: [String], index: Int? = nil) -> String? {
        guard let value else { return nil }
        guard value.hasPrefix("/") else {
            fail(path, index: index, "must be an absolute path, not \(value)")
            return nil
        }
        var trimmed = value
        while trimmed.count > 1, trimmed.hasSuffix("/") { trimmed.removeLast() }
        return trimmed
    }
}
