import CustodyCrypto
import CustodyFormat
import CustodySystem

/// Why the engine refused or failed an operation. Each case has a stable status code (the SDK's
/// enrollment codes where one applies) and maps to an errno at the FUSE boundary.
public enum EngineError: ErrnoConvertible, Equatable, Sendable, CustomStringConvertible {
    case unknownAccount(String)
    case alreadyEnrolled(String)
    case notEnrolled(String)
    case accountNotAllowed(String)
    case singleManagedAccountMode(enrolled: String)
    case invalidIdentity(String)
    /// The account belongs to no local user, and the operation needs one (NilAccount too).
    case noLocalUser(String)
    case invalidPolicy(String)
    case passphraseRequired(String)
    case wrongPassphrase(String)
    case rateLimited(String, retryAfterSeconds: Double)
    case locked(String, ProtectionClass)
    case noSuchProcess(Int32)
    case corruptState(file: String, reason: String)
    case io(file: String, Errno)
    case crypto(CryptoError)
    case format(FormatError)
    // File protection (the SDK's file protection domain, 100–107).
    case invalidPath(String, reason: String)
    /// The path (or its directory) does not exist: InvalidPath too, answered as not found.
    case pathNotFound(String, reason: String)
    case failedToEncryptFile(String, reason: String)
    case failedToDecryptFile(String, reason: String)
    case fileNotEncrypted(String)
    case fileAlreadyEncrypted(String)
    case identityNotManaged(String)
    case fileBusy(String, reason: String)
    /// The owner's policy keeps its files to itself (`canShareWithOtherIdentities` is off).
    case sharingNotAllowed(owner: String)
    /// The transfer rules refuse moving the data (312 for the sender's policy, 313 for the
    /// receiver's).
    case transferNotAllowed(TransferDecision)
    /// A recovery key as typed does not check, or the identity has none.
    case invalidRecoveryKey(String)
    case noRecoveryKey(String)
    /// The machine key a keybag needs cannot be had (a cleared TPM, another machine's state
    /// directory, no TPM configured); the text says why and what to do.
    case machineKeyUnavailable(String)
    /// A machine key that is there cannot be replaced as lost (it is moved with migrate).
    case machineKeyInUse(String)
    /// The identity's keybag is missing or cannot be read (`StateProblem.Kind.keybagUnusable`);
    /// the text says why.
    case keysUnavailable(String)
    /// An identity export that does not open here (sealed to another host, changed) or does not
    /// hold together.
    case identityExportInvalid(String)
    /// An import of an identity whose keys this host keeps from an earlier enrolment.
    case keysKeptHere(String)
    // Data protection (the SDK's data protection domain, 100–105).
    case failedToProtectData(String)
    case failedToUnprotectData(String)

    /// Any error from below, as an engine error (engine errors pass through; crypto errors wrap).
    init(mixing error: any Error) {
        switch error {
        case let error as EngineError: self = error
        case let error as CryptoError: self = .crypto(error)
        case let error as FormatError: self = .format(error)
        default: self = .crypto(.library("\(error)"))
        }
    }

    /// Each case's stable code (the SDK's enrollment status codes where they apply, 2xx; the
    /// file and data protection domains, 1xx; else Custody's own 3xx), its stable name for the
    /// API, and the errno a file system caller sees: one row per case, so that a new case gets
    /// all three at once.
    private var meaning: (code: Int, name: String, errno: Errno) {
        switch self {
        case .alreadyEnrolled: return (208, "AlreadyEnrolled", .ioError)
        case .accountNotAllowed: return (209, "AccountNotAllowed", .accessDenied)   // NotEmmAccount: not the account the organisation allows
        case .notEnrolled: return (214, "NotEnrolledAccount", .ioError)
        case .singleManagedAccountMode: return (227, "SingleManagedAccountMode", .ioError)
        case .invalidIdentity, .noLocalUser: return (207, "NilAccount", .ioError)
        case .unknownAccount: return (300, "UnknownAccount", .ioError)
        case .invalidPolicy: return (301, "InvalidPolicy", .ioError)
        case .passphraseRequired: return (302, "PassphraseRequired", .accessDenied)
        case .wrongPassphrase: return (303, "WrongPassphrase", .accessDenied)
        case .rateLimited: return (304, "RateLimited", .accessDenied)
        case .locked: return (305, "Locked", .accessDenied)
        case .noSuchProcess: return (306, "NoSuchProcess", .noSuchProcess)
        case .corruptState: return (310, "CorruptState", .ioError)
        case .io(_, let error): return (311, "IOError", error)
        case .crypto, .format: return (201, "InternalError", .ioError)
        case .invalidPath, .pathNotFound: return (101, "InvalidPath", .noSuchFile)
        case .failedToEncryptFile: return (102, "FailedToEncryptFile", .ioError)
        case .failedToDecryptFile: return (103, "FailedToDecryptFile", .ioError)
        case .fileNotEncrypted: return (104, "FileNotEncrypted", .invalidArgument)
        case .fileAlreadyEncrypted: return (105, "FileAlreadyEncrypted", .invalidArgument)
        case .identityNotManaged: return (106, "IdentityNotManaged", .invalidArgument)
        case .fileBusy: return (107, "FileBusy", .resourceBusy)
        case .sharingNotAllowed: return (312, "SharingNotAllowed", .notPermitted)
        case .transferNotAllowed(let decision): return (decision.code ?? 312, decision.name ?? "SharingNotAllowed", .notPermitted)
        case .invalidRecoveryKey: return (314, "InvalidRecoveryKey", .ioError)
        case .noRecoveryKey: return (315, "NoRecoveryKey", .ioError)
        case .machineKeyUnavailable: return (316, "MachineKeyUnavailable", .accessDenied)
        case .machineKeyInUse: return (317, "MachineKeyInUse", .ioError)
        case .keysUnavailable: return (318, "KeysUnavailable", .accessDenied)
        case .identityExportInvalid: return (320, "IdentityExportInvalid", .invalidArgument)
        case .keysKeptHere: return (321, "KeysKeptHere", .exists)
        case .failedToProtectData: return (102, "FailedToProtectData", .ioError)
        case .failedToUnprotectData: return (103, "FailedToUnprotectData", .ioError)
        }
    }

