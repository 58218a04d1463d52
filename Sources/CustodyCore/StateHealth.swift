import CustodyFormat
import CustodySystem
import FoundationEssentials
import Glibc

/// Something wrong with the state directory, found at start or since: the daemon starts and
/// serves what it can, and says what it could not use (in the log, the event stream and the status).
///
/// What the state holds decides what a problem does:
/// - Accounts (`accounts.json`), wipe journals (`wipes/`) and machine keys are the state's
///   backbone: one that cannot be read stops the daemon with an error naming it, and nothing is
///   changed, so that restoring a backup (or moving the file aside on purpose) is the
///   administrator's choice.
/// - An identity's keybag that is missing or cannot be read makes that identity unavailable
///   (`EngineError.keysUnavailable`: its files answer EACCES); every other identity is served.
///   The file is left as it is.
/// - Bindings (`bindings.json`) and unlock attempts (`attempts.json`) are set aside (renamed with
///   the time, `*.unreadable-YYYYMMDDTHHMMSSZ`) and started afresh: bound processes lose their
///   identity until bound again, and every identity counts as at the back-off limit until its
///   next right credential, so that damaging the file cannot reset a guessing counter.
/// - A keybag no account names (its account was removed from `accounts.json`, or the state
///   directory was assembled from pieces) is reported and kept: enrolling the same object ID again
///   reuses it, and with it every file of that identity opens again.
/// - Files in a mount owned by a managed identity the state does not know are reported once per
///   owner (`unknownOwner`): the state directory may not be the one that protected them.
public struct StateProblem: Codable, Equatable, Sendable {
    public enum Kind: String, Codable, Sendable {
        /// A file that could not be read was renamed and started afresh (`setAsideAs`).
        case setAside
        /// An enrolled identity's keybag is missing or cannot be read: the identity is unavailable.
        case keybagUnusable
        /// A keybag that no account names.
        case orphanedKeybag
        /// A mount holds files of a managed identity that no account names.
        case unknownOwner
        /// No machine key opens the state key: the accounts are unknown until a recovery key opens it.
        case sealed
        /// A recovery key that recovers its identity but cannot open sealed state (made before the state key).
        case recoveryKeyOutdated
    }

    public var kind: Kind
    /// The file in the state directory (relative), or the mount's backing directory.
    public var file: String
    public var message: String
    /// The identity concerned (an object ID), where one is known.
    public var identity: String?
    /// Where an unreadable file was moved (relative to the state directory).
    public var setAsideAs: String?

    public init(kind: Kind, file: String, message: String, identity: String? = nil, setAsideAs: String? = nil) {
        self.kind = kind
        self.file = file
        self.message = message
        self.identity = identity
        self.setAsideAs = setAsideAs
    }
}

extension Engine {
    /// What is wrong with the state directory (see `StateProblem`), oldest first.
    public var stateProblems: [StateProblem] { state.withLock { $0.problems } }

    /// Why an enrolled identity cannot be opened: its machine key cannot be had, or its keybag
    /// cannot be used; nil when it can.
    public func unavailability(of account: Account) -> String? {
        let key = account.key
        return state.withLock { $0.stranded[key] ?? $0.unusable[key] }
    }

    /// Notes a problem found while serving (the mount's unknown owners), once per kind, file and
    /// identity, with an event.
    public func reportStateProblem(_ problem: StateProblem) {
        let added = state.withLock { state -> Bool in
            guard !state.problems.contains(where: { $0.kind == problem.kind && $0.file == problem.file && $0.identity == problem.identity }) else {
                return false
            }
            state.problems.append(problem)
            return true
        }
        if added { Self.emit(problem, on: events) }
    }

    static func emit(_ problem: StateProblem, on events: EventBus) {
        var details = ["problem": problem.kind.rawValue, "file": problem.file]
        if let moved = problem.setAsideAs { details["setAsideAs"] = moved }
        if let identity = problem.identity { details["id"] = identity }
        events.emit(.stateProblem, code: 310, problem.message, details: details)
    }

    /// A non-critical state file, or nil when it is missing or could not be read. One that cannot
    /// be read is renamed aside (see `StateProblem`), and the problem added to `problems`.
    static func readOrSetAside<T: Decodable>(_ type: T.Type, from name: String, files: StateFiles, what: String,
                                             problems: inout [StateProblem]) -> T? {
        do {
            return try files.read(type, from: name)
        } catch {
            let moved = setAside(name, files: files)
            problems.append(StateProblem(kind: .setAside, file: name,
                                         message: "\(files.path(name)) cannot be read (\(error.description)); " +
                                             (moved.map { "moved to \(files.path($0)); " } ?? "it could not be moved aside; ") + what,
                                         setAsideAs: moved))
            return nil
        }
    }

