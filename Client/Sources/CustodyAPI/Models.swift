import FoundationEssentials

/// The API's documents (docs/api.md, docs/openapi.yaml), as the daemon writes them and clients
/// read them. Clients decode them leniently: fields a newer daemon adds are ignored.

/// An account's policy (the SDK's policy settings).
public struct CustodyPolicy: Codable, Equatable, Sendable {
    public var fileEncryptionRequired: Bool?
    /// complete, completeUnlessOpen, untilFirstAuth, none (or Apple's NSFileProtection* names).
    public var protectionLevel: String?
    public var fileProviderEncryptionRequired: Bool?
    public var canShareWithOtherIdentities: Bool?
    public var canReceiveFromUnmanaged: Bool?
    /// all, managed or none: which other identities may read its data.
    public var sendToOtherIdentities: String?
    /// all, managed or none: from which other identities it accepts data.
    public var receiveFromOtherIdentities: String?
    /// Locations its data may be saved to (nil: every location).
    public var saveToLocations: [String]?
    /// Locations data may be opened from into it (nil: every location).
    public var openFromLocations: [String]?
    public var transferExemptExecutables: [String]?
    public var transferExemptUids: [UInt32]?
    /// Whether a screen lock, a suspend, a logout locks it (nil: the daemon's settings).
    public var lockOnSessionLock: Bool?
    public var lockOnSuspend: Bool?
    public var lockOnLogout: Bool?

    public init(fileEncryptionRequired: Bool? = nil, protectionLevel: String? = nil, fileProviderEncryptionRequired: Bool? = nil,
                canShareWithOtherIdentities: Bool? = nil, canReceiveFromUnmanaged: Bool? = nil) {
        self.fileEncryptionRequired = fileEncryptionRequired
        self.protectionLevel = protectionLevel
        self.fileProviderEncryptionRequired = fileProviderEncryptionRequired
        self.canShareWithOtherIdentities = canShareWithOtherIdentities
        self.canReceiveFromUnmanaged = canReceiveFromUnmanaged
    }
}

public struct CustodyAccount: Codable, Equatable, Sendable {
    public var id: String
    public var upn: String
    public var enrolled: Bool
    public var policy: CustodyPolicy?
    public var uid: UInt32?
    public var hasPassphrase: Bool?
    public var reprotectPending: Bool?

    public init(id: String, upn: String, enrolled: Bool, policy: CustodyPolicy? = nil, uid: UInt32? = nil) {
        self.id = id
        self.upn = upn
        self.enrolled = enrolled
        self.policy = policy
        self.uid = uid
    }
    /// unlocked, locking or locked (in status answers).
    public var lock: String?
    /// The owner's login password unlocks it too.
    public var hasLoginProtector: Bool?
    /// A recovery key unlocks it too.
    public var hasRecoveryKey: Bool?
    /// Wrong passphrases in a row, and the wait before the next attempt (in status answers).
    public var failedUnlockAttempts: Int?
    public var retryAfterSeconds: Double?
    /// Why an enrolled identity cannot be opened (its machine key or its keybag), in status answers.
    public var unavailable: String?
    /// False for an enrolled account that `AllowedAccounts` does not name (absent otherwise).
    public var allowed: Bool?
    /// Generations of class keys its keybag holds: 1, and one more per rotation (absent for an
    /// account that is not enrolled).
    public var keyGenerations: Int?
}

/// `GET /v1/allowed-accounts`: the accounts that may enroll (empty: any), what happens to enrolled
/// accounts the list does not name, and which those are.
public struct CustodyAllowedAccounts: Codable, Equatable, Sendable {
    public var allowedAccounts: [String]
    /// `warn`, `deregister` or `wipe` (`AllowedAccountsAction`).
    public var action: String
    public var notAllowed: [String]

    public init(allowedAccounts: [String], action: String, notAllowed: [String]) {
        self.allowedAccounts = allowedAccounts
        self.action = action
        self.notAllowed = notAllowed
    }
}

public struct CustodyMount: Codable, Equatable, Sendable {
    public var mountPoint: String
    public var backing: String

