import FoundationEssentials

/// One enrolled account's policy, as the SDK's `IntuneMAMPolicy` answers it for the account
/// (`IntuneMAMPolicyManager.policy(forAccountId:)`): the fields as the daemon holds them, and the
/// questions the SDK asks the policy. Read when `PolicyManager.policy(forAccountId:)` returned it;
/// the location and receive questions ask the daemon each time (its configuration decides what a
/// location covers).
public struct AccountPolicy: Sendable {
    /// The account the policy is for, as it was asked for (an account ID or a UPN).
    public let accountId: String
    /// The policy's fields, every one filled in.
    public let fields: CustodyPolicy
    let client: ControlClient

    /// `shouldFileProviderEncryptFiles`: whether a file provider must encrypt the account's files
    /// as it hands them out (exports, copies outside a protected directory). Inside a mount,
    /// Custody encrypts the account's files by `fileEncryptionRequired` whatever this says.
    public var shouldFileProviderEncryptFiles: Bool { fields.fileProviderEncryptionRequired ?? false }

    /// `isSaveToAllowedForLocation:`: may the account's data be saved to `location`? On Linux a
    /// location is a set of directories the daemon's configuration names (`docs/identity.md`, "Locations");
    /// `cameraRoll` covers none.
    public func isSaveToAllowed(for location: SDKLocation) async throws(CustodyClientError) -> Bool {
        try await PolicyManager(client: client).isSaveToAllowed(location: location, account: accountId)
    }

    /// `isOpenFromAllowedForLocation:`: may data from `location` be opened into the account?
    public func isOpenFromAllowed(for location: SDKLocation) async throws(CustodyClientError) -> Bool {
        try await PolicyManager(client: client).isOpenFromAllowed(location: location, account: accountId)
    }

    /// `canReceiveSharedFile:`: may this account (the receiver, whose policy the SDK asks) receive
    /// the file at `path`? The daemon answers from both sides: the owner's policy may forbid
    /// sending to another identity (312 SharingNotAllowed) and this account's may forbid receiving
    /// (313 ReceivingNotAllowed); `SharingDecision.reason` says which.
    public func canReceiveSharedFile(_ path: String) async throws(CustodyClientError) -> Bool {
        try await canReceiveSharedFileDecision(path).allowed
    }

    /// The same with the daemon's reason and code.
    public func canReceiveSharedFileDecision(_ path: String) async throws(CustodyClientError) -> SharingDecision {
        try await FileProtectionManager(client: client).canReceiveSharedFile(path, identity: accountId)
    }
}

extension PolicyManager {
    /// `policyForAccountId:`: the account's policy; nil when the account is not managed here (not
    /// registered, or registered without enrolment), as the SDK answers for an unmanaged account.
    public func policy(forAccountId account: String) async throws(CustodyClientError) -> AccountPolicy? {
        let client = self.client
        let fields = try await offload { () throws(CustodyClientError) -> CustodyPolicy? in
            do throws(CustodyClientError) {
                return try client.call(Endpoint.policy, account, as: CustodyPolicy.self)
            } catch where error.name == "NotEnrolledAccount" || error.name == "UnknownAccount" {
                return nil
            }
        }
        return fields.map { AccountPolicy(accountId: account, fields: $0, client: client) }
    }
}

extension PolicyManager {
    /// `isManagedAccountId:`: whether the account is enrolled here (its data is managed), as
    /// `policy(forAccountId:)` being non-nil.
    public func isManagedAccountId(_ account: String) async throws(CustodyClientError) -> Bool {
        try await policy(forAccountId: account) != nil
    }
}

extension FileProtectionManager {
    /// `protect:accountId:`: makes `account` the owner of the file at `path`, or of a directory
    /// and everything in it (nil removes the owner), re-encrypting as the policies say.
    @discardableResult
    public func protect(_ path: String, accountId account: String?) async throws(CustodyClientError) -> FileProtectionInfo {
        try await protect(path, identity: account)
    }

    /// `protectFileProviderItem:forAccountId:`: makes `account` the owner of the item at `path`
    /// (a file, or a directory and everything in it). On Linux an item is a path in a protected
    /// directory rather than an `NSFileProviderItem`; the account's files there are encrypted when
    /// its policy requires encryption (`fileEncryptionRequired`).
    @discardableResult
    public func protectFileProviderItem(_ path: String, forAccountId account: String) async throws(CustodyClientError) -> FileProtectionInfo {
        try await protect(path, identity: account)
    }
}

extension DataProtectionManager {
    /// `protect:accountId:` for `Data`: a managed account's data comes back encrypted, an
    /// unmanaged one's tagged with the account and otherwise as it was.
    public func protect(_ data: Data, accountId account: String) async throws(CustodyClientError) -> Data {
        Data(try await protect(Array(data), identity: account))
    }

    /// `unprotect:` for `Data`: the plaintext; data never protected comes back as it was.
    public func unprotect(_ data: Data) async throws(CustodyClientError) -> Data {
        Data(try await unprotect(Array(data)))
    }

    /// `protectionInfo:` for `Data`.
    public func protectionInfo(_ data: Data) async throws(CustodyClientError) -> DataProtectionInfo {
        try await protectionInfo(Array(data))
    }
}

extension EnrollmentManager {
    /// `enrolledAccountIds`: the IDs of the accounts enrolled here (registered ones not enrolled
    /// are left out; `registeredAccounts()` lists every one).
    public func enrolledAccountIds() async throws(CustodyClientError) -> [String] {
        try await registeredAccounts().filter(\.enrolled).map(\.id)
    }

    /// `registerAndEnrollAccountId:`: registers the account and enrolls it, with its policy.
    /// Linux has no directory service to look a UPN up by object ID, so the UPN is given too; the
    /// outcome is an enrolment event with the SDK's status (100 NewPoliciesReceived) or a typed
    /// error (208 AlreadyEnrolled, 209 AccountNotAllowed, 227 SingleManagedAccountMode).
    @discardableResult
    public func registerAndEnrollAccountId(_ accountId: String, upn: String, policy: CustodyPolicy? = nil, passphrase: String? = nil,
                                           uid: UInt32? = nil) async throws(CustodyClientError) -> CustodyAccount {
        try await registerAndEnrollAccount(id: accountId, upn: upn, policy: policy, passphrase: passphrase, uid: uid)
    }

    /// `deRegisterAndUnenrollAccountId:withWipe:`: forgets the account; with `wipe`, its keys are
    /// destroyed first and its files deleted (the wipe's result: 104 UnenrollmentSuccess, or the
    /// failure's code). The account may be named by ID or UPN.
    @discardableResult
    public func deRegisterAndUnenrollAccountId(_ accountId: String, withWipe wipe: Bool) async throws(CustodyClientError) -> WipeResult? {
        try await deRegisterAndUnenrollAccount(accountId, withWipe: wipe)
    }
}