    /// Renames an unreadable state file to `NAME.unreadable-TIME` beside it; nil when it cannot.
    static func setAside(_ name: String, files: StateFiles) -> String? {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        let stamp = "\(parts.tm_year + 1900)\(two(parts.tm_mon + 1))\(two(parts.tm_mday))T\(two(parts.tm_hour))\(two(parts.tm_min))\(two(parts.tm_sec))Z"
        var target = name + ".unreadable-" + stamp
        var suffix = 1
        while access(files.path(target), F_OK) == 0 {
            suffix += 1
            target = name + ".unreadable-" + stamp + "-\(suffix)"
        }
        do { try Syscall.renameat2(AT_FDCWD, files.path(name), AT_FDCWD, files.path(target), Linux.RENAME_NOREPLACE) } catch { return nil }
        return target
    }

    /// Keybags in the state directory that no account names (`orphanedKeybag`).
    static func orphanedKeybags(_ files: StateFiles, accounts: [Account], pendingWipes: [Account]) -> [StateProblem] {
        let named = Set((accounts + pendingWipes).map { String(files.keybagName($0.id).dropFirst("keybags/".count)) })
        return files.list("keybags").filter { $0.hasSuffix(".json") && !$0.contains(".tmp-") && !named.contains($0) }.sorted().map { name in
            let identity = (try? files.read(StoredKeybag.self, from: "keybags/" + name))?.identity
            let whose = identity.map { "identity \($0)" } ?? "an identity whose keybag cannot be read"
            return StateProblem(kind: .orphanedKeybag, file: "keybags/" + name,
                                message: "keybags/\(name) holds the keys of \(whose), but no account names it (accounts.json lost or replaced?); " +
                                    "its files stay unreadable until that object ID is enrolled again, which reuses the keybag",
                                identity: identity)
        }
    }
}

extension Engine {
    /// Looks at the owner records of up to `limit` files and directories of a backing directory
    /// (breadth first) for managed owners no account names, and reports each
    /// (`StateProblem.Kind.unknownOwner`): a state directory that does not match the files it
    /// protects (a lost `accounts.json`, a restored backing store, another machine's state) shows
    /// at start rather than as EACCES file by file. Returns the unknown owners' object IDs and how
    /// many of the files looked at each owns.
    @discardableResult
    public func checkOwners(in backingDirectory: String, records: StoreAttributes = .trusted, limit: Int = 5000) -> [String: Int] {
        var unknown: [String: Int] = [:]
        // Paths as bytes: a name need not be UTF-8.
        var pending = [FileName(backingDirectory)]
        var looked = 0
        while let directory = pending.first, looked < limit {
            pending.removeFirst()
            guard let fd = try? Syscall.open(directory.cString, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) else { continue }
            defer { Syscall.close(fd) }
            guard let names = try? Syscall.directoryNames(in: fd) else { continue }
            for name in names where looked < limit {
                looked += 1
                guard let attributes = try? Syscall.fstatat(fd, name.cString, AT_SYMLINK_NOFOLLOW) else { continue }
                let kind = attributes.st_mode & S_IFMT
                if kind == S_IFDIR { pending.append(name.appended(to: directory)) }
                guard kind == S_IFREG || kind == S_IFDIR, let record = try? OwnerRecord.load(in: fd, name: name.cString, names: records),
                      record.encryptedClass != nil else { continue }
                let owner: String
                let known: Bool
                switch record.holder {
                case .named(let named):
                    owner = named.canonical
                    known = state.withLock { state in
                        state.accounts.contains { $0.matches(owner) } || state.pendingWipes.contains { $0.matches(owner) }
                    }
                case .keyID(let id):
                    known = account(forKeyID: id) != nil || state.withLock { $0.pendingWipes.contains { $0.keyIDs?.contains(hexString(id)) == true } }
                    // Asked only of owners no account names: it reads the keybags.
                    owner = known ? "" : unknownOwner(keyID: id)
                }
                if !known { unknown[owner, default: 0] += 1 }
            }
        }
        for (owner, count) in unknown.sorted(by: { $0.key < $1.key }) {
            reportUnknownOwner(owner, in: backingDirectory, seen: "\(count) of the first \(looked) entries looked at")
        }
        return unknown
    }

    /// Reports encrypted files of a managed owner no account names in a backing directory (once per owner).
    public func reportUnknownOwner(_ owner: String, in backingDirectory: String, seen: String) {
        reportStateProblem(StateProblem(kind: .unknownOwner, file: backingDirectory,
                                        message: "\(backingDirectory) holds encrypted files of \(owner), which no account names (\(seen)); " +
                                            "they answer EACCES. Is this the state directory that protected them? " +
                                            "Enrolling that object ID again with its keybag restores them",
                                        identity: owner))
    }
}