    public init(mountPoint: String, backing: String) {
        self.mountPoint = mountPoint
        self.backing = backing
    }
}

public struct CustodyStatus: Codable, Equatable, Sendable {
    public var version: String
    public var mounts: [CustodyMount]
    public var accounts: [CustodyAccount]
    public var machineKey: CustodyMachineKey?
    /// What the daemon could not use in its state directory, or found not matching it.
    public var stateProblems: [CustodyStateProblem]?
    /// What keeps processes that hold managed data to their save-to locations.
    public var `guard`: CustodyGuardStatus?

    public init(version: String, mounts: [CustodyMount], accounts: [CustodyAccount], machineKey: CustodyMachineKey? = nil,
                stateProblems: [CustodyStateProblem]? = nil, guard guardStatus: CustodyGuardStatus? = nil) {
        self.version = version
        self.mounts = mounts
        self.accounts = accounts
        self.machineKey = machineKey
        self.stateProblems = stateProblems
        self.guard = guardStatus
    }
}

/// The guard (docs/guard.md): `fanotify` when every process that read a managed identity's data
/// is kept to its save-to locations on `fileSystems`; `off` when configured so; `unavailable`
/// when the kernel refused (`reason`).
public struct CustodyGuardStatus: Codable, Equatable, Sendable {
    public var level: String
    public var reason: String?
    /// Mount points of the watched file systems.
    public var fileSystems: [String]
    /// Processes that hold managed data now.
    public var holders: Int
    /// Creations and opens for writing refused since the start.
    public var refusals: UInt64

    public init(level: String, reason: String? = nil, fileSystems: [String], holders: Int, refusals: UInt64) {
        self.level = level
        self.reason = reason
        self.fileSystems = fileSystems
        self.holders = holders
        self.refusals = refusals
    }
}

/// Something wrong with the daemon's state directory (in the status).
public struct CustodyStateProblem: Codable, Equatable, Sendable {
    /// setAside, keybagUnusable, orphanedKeybag, unknownOwner, sealed or recoveryKeyOutdated.
    public var kind: String
    public var file: String
    public var message: String
    public var identity: String?
    public var setAsideAs: String?

    public init(kind: String, file: String, message: String, identity: String? = nil, setAsideAs: String? = nil) {
        self.kind = kind
        self.file = file
        self.message = message
        self.identity = identity
        self.setAsideAs = setAsideAs
    }
}

/// Where the daemon keeps its machine key (`GET /v1/machine-key`, and in the status).
public struct CustodyMachineKey: Codable, Equatable, Sendable {
    public struct DictionaryAttack: Codable, Equatable, Sendable {
        public var failures: Int
        public var maxTries: Int
        public var intervalSeconds: Int

        public init(failures: Int, maxTries: Int, intervalSeconds: Int) {
            self.failures = failures
            self.maxTries = maxTries
            self.intervalSeconds = intervalSeconds
        }
    }

    public struct Key: Codable, Equatable, Sendable {
        public var id: String
        public var store: String
        public var current: Bool
        public var available: Bool
        public var problem: String?

        public init(id: String, store: String, current: Bool, available: Bool, problem: String? = nil) {
            self.id = id
            self.store = store
            self.current = current
            self.available = available
            self.problem = problem
        }
    }

    /// "tpm2" or "file".
    public var store: String?
    public var id: String?
    public var pcrs: [Int]
    public var tpm: String?
    /// The TPM's dictionary-attack counter: wrong passphrases count there too.
    public var dictionaryAttack: DictionaryAttack?
    public var problem: String?
    public var keys: [Key]
    public var warning: String?
    /// Identities that cannot be opened without a lost machine key.
    public var stranded: [String]

    public init(store: String? = nil, id: String? = nil, pcrs: [Int], tpm: String? = nil, dictionaryAttack: DictionaryAttack? = nil, problem: String? = nil, keys: [Key], warning: String? = nil, stranded: [String]) {
        self.store = store
        self.id = id
        self.pcrs = pcrs
        self.tpm = tpm
        self.dictionaryAttack = dictionaryAttack
        self.problem = problem
        self.keys = keys
        self.warning = warning
        self.stranded = stranded
    }
}

