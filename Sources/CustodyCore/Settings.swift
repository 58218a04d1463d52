import CustodyFormat

/// The daemon's settings, with the Intune SDK's names (IntuneMAMSettings) where they exist.
public struct Settings: Codable, Equatable, Sendable {
    /// Caps every policy's protection level (effective class = min(policy, this)).
    public var maxFileProtectionLevel: ProtectionClass = .complete
    /// More than one enrolled (managed) account at a time.
    public var multiIdentity: Bool = false
    /// Seconds between a lock request and class A keys being dropped.
    public var lockGracePeriod: Double = 10
    public var verboseLoggingEnabled: Bool = false
    /// Strings (identities, paths) replaced by a hash in logs.
    public var valuesToScrubFromLogging: [String] = []
    /// When not empty, only these accounts (object ID or UPN, case-insensitive) may enroll.
    public var allowedAccounts: [String] = []
    /// What happens to an enrolled account `allowedAccounts` stops naming (`AllowedAccounts.swift`).
    public var allowedAccountsAction: AllowedAccountsAction = .warn
    /// Default identity per uid, for callers that have no thread or process binding.
    public var defaultIdentities: [UInt32: String] = [:]
    /// Argon2id cost for passphrases: "interactive", "moderate", or "minimal" (tests only).
    public var passphraseCost: String = "interactive"
    /// Programs (absolute executable paths) whose processes every managed identity's transfer
    /// rules let through (a backup agent, an indexer). See docs/identity.md.
    public var transferExemptExecutables: [String] = []
    /// Users whose processes every managed identity's transfer rules let through. Empty by
    /// default: root's processes follow the rules like any other.
    public var transferExemptUids: [UInt32] = []
    /// Administrator-defined locations: a name (`OneDriveForBusiness`, `SharePoint` or one of
    /// the administrator's own) and the directories it covers.
    public var locations: [String: [String]] = [:]
    /// Lock a user's identities when every session of the user is locked (screen lock).
    public var lockOnSessionLock = true
    /// Lock every identity at once before the machine suspends.
    public var lockOnSuspend = true
    /// Lock a user's identities when the user's last session ends.
    public var lockOnLogout = true
    /// Wrong passphrases (or login passwords) in a row after which `unlockAttemptsAction`
    /// applies; 0: no limit (the back-off alone).
    public var maxUnlockAttempts = 0
    /// "backoff" (keep waiting longer) or "wipe" (selectively wipe the identity).
    public var unlockAttemptsAction = "backoff"
    /// Where new machine keys go: "auto" (the TPM when one answers), "file" or "tpm2". A key
    /// kept elsewhere than "file" or "tpm2" says is moved there at start.
    public var machineKey: MachineKeyMode = .auto
    /// SHA-256 PCRs a TPM-sealed machine key is bound to (e.g. [7], the Secure Boot state).
    public var tpm2PCRs: [Int] = []
    /// How to reach the TPM (a TCTI configuration).
    public var tpm2TCTI = "device:/dev/tpmrm0"

    public init() {}

