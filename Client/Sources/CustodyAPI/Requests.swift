/// The bodies requests send (docs/api.md, docs/openapi.yaml). The daemon decodes them, the client
/// library and custodyctl encode them: one definition each.

/// `POST /v1/accounts`: register an account, and enroll it unless `enroll` is false.
public struct EnrollRequest: Codable, Sendable {
    public var id: String
    public var upn: String
    public var enroll: Bool?
    public var policy: CustodyPolicy?
    public var passphrase: String?
    public var uid: UInt32?
    /// The local user by name, instead of `uid`.
    public var user: String?

    public init(id: String, upn: String, enroll: Bool? = nil, policy: CustodyPolicy? = nil, passphrase: String? = nil,
                uid: UInt32? = nil, user: String? = nil) {
        self.id = id
        self.upn = upn
        self.enroll = enroll
        self.policy = policy
        self.passphrase = passphrase
        self.uid = uid
        self.user = user
    }
}

/// `POST /v1/accounts/{identity}/unlock`.
public struct UnlockRequest: Codable, Sendable {
    public var passphrase: String?
    public init(passphrase: String? = nil) { self.passphrase = passphrase }
}

/// `POST /v1/accounts/{identity}/passphrase`: the current passphrase (absent when there is none)
/// and the new one (absent: remove it).
public struct PassphraseRequest: Codable, Sendable {
    public var old: String?
    public var new: String?
    public init(old: String? = nil, new: String? = nil) {
        self.old = old
        self.new = new
    }
}

/// `POST /v1/bindings`: a process (`pid`) or a thread (`tid`) and its identity.
public struct BindRequest: Codable, Sendable {
    public var pid: Int32?
    public var tid: Int32?
    public var identity: String
    public init(pid: Int32? = nil, tid: Int32? = nil, identity: String) {
        self.pid = pid
        self.tid = tid
        self.identity = identity
    }
}

/// `POST /v1/machine-key/migrate`.
public struct MigrateRequest: Codable, Sendable {
    /// "tpm2" or "file".
    public var to: String
    /// SHA-256 PCRs to bind a TPM-sealed key to (absent: the configured `tpm2-pcrs`).
    public var pcrs: [Int]?
    public init(to: String, pcrs: [Int]? = nil) {
        self.to = to
        self.pcrs = pcrs
    }
}

/// The file routes that take only a path (`info`, `is-encrypted`, `repair`) and `classify`.
public struct PathRequest: Codable, Sendable {
    public var path: String
    public init(path: String) { self.path = path }
}

/// `POST /v1/files/protect`: give a file or a tree an owner (nil: remove it).
public struct ProtectRequest: Codable, Sendable {
    public var path: String
    public var identity: String?
    /// false: answer at once with the job (default: wait for the result).
    public var wait: Bool?
    public init(path: String, identity: String?, wait: Bool? = nil) {
        self.path = path
        self.identity = identity
        self.wait = wait
    }

    // `identity` is always sent: null removes the owner.
    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(path, forKey: .path)
        try container.encode(identity, forKey: .identity)
        try container.encodeIfPresent(wait, forKey: .wait)
    }
}

/// `POST /v1/files/encrypt` and `POST /v1/files/can-receive`: a path and an identity.
public struct PathIdentityRequest: Codable, Sendable {
    public var path: String
    public var identity: String
    public init(path: String, identity: String) {
        self.path = path
        self.identity = identity
    }
}

/// `POST /v1/files/decrypt`: in place, or to `copyPath`.
public struct DecryptRequest: Codable, Sendable {
    public var path: String
    public var copyPath: String?
    public init(path: String, copyPath: String? = nil) {
        self.path = path
        self.copyPath = copyPath
    }
}

/// The data routes: bytes (`data`, base64) or a string, and for `protect` the identity.
public struct DataRequest: Codable, Sendable {
    public var identity: String?
    /// Base64 bytes.
    public var data: String?
    /// A string, protected as its UTF-8 bytes.
    public var string: String?
    public init(identity: String? = nil, data: String? = nil, string: String? = nil) {
        self.identity = identity
        self.data = data
        self.string = string
    }
}