public struct FileProtectionInfo: Codable, Equatable, Sendable {
    public var path: String
    public var kind: String
    public var owner: String?
    public var managed: Bool
    public var encrypted: Bool
    public var protectionClass: String?
    public var size: UInt64
    public var mountPoint: String?
    /// Why a file of a managed owner is plain (absent for every other file).
    public var plainReason: String?

    public init(path: String, kind: String, owner: String? = nil, managed: Bool, encrypted: Bool, protectionClass: String? = nil, size: UInt64,
                mountPoint: String? = nil, plainReason: String? = nil) {
        self.path = path
        self.kind = kind
        self.owner = owner
        self.managed = managed
        self.encrypted = encrypted
        self.protectionClass = protectionClass
        self.size = size
        self.mountPoint = mountPoint
        self.plainReason = plainReason
    }
}

public struct DataProtectionInfo: Codable, Equatable, Sendable {
    public var isProtected: Bool
    public var owner: String?
    public var managed: Bool
    public var encrypted: Bool
    public var protectionClass: String?

    public init(isProtected: Bool, owner: String? = nil, managed: Bool, encrypted: Bool, protectionClass: String? = nil) {
        self.isProtected = isProtected
        self.owner = owner
        self.managed = managed
        self.encrypted = encrypted
        self.protectionClass = protectionClass
    }
}

public struct SharingDecision: Codable, Equatable, Sendable {
    public var allowed: Bool
    public var reason: String
    /// For a refusal: 312 SharingNotAllowed (the owner's policy), 313 ReceivingNotAllowed (the receiver's).
    public var code: Int?
    public var name: String?

    public init(allowed: Bool, reason: String, code: Int? = nil, name: String? = nil) {
        self.allowed = allowed
        self.reason = reason
        self.code = code
        self.name = name
    }
}

/// The SDK's save and open locations (`IntuneMAMSaveLocation*`, `IntuneMAMOpenLocation*`) by
/// name; an administrator's own locations are other names.
public enum SDKLocation: String, Sendable, CaseIterable {
    case accountDocument = "AccountDocument"
    case localDrive = "LocalDrive"
    case oneDriveForBusiness = "OneDriveForBusiness"
    case sharePoint = "SharePoint"
    case other = "Other"
    /// Never matches a path on Linux.
    case cameraRoll = "CameraRoll"
}

/// A location and the directories it covers; with an account, what its policy allows there.
public struct LocationSummary: Codable, Equatable, Sendable {
    public var name: String
    public var paths: [String]
    public var neverMatches: Bool
    public var saveToAllowed: Bool?
    public var openFromAllowed: Bool?

    public init(name: String, paths: [String], neverMatches: Bool, saveToAllowed: Bool? = nil, openFromAllowed: Bool? = nil) {
        self.name = name
        self.paths = paths
        self.neverMatches = neverMatches
        self.saveToAllowed = saveToAllowed
        self.openFromAllowed = openFromAllowed
    }
}

/// The location of a path.
public struct PathLocation: Codable, Equatable, Sendable {
    public var path: String
    public var location: String
    /// The configured directory, mount point or file system the path is under.
    public var under: String

    public init(path: String, location: String, under: String) {
        self.path = path
        self.location = location
        self.under = under
    }
}

public struct LocationAnswer: Codable, Equatable, Sendable {
    public var location: String
    public var account: String?
    public var allowed: Bool

    public init(location: String, account: String?, allowed: Bool) {
        self.location = location
        self.account = account
        self.allowed = allowed
    }
}

/// `GET /v1/locations`.
public struct LocationList: Codable, Equatable, Sendable {
    public var locations: [LocationSummary]

    public init(locations: [LocationSummary]) { self.locations = locations }
}

/// The identity a process (or thread) acts as, and where it comes from (`binding`, `parent`,
/// `uid`, `primary`, `none`).
public struct ProcessIdentity: Codable, Equatable, Sendable {
    public var pid: Int32
    public var identity: String?
    public var source: String

    public init(pid: Int32, identity: String?, source: String) {
        self.pid = pid
        self.identity = identity
        self.source = source
    }
}

