import Synchronization

/// The guard's part in a read. Before a mount serves a managed identity's file for reading, it
/// asks whether the reading process may hold that identity's data; from then on the guard keeps
/// the process, and the children it starts afterwards, to the identity's save-to locations. The
/// engine knows nothing of how the guard enforces it (CustodyGuard: fanotify permission events).
public protocol DataHolders: AnyObject, Sendable {
    /// nil once the process of `thread` holds `account`'s data; otherwise why it may not read it
    /// (it has a file open for writing where the identity may not save).
    func admit(thread: Int32, holding account: Account) -> String?
    /// nil once the process of `thread` may write into `account`'s files (it then receives that
    /// identity's data, and reads only from its open-from locations while it writes); otherwise
    /// why not (it has a file open for reading from a location the identity may not open from).
    func admit(thread: Int32, writingInto account: Account) -> String?
    /// What the guard covers now, for the status and the metrics.
    var status: GuardStatus { get }
}

/// The guard's state: `level` is `fanotify` (every process that holds managed data is kept to
/// its save-to locations on `fileSystems`), `off` (configured so) or `unavailable` (the kernel
/// refused; `reason` says what).
public struct GuardStatus: Codable, Equatable, Sendable {
    public var level: String
    public var reason: String?
    /// Mount points of the watched file systems.
    public var fileSystems: [String]
    /// Processes that hold managed data now.
    public var holders: Int
    /// Creations and opens for writing refused since the start.
    public var refusals: UInt64

    public init(level: String, reason: String?, fileSystems: [String], holders: Int, refusals: UInt64) {
        self.level = level
        self.reason = reason
        self.fileSystems = fileSystems
        self.holders = holders
        self.refusals = refusals
    }
}

/// Which file systems the guard watches (`[guard] file_systems` in the configuration).
public enum GuardedFileSystems: Equatable, Sendable {
    /// Every file system that stores data: disks, tmpfs (/dev/shm, /tmp), removable media and
    /// network shares, also those mounted later; not pseudo file systems (/proc, /sys, …) and not
    /// Custody's own mounts (the mount enforces its own rules).
    case all
    /// None: the guard is off.
    case none
    /// The file systems that hold these paths, and those mounted below them, also later
    /// (`/media` covers a USB stick mounted at /media/dana/STICK when it comes).
    case holding([String])
}

/// What the guard decides with, as of one policy generation: the configured directories and,
/// for every managed identity whose policy lists save-to locations, the locations it allows.
public struct SaveRules: Sendable {
    public let generation: UInt64
    /// Configured directories and their location names, deepest first.
    public let directories: [(path: String, location: String)]
    /// Keyed by the identity's UPN as registered.
    public let allowed: [String: Set<String>]
    /// For every managed identity whose policy lists open-from locations: the names it allows.
    public let openable: [String: Set<String>]

    public init(generation: UInt64, directories: [(path: String, location: String)], allowed: [String: Set<String>],
                openable: [String: Set<String>] = [:]) {
        self.generation = generation
        self.directories = directories
        self.allowed = allowed
        self.openable = openable
    }

    /// Whether every identity in `identities` may take data opened from `location`.
    public func allows(_ identities: Set<String>, toOpenFrom location: String) -> Bool {
        identities.allSatisfy { openable[$0]?.contains(location) ?? true }
    }

    /// Whether every identity in `identities` may save to `location`. An identity the rules do not
    /// name (its policy lists no locations now, or it is gone) restricts nothing.
    public func allows(_ identities: Set<String>, toSaveTo location: String) -> Bool {
        identities.allSatisfy { allowed[$0]?.contains(location) ?? true }
    }

    /// The location of `path` (absolute, resolved) when a configured directory holds it.
    public func configuredLocation(of path: String) -> String? {
        directories.first { path.isPath(inside: $0.path) }?.location
    }
}

extension Engine {
    /// The guard, once the daemon started one.
    public var dataHolders: (any DataHolders)? { dataHoldersBox.withLock { $0 } }
    public func attach(holders: any DataHolders) { dataHoldersBox.withLock { $0 = holders } }

    /// The account whose data a reader of a file owned by `owner` comes to hold, when its policy
    /// restricts where that data may be saved; nil otherwise (no lookup when no policy does).
    public func savingRestricted(owner: String?) -> Account? {
        guard let owner else { return nil }
        let rules = saveRules()
        guard !rules.allowed.isEmpty, let account = try? account(owner), rules.allowed[account.upn] != nil else { return nil }
        return account
    }

    /// Whether `party` reads `account`'s data as an exempt uid or program (the transfer
    /// exemptions of the settings and of the policy): such a reader is not kept to the save-to
    /// locations either (a backup agent, an indexer).
    public func exemptFromHolding(_ party: TransferParty, account: Account) -> Bool {
        exemption(of: party, policies: account.policy.map { [$0] } ?? []).exempt != nil
    }

    /// The account a writer into a file owned by `owner` sends data to, when its policy restricts
    /// where that data may be opened from; nil otherwise.
    public func openingRestricted(owner: String?) -> Account? {
        guard let owner else { return nil }
        let rules = saveRules()
        guard !rules.openable.isEmpty, let account = try? account(owner), rules.openable[account.upn] != nil else { return nil }
        return account
    }

    /// The rules as of now, recomputed when a policy or the settings changed.
    public func saveRules() -> SaveRules {
        let generation = policyGeneration.load(ordering: .acquiring)
        if let cached = saveRulesBox.withLock({ $0 }), cached.generation == generation { return cached }
        var directories: [(path: String, location: String)] = []
        for (name, paths) in settings.locations {
            for path in paths { directories.append((Self.normalized(path), name)) }
        }
        directories.sort { $0.path.utf8.count > $1.path.utf8.count }
        var allowed: [String: Set<String>] = [:], openable: [String: Set<String>] = [:]
        for account in accounts() {
            if let locations = account.policy?.saveToLocations { allowed[account.upn] = Set(locations.compactMap { Location(name: $0)?.name }) }
            if let locations = account.policy?.openFromLocations { openable[account.upn] = Set(locations.compactMap { Location(name: $0)?.name }) }
        }
        let rules = SaveRules(generation: generation, directories: directories, allowed: allowed, openable: openable)
        saveRulesBox.withLock { $0 = rules }
        return rules
    }

    /// Reports a refused save: a `saveBlocked` event (`openFrom`: a refused flow of data from a
    /// location into the identity, an `openFromBlocked` event) (at most `EventRateLimiter.perSecond` a
    /// second; the rest are counted in the next one) with the process, the identities whose data
    /// it holds, the location and the path (scrubbed as the log scrubs it).
    public func reportBlockedSave(pid: Int32, uid: UInt32?, executable: String?, identities: [String], location: String,
                                  path: String, operation: String, reason: String, openFrom: Bool = false) {
        guard let suppressed = saveEvents.admit(now: clock.now()) else { return }
        var details = ["pid": "\(pid)", "operation": operation, "location": location, "path": scrubbedPath(path),
                       "reason": reason, "executable": executable ?? "unknown", "identities": identities.joined(separator: ",")]
        if let uid { details["uid"] = "\(uid)" }
        if suppressed > 0 { details["suppressed"] = "\(suppressed)" }
        if openFrom {
            events.emit(.openFromBlocked, identity: identities.first,
                        "blocked: data from \(location) into \(identities.joined(separator: ", "))'s files (\(operation))", details: details)
        } else {
            events.emit(.saveBlocked, identity: identities.first,
                        "blocked: \(operation) in \(location) by a process holding \(identities.joined(separator: ", "))'s data", details: details)
        }
    }
}