/// `POST /v1/locations/save-to-allowed` and `open-from-allowed`.
public struct LocationQuery: Codable, Sendable {
    public var location: String
    /// The account asked about (object ID or UPN); absent: no identity.
    public var account: String?
    public init(location: String, account: String? = nil) {
        self.location = location
        self.account = account
    }
}

/// `POST /v1/accounts/{identity}/login-protector`.
public struct ProtectorRequest: Codable, Sendable {
    public var password: String
    public init(password: String) { self.password = password }
}

/// `POST /v1/login/unlock` (the PAM module at a login).
public struct LoginRequest: Codable, Sendable {
    /// The local user by name; administrators only (others act for themselves).
    public var user: String?
    public var password: String
    /// Unlocked identities of the user without a login protector get one.
    public var addProtectors: Bool?
    public init(user: String? = nil, password: String, addProtectors: Bool? = nil) {
        self.user = user
        self.password = password
        self.addProtectors = addProtectors
    }
}

/// `POST /v1/login/password` (the PAM module at a password change).
public struct PasswordChangeRequest: Codable, Sendable {
    public var user: String?
    public var old: String?
    public var new: String
    public init(user: String? = nil, old: String? = nil, new: String) {
        self.user = user
        self.old = old
        self.new = new
    }
}

/// `POST /v1/login/open` and `/v1/login/lock`: a login session opened or closed (PAM). `session`
/// is the PID of the process that opened it (PAM closes it from the same one), `loginSession`
/// its logind ID (`XDG_SESSION_ID`) where it has one. A close without `session` locks at once.
public struct SessionRequest: Codable, Sendable {
    public var user: String?
    public var session: Int32?
    public var loginSession: String?
    public init(user: String? = nil, session: Int32? = nil, loginSession: String? = nil) {
        self.user = user
        self.session = session
        self.loginSession = loginSession
    }
}

/// `POST /v1/accounts/{identity}/recovery-key`.
public struct RecoveryKeyRequest: Codable, Sendable {
    /// An administrator's public key (base64, 32 bytes): the answer carries the key sealed to it.
    public var escrowPublicKey: String?
    /// Show the key in the answer (default true); false with an escrow: only the sealed copy.
    public var show: Bool?
    public init(escrowPublicKey: String? = nil, show: Bool? = nil) {
        self.escrowPublicKey = escrowPublicKey
        self.show = show
    }
}

/// `POST /v1/accounts/{identity}/recover`.
public struct RecoverRequest: Codable, Sendable {
    public var recoveryKey: String
    /// The new passphrase; absent keeps the current one (unless `removePassphrase`).
    public var newPassphrase: String?
    public var removePassphrase: Bool?
    public init(recoveryKey: String, newPassphrase: String? = nil, removePassphrase: Bool? = nil) {
        self.recoveryKey = recoveryKey
        self.newPassphrase = newPassphrase
        self.removePassphrase = removePassphrase
    }
}

/// `POST /v1/accounts/{identity}/export`.
public struct ExportIdentityRequest: Codable, Sendable {
    /// The receiving host's key (base64, 32 bytes): what its `GET /v1/host-key` answers.
    public var hostKey: String
    public init(hostKey: String) { self.hostKey = hostKey }
}

/// `POST /v1/identities/import`: an export made for this host, and what the identity gets here
/// (as for an enrolment: its passphrase on this host, its policy, its local user).
public struct ImportIdentityRequest: Codable, Sendable {
    public var export: CustodyIdentityExport
    public var passphrase: String?
    /// Nil: the policy the export carries.
    public var policy: CustodyPolicy?
    public var uid: UInt32?
    /// The local user by name, instead of `uid`.
    public var user: String?
    public init(export: CustodyIdentityExport, passphrase: String? = nil, policy: CustodyPolicy? = nil, uid: UInt32? = nil, user: String? = nil) {
        self.export = export
        self.passphrase = passphrase
        self.policy = policy
        self.uid = uid
        self.user = user
    }
}