/// An identity's lock state: unlocked, locking (in its grace period) or locked.
public struct LockState: Codable, Equatable, Sendable {
    public var identity: String
    public var lock: String

    public init(identity: String, lock: String) {
        self.identity = identity
        self.lock = lock
    }
}

/// `POST /v1/unlock`: the caller's identities that need a passphrase and stay locked.
public struct UnlockAllResult: Codable, Equatable, Sendable {
    public var stillLocked: [String]

    public init(stillLocked: [String]) { self.stillLocked = stillLocked }
}

/// `POST /v1/files/is-encrypted`.
public struct EncryptedAnswer: Codable, Equatable, Sendable {
    public var path: String
    public var encrypted: Bool

    public init(path: String, encrypted: Bool) {
        self.path = path
        self.encrypted = encrypted
    }
}

/// What a repair did (`POST /v1/files/repair`).
public struct RepairResult: Codable, Equatable, Sendable {
    public var path: String
    public var repaired: Bool
    /// nil: the stored length was one no file can have.
    public var sizeBefore: UInt64?
    public var sizeAfter: UInt64
    public var firstDamagedBlock: UInt64?

    public init(path: String, repaired: Bool, sizeBefore: UInt64?, sizeAfter: UInt64, firstDamagedBlock: UInt64?) {
        self.path = path
        self.repaired = repaired
        self.sizeBefore = sizeBefore
        self.sizeAfter = sizeAfter
        self.firstDamagedBlock = firstDamagedBlock
    }
}

/// The data routes' answer: bytes in base64, and as a string when they are UTF-8 (unprotect).
public struct DataResult: Codable, Equatable, Sendable {
    public var data: String
    public var string: String?
    public var size: Int

    public init(data: String, string: String?, size: Int) {
        self.data = data
        self.string = string
        self.size = size
    }
}

/// What closing a login session did (`POST /v1/login/lock`).
public struct SessionClosed: Codable, Equatable, Sendable {
    /// The identities that lock (after their grace period): none while other sessions are open.
    public var locking: [String]
    /// The user's other login sessions still open (PAM's, and logind's where it is followed).
    public var otherSessions: Int

    public init(locking: [String], otherSessions: Int) {
        self.locking = locking
        self.otherSessions = otherSessions
    }
}

/// The result of a wipe (code 104 UnenrollmentSuccess).
public struct WipeResult: Codable, Equatable, Sendable {
    public var identity: String
    public var code: Int
    public var result: String
    /// From the start of the wipe until the identity's keys were gone (its data unreadable).
    public var keysDestroyedSeconds: Double
    public var scanned: Int
    public var deleted: Int
    public var bytesFreed: UInt64

    public init(identity: String, code: Int, result: String, keysDestroyedSeconds: Double, scanned: Int, deleted: Int, bytesFreed: UInt64) {
        self.identity = identity
        self.code = code
        self.result = result
        self.keysDestroyedSeconds = keysDestroyedSeconds
        self.scanned = scanned
        self.deleted = deleted
        self.bytesFreed = bytesFreed
    }
}

/// One line of `GET /v1/accounts/{identity}/files` (NDJSON): an object the identity owns in a
/// mount. The contents of a directory come before the directory.
public struct CustodyOwnedObject: Codable, Equatable, Sendable {
    /// As the mount shows it (names decrypted where the identity's name key is held).
    public var path: String
    /// `file`, `directory`, `symlink` or `other`.
    public var kind: String
    /// A file's plaintext size; 0 for the others.
    public var size: UInt64
    public var bytesOnDisk: UInt64
    public var encrypted: Bool
    /// A wipe of the identity deletes it (a directory: only when nothing of other owners is in it).
    public var wipeDeletes: Bool
    /// True on the further names of a file with several (hard links), whose bytes count once.
    public var otherLink: Bool?

    public init(path: String, kind: String, size: UInt64, bytesOnDisk: UInt64, encrypted: Bool, wipeDeletes: Bool, otherLink: Bool? = nil) {
        self.path = path
        self.kind = kind
        self.size = size
        self.bytesOnDisk = bytesOnDisk
        self.encrypted = encrypted
        self.wipeDeletes = wipeDeletes
        self.otherLink = otherLink
    }
}