    enum CodingKeys: String, CodingKey {
        case maxFileProtectionLevel = "MaxFileProtectionLevel"
        case multiIdentity = "MultiIdentity"
        case lockGracePeriod = "LockGracePeriod"
        case verboseLoggingEnabled = "VerboseLoggingEnabled"
        case valuesToScrubFromLogging = "ValuesToScrubFromLogging"
        case allowedAccounts = "AllowedAccounts"
        case allowedAccountsAction = "AllowedAccountsAction"
        case defaultIdentities = "DefaultIdentities"
        case passphraseCost = "PassphraseCost"
        case transferExemptExecutables = "TransferExemptExecutables"
        case transferExemptUids = "TransferExemptUids"
        case locations = "Locations"
        case lockOnSessionLock = "LockOnSessionLock"
        case lockOnSuspend = "LockOnSuspend"
        case lockOnLogout = "LockOnLogout"
        case maxUnlockAttempts = "MaxUnlockAttempts"
        case unlockAttemptsAction = "UnlockAttemptsAction"
        case machineKey = "MachineKey"
        case tpm2PCRs = "TPM2PCRs"
        case tpm2TCTI = "TPM2TCTI"
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let defaults = Settings()
        if let name = try container.decodeIfPresent(String.self, forKey: .maxFileProtectionLevel) {
            guard let level = ProtectionClass(name: name) else {
                throw DecodingError.dataCorruptedError(forKey: .maxFileProtectionLevel, in: container, debugDescription: "unknown protection level \(name)")
            }
            maxFileProtectionLevel = level
        }
        multiIdentity = try container.decodeIfPresent(Bool.self, forKey: .multiIdentity) ?? defaults.multiIdentity
        lockGracePeriod = try container.decodeIfPresent(Double.self, forKey: .lockGracePeriod) ?? defaults.lockGracePeriod
        verboseLoggingEnabled = try container.decodeIfPresent(Bool.self, forKey: .verboseLoggingEnabled) ?? defaults.verboseLoggingEnabled
        valuesToScrubFromLogging = try container.decodeIfPresent([String].self, forKey: .valuesToScrubFromLogging) ?? []
        allowedAccounts = try container.decodeIfPresent([String].self, forKey: .allowedAccounts) ?? []
        allowedAccountsAction = try container.decodeIfPresent(AllowedAccountsAction.self, forKey: .allowedAccountsAction) ?? .warn
        defaultIdentities = try container.decodeIfPresent([UInt32: String].self, forKey: .defaultIdentities) ?? [:]
        passphraseCost = try container.decodeIfPresent(String.self, forKey: .passphraseCost) ?? defaults.passphraseCost
        transferExemptExecutables = try container.decodeIfPresent([String].self, forKey: .transferExemptExecutables) ?? []
        transferExemptUids = try container.decodeIfPresent([UInt32].self, forKey: .transferExemptUids) ?? []
        locations = try container.decodeIfPresent([String: [String]].self, forKey: .locations) ?? [:]
        lockOnSessionLock = try container.decodeIfPresent(Bool.self, forKey: .lockOnSessionLock) ?? true
        lockOnSuspend = try container.decodeIfPresent(Bool.self, forKey: .lockOnSuspend) ?? true
        lockOnLogout = try container.decodeIfPresent(Bool.self, forKey: .lockOnLogout) ?? true
        maxUnlockAttempts = try container.decodeIfPresent(Int.self, forKey: .maxUnlockAttempts) ?? 0
        unlockAttemptsAction = try container.decodeIfPresent(String.self, forKey: .unlockAttemptsAction) ?? "backoff"
        machineKey = try container.decodeIfPresent(MachineKeyMode.self, forKey: .machineKey) ?? .auto
        tpm2PCRs = try container.decodeIfPresent([Int].self, forKey: .tpm2PCRs) ?? []
        tpm2TCTI = try container.decodeIfPresent(String.self, forKey: .tpm2TCTI) ?? defaults.tpm2TCTI
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(maxFileProtectionLevel.description, forKey: .maxFileProtectionLevel)
        try container.encode(multiIdentity, forKey: .multiIdentity)
        try container.encode(lockGracePeriod, forKey: .lockGracePeriod)
        try container.encode(verboseLoggingEnabled, forKey: .verboseLoggingEnabled)
        try container.encode(valuesToScrubFromLogging, forKey: .valuesToScrubFromLogging)
        try container.encode(allowedAccounts, forKey: .allowedAccounts)
        try container.encode(allowedAccountsAction, forKey: .allowedAccountsAction)
        try container.encode(defaultIdentities, forKey: .defaultIdentities)
        try container.encode(passphraseCost, forKey: .passphraseCost)
        try container.encode(transferExemptExecutables, forKey: .transferExemptExecutables)
        try container.encode(transferExemptUids, forKey: .transferExemptUids)
        try container.encode(locations, forKey: .locations)
        try container.encode(lockOnSessionLock, forKey: .lockOnSessionLock)
        try container.encode(lockOnSuspend, forKey: .lockOnSuspend)
        try container.encode(lockOnLogout, forKey: .lockOnLogout)
        try container.encode(maxUnlockAttempts, forKey: .maxUnlockAttempts)
        try container.encode(unlockAttemptsAction, forKey: .unlockAttemptsAction)
        try container.encode(machineKey, forKey: .machineKey)
        try container.encode(tpm2PCRs, forKey: .tpm2PCRs)
        try container.encode(tpm2TCTI, forKey: .tpm2TCTI)
    }
}
