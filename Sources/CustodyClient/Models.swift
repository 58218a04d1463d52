/// The client's view of the API's documents (docs/api.md, docs/openapi.yaml). They are decoded
/// leniently: fields a newer daemon adds are ignored.

/// An account's policy (the SDK's policy settings).
public struct CustodyPolicy: Codable, Equatable, Sendable {
    public var fileEncryptionRequired: Bool?
    /// complete, completeUnlessOpen, untilFirstAuth, none (or Apple's NSFileProtection* names).
    public var protectionLevel: String?
    public var fileProviderEncryptionRequired: Bool?
    public var canShareWithOtherIdentities: Bool?
    public var canReceiveFromUnmanaged: Bool?

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
    /// unlocked, locking or locked (in status answers).
    public var lock: String?
}

public struct CustodyMount: Codable, Equatable, Sendable {
    public var mountPoint: String
    public var backing: String
}

public struct CustodyStatus: Codable, Equatable, Sendable {
    public var version: String
    public var mounts: [CustodyMount]
    public var accounts: [CustodyAccount]
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
}

public struct DataProtectionInfo: Codable, Equatable, Sendable {
    public var isProtected: Bool
    public var owner: String?
    public var managed: Bool
    public var encrypted: Bool
    public var protectionClass: String?
}

public struct SharingDecision: Codable, Equatable, Sendable {
    public var allowed: Bool
    public var reason: String
}

public struct ProcessIdentity: Codable, Equatable, Sendable {
    public var pid: Int32
    public var identity: String?
    public var source: String
}

public struct LockState: Codable, Equatable, Sendable {
    public var identity: String
    public var lock: String
}

/// The result of a wipe (code 104 UnenrollmentSuccess).
public struct WipeResult: Codable, Equatable, Sendable {
    public var identity: String
    public var code: Int
    public var result: String
    public var keysDestroyedSeconds: Double
    public var scanned: Int
    public var deleted: Int
    public var bytesFreed: UInt64
}

/// A long operation run by the daemon (wipe, recursive protect).
public struct CustodyJob: Codable, Equatable, Sendable {
    public struct Failure: Codable, Equatable, Sendable {
        public var code: Int
        public var name: String
        public var message: String
    }
    public var id: Int
    public var kind: String
    public var target: String
    /// running, succeeded or failed.
    public var state: String
    public var startedAt: Double
    public var finishedAt: Double?
    public var progress: [String: UInt64]
    public var error: Failure?
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
}