/// The last line of `GET /v1/accounts/{identity}/files`, as `{"summary": {…}}`: the totals of the
/// objects listed (with `wipe=true`, of what a wipe deletes).
public struct CustodyOwnedSummary: Codable, Equatable, Sendable {
    public var identity: String
    public var files: Int
    public var directories: Int
    public var symlinks: Int
    public var other: Int
    /// Plaintext bytes of the files, each file once.
    public var size: UInt64
    public var bytesOnDisk: UInt64
    public var encryptedFiles: Int
    /// The identity's directories a wipe leaves, because other owners' objects are in them.
    public var keptDirectories: Int
    /// False when the walk stopped early (an error, which the line before says).
    public var complete: Bool

    public init(identity: String, files: Int, directories: Int, symlinks: Int, other: Int, size: UInt64, bytesOnDisk: UInt64,
                encryptedFiles: Int, keptDirectories: Int, complete: Bool) {
        self.identity = identity
        self.files = files
        self.directories = directories
        self.symlinks = symlinks
        self.other = other
        self.size = size
        self.bytesOnDisk = bytesOnDisk
        self.encryptedFiles = encryptedFiles
        self.keptDirectories = keptDirectories
        self.complete = complete
    }
}

/// A line of `GET /v1/accounts/{identity}/files`: an object, the summary that ends the listing, or
/// an error that cut it short (`{"error": {code, name, message}}`, then the summary).
public enum CustodyOwnedLine: Equatable, Sendable {
    case object(CustodyOwnedObject)
    case summary(CustodyOwnedSummary)
    case error(ErrorAnswer)

    private struct Summary: Codable { var summary: CustodyOwnedSummary }
    private struct Failure: Codable { var error: ErrorAnswer }

    /// The line `json` holds; nil for one that is none of them.
    public init?(json: [UInt8]) {
        let decoder = JSONDecoder()
        let data = Data(json)
        if let summary = try? decoder.decode(Summary.self, from: data) {
            self = .summary(summary.summary)
        } else if let failure = try? decoder.decode(Failure.self, from: data) {
            self = .error(failure.error)
        } else if let object = try? decoder.decode(CustodyOwnedObject.self, from: data) {
            self = .object(object)
        } else {
            return nil
        }
    }

    /// The line as JSON (without its newline).
    public func json(_ encoder: JSONEncoder) throws -> [UInt8] {
        switch self {
        case .object(let object): return Array(try encoder.encode(object))
        case .summary(let summary): return Array(try encoder.encode(Summary(summary: summary)))
        case .error(let error): return Array(try encoder.encode(Failure(error: error)))
        }
    }
}

/// Every error answer's body (`{code, name, message}`: the SDK's status code and its name), and
/// how a failed job says why.
public struct ErrorAnswer: Codable, Equatable, Sendable {
    public var code: Int
    public var name: String
    public var message: String

    public init(code: Int, name: String, message: String) {
        self.code = code
        self.name = name
        self.message = message
    }
}

/// A long operation run by the daemon (wipe, recursive protect).
public struct CustodyJob: Codable, Equatable, Sendable {
    public typealias Failure = ErrorAnswer
    public var id: Int
    public var kind: String
    public var target: String
    /// running, succeeded or failed.
    public var state: String
    public var startedAt: Double
    public var finishedAt: Double?
    public var progress: [String: UInt64]
    /// The operation's answer once it succeeded (the same document a waiting request gets).
    public var result: JSONValue?
    public var error: Failure?

    public init(id: Int, kind: String, target: String, state: String, startedAt: Double, finishedAt: Double? = nil, progress: [String: UInt64], result: JSONValue? = nil, error: Failure? = nil) {
        self.id = id
        self.kind = kind
        self.target = target
        self.state = state
        self.startedAt = startedAt
        self.finishedAt = finishedAt
        self.progress = progress
        self.result = result
        self.error = error
    }
}

/// One event of the daemon's stream.
public struct CustodyEvent: Codable, Equatable, Sendable {
    public var sequence: UInt64
    public var time: Double
    public var kind: String
    public var identity: String?
    public var code: Int?
    public var message: String
    public var details: [String: String]