    public var code: Int { meaning.code }

    /// A stable name for the API.
    public var name: String { meaning.name }

    /// The errno a file system caller sees.
    public var errnoValue: Errno { meaning.errno }

    public var description: String {
        switch self {
        case .unknownAccount(let id): return "no account \(id) is registered"
        case .alreadyEnrolled(let id): return "account \(id) is already enrolled"
        case .notEnrolled(let id): return "account \(id) is not enrolled"
        case .accountNotAllowed(let id): return "account \(id) is not in the allowed accounts"
        case .singleManagedAccountMode(let enrolled): return "only one managed account is allowed (MultiIdentity is off) and \(enrolled) is enrolled"
        case .invalidIdentity(let reason): return "invalid identity: \(reason)"
        case .noLocalUser(let account): return "\(account) belongs to no local user (enroll it with --user)"
        case .invalidPolicy(let reason): return "invalid policy: \(reason)"
        case .passphraseRequired(let id): return "account \(id) has a passphrase; unlocking needs it"
        case .wrongPassphrase(let id): return "wrong passphrase for \(id)"
        case .rateLimited(let id, let seconds): return "too many wrong passphrases for \(id); try again in \(Int(seconds.rounded(.up))) s"
        case .locked(let id, let protectionClass): return "\(id) is locked: class \(protectionClass.letter) (\(protectionClass)) keys are not available"
        case .noSuchProcess(let pid): return "no process \(pid)"
        case .corruptState(let file, let reason): return "state file \(file) is invalid: \(reason)"
        case .io(let file, let error): return "\(file): \(error)"
        case .crypto(let error): return "crypto error: \(error)"
        case .format(let error): return "\(error)"
        case .invalidPath(let path, let reason), .pathNotFound(let path, let reason): return "\(path): \(reason)"
        case .failedToEncryptFile(let path, let reason): return "cannot encrypt \(path): \(reason)"
        case .failedToDecryptFile(let path, let reason): return "cannot decrypt \(path): \(reason)"
        case .fileNotEncrypted(let path): return "\(path) is not an encrypted file"
        case .fileAlreadyEncrypted(let path): return "\(path) is already encrypted"
        case .identityNotManaged(let id): return "\(id) is not a managed (enrolled) account"
        case .fileBusy(let path, let reason): return "\(path) is busy: \(reason)"
        case .sharingNotAllowed(let owner): return "\(owner)'s policy does not let other identities receive its files"
        case .transferNotAllowed(let decision): return decision.reason
        case .invalidRecoveryKey(let reason): return "not a recovery key: \(reason)"
        case .noRecoveryKey(let upn): return "\(upn) has no recovery key"
        case .machineKeyUnavailable(let reason): return "machine key unavailable: \(reason)"
        case .keysUnavailable(let reason): return reason
        case .identityExportInvalid(let reason): return "the identity export cannot be imported: \(reason)"
        case .keysKeptHere(let upn): return "keys of \(upn) are kept here from an earlier enrolment: enroll it again with them, or wipe them first"
        case .machineKeyInUse(let id): return "machine key \(id) is available: move it with `custodyctl machine-key migrate` instead of replacing it"
        case .failedToProtectData(let reason): return "cannot protect the data: \(reason)"
        case .failedToUnprotectData(let reason): return "cannot unprotect the data: \(reason)"
        }
    }
}