    public init(sequence: UInt64, time: Double, kind: String, identity: String? = nil, code: Int? = nil, message: String, details: [String: String]) {
        self.sequence = sequence
        self.time = time
        self.kind = kind
        self.identity = identity
        self.code = code
        self.message = message
        self.details = details
    }
}

/// `POST /v1/login/unlock`: what a login did to the user's identities.
public struct LoginResult: Codable, Equatable, Sendable {
    public var unlocked: [String]
    /// Identities with a login protector that stayed locked (a wrong password, rate limited).
    public var stillLocked: [String]
    /// Identities that got a login protector now (`addProtectors`).
    public var protected: [String]

    public init(unlocked: [String], stillLocked: [String], protected: [String]) {
        self.unlocked = unlocked
        self.stillLocked = stillLocked
        self.protected = protected
    }
}

/// `POST /v1/login/password`: the identities whose login protector follows the new password, and
/// those whose protector is stale (it still opens with the old one).
public struct PasswordChangeResult: Codable, Equatable, Sendable {
    public var rewrapped: [String]
    public var stale: [String]

    public init(rewrapped: [String], stale: [String]) {
        self.rewrapped = rewrapped
        self.stale = stale
    }
}

/// A recovery key sealed to an administrator's public key (an X25519 sealed box of
/// `{"accountID", "upn", "recoveryKey"}`): what `escrowPublicKey` asks for, and the file
/// custodyctl writes.
public struct RecoveryEscrow: Codable, Equatable, Sendable {
    public var format: String
    public var version: Int
    public var accountID: String
    public var upn: String
    /// Wall-clock seconds since 1970.
    public var created: Double
    /// The administrator's public key (base64).
    public var publicKey: String
    /// Base64 of the sealed box.
    public var sealed: String

    public init(format: String, version: Int, accountID: String, upn: String, created: Double, publicKey: String, sealed: String) {
        self.format = format
        self.version = version
        self.accountID = accountID
        self.upn = upn
        self.created = created
        self.publicKey = publicKey
        self.sealed = sealed
    }
}

/// `POST /v1/accounts/{identity}/recovery-key`: the key (unless `show` was false) and its escrow.
public struct RecoveryKeyCreated: Codable, Equatable, Sendable {
    public var identity: String
    public var recoveryKey: String?
    public var escrow: RecoveryEscrow?

    public init(identity: String, recoveryKey: String?, escrow: RecoveryEscrow?) {
        self.identity = identity
        self.recoveryKey = recoveryKey
        self.escrow = escrow
    }
}

/// `GET /v1/host-key`: the key other hosts seal an identity's keys to for this one (X25519,
/// derived from the machine key: it changes when the machine key is migrated or reset).
public struct CustodyHostKey: Codable, Equatable, Sendable {
    /// Base64, 32 bytes.
    public var publicKey: String
    /// 8 bytes of SHA-256 of the key, in hex.
    public var fingerprint: String
    public init(publicKey: String, fingerprint: String) {
        self.publicKey = publicKey
        self.fingerprint = fingerprint
    }
}

/// An identity's keys sealed to one host (`POST /v1/accounts/{identity}/export`): what
/// `custodyctl identity export` writes and `import` reads. Only the host it names can open it;
/// the sealed content repeats the account and the host, so the outer fields cannot be swapped.
public struct CustodyIdentityExport: Codable, Equatable, Sendable {
    /// `custody-identity-export/1`.
    public var format: String
    public var accountID: String
    public var upn: String
    /// The receiving host's key (base64) and its fingerprint.
    public var to: String
    public var toFingerprint: String
    /// The sending host's fingerprint.
    public var from: String
    /// Seconds since 1970.
    public var created: Double
    /// A libsodium sealed box to `to` (base64).
    public var sealed: String
    public init(format: String, accountID: String, upn: String, to: String, toFingerprint: String, from: String, created: Double, sealed: String) {
        self.format = format
        self.accountID = accountID
        self.upn = upn
        self.to = to
        self.toFingerprint = toFingerprint
        self.from = from
        self.created = created
        self.sealed = sealed
    }
}
