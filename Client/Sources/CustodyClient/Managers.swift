import Dispatch
import FoundationEssentials

// The SDK's managers, by name and shape (IntuneMAMFileProtectionManager,
// IntuneMAMDataProtectionManager, IntuneMAMEnrollmentManager), over the control socket, so a
// file-provider test on Linux reads like the iOS code.

/// Runs a blocking client call off the caller's task.
func offload<T: Sendable>(_ body: @escaping @Sendable () throws(CustodyClientError) -> T) async throws(CustodyClientError) -> T {
    let result: Result<T, CustodyClientError> = await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            do throws(CustodyClientError) {
                continuation.resume(returning: .success(try body()))
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
    }
    return try result.get()
}

/// File protection: owners of files in mounts, encrypted copies anywhere.
public struct FileProtectionManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    /// Sets the owner of a file, or of a directory and everything in it (nil removes it). Files
    /// of a managed identity whose policy encrypts are encrypted.
    @discardableResult
    public func protect(_ path: String, identity: String?) async throws(CustodyClientError) -> FileProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.protectFile, json: ProtectRequest(path: path, identity: identity), as: FileProtectionInfo.self)
        }
    }

    public func protectionInfo(_ path: String) async throws(CustodyClientError) -> FileProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.fileInfo, json: PathRequest(path: path), as: FileProtectionInfo.self)
        }
    }

    public func isFileEncrypted(_ path: String) async throws(CustodyClientError) -> Bool {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.isEncrypted, json: PathRequest(path: path), as: EncryptedAnswer.self).encrypted
        }
    }

    /// Encrypts the file in place for an enrolled account (`encryptFile:forAccountId:`).
    @discardableResult
    public func encryptFile(_ path: String, forAccountId account: String) async throws(CustodyClientError) -> FileProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.encryptFile, json: PathIdentityRequest(path: path, identity: account), as: FileProtectionInfo.self)
        }
    }

    /// Writes the decrypted content to `copyPath` (`decryptFile:toCopyPath:`); the file stays encrypted.
    @discardableResult
    public func decryptFile(_ path: String, toCopyPath copyPath: String) async throws(CustodyClientError) -> FileProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.decryptFile, json: DecryptRequest(path: path, copyPath: copyPath), as: FileProtectionInfo.self)
        }
    }

    /// Decrypts the file in place (`decryptFile:`).
    @discardableResult
    public func decryptFile(_ path: String) async throws(CustodyClientError) -> FileProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.decryptFile, json: DecryptRequest(path: path, copyPath: nil), as: FileProtectionInfo.self)
        }
    }

    /// May `identity` receive the file (`canReceiveSharedFile`)?
    public func canReceiveSharedFile(_ path: String, identity: String) async throws(CustodyClientError) -> SharingDecision {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.canReceive, json: PathIdentityRequest(path: path, identity: identity), as: SharingDecision.self)
        }
    }
}


/// The policy questions about locations (IntuneMAMPolicy's `isSaveToAllowedForLocation` and
/// `isOpenFromAllowedForLocation`), and where a path is.
public struct PolicyManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    /// May `account`'s data be saved to `location` (an SDK name or a configured one)?
    public func isSaveToAllowed(location: String, account: String?) async throws(CustodyClientError) -> Bool {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.saveToAllowed, json: LocationQuery(location: location, account: account), as: LocationAnswer.self).allowed
        }
    }

    public func isSaveToAllowed(location: SDKLocation, account: String?) async throws(CustodyClientError) -> Bool {
        try await isSaveToAllowed(location: location.rawValue, account: account)
    }

    /// May data from `location` be opened into `account`?
    public func isOpenFromAllowed(location: String, account: String?) async throws(CustodyClientError) -> Bool {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.openFromAllowed, json: LocationQuery(location: location, account: account), as: LocationAnswer.self).allowed
        }
    }

    public func isOpenFromAllowed(location: SDKLocation, account: String?) async throws(CustodyClientError) -> Bool {
        try await isOpenFromAllowed(location: location.rawValue, account: account)
    }

    /// The location `path` (absolute) is in.
    public func location(of path: String) async throws(CustodyClientError) -> PathLocation {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.classify, json: PathRequest(path: path), as: PathLocation.self)
        }
    }

    /// Every location; with `account`, what its policy allows in each.
    public func locations(account: String? = nil) async throws(CustodyClientError) -> [LocationSummary] {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.locations, query: account.map { [("account", $0)] } ?? [], as: LocationList.self).locations
        }
    }
}

/// Data protection: byte buffers protected for an identity.
public struct DataProtectionManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    /// Managed identity: encrypted; unmanaged: tagged with the identity, bytes plain.
    public func protect(_ data: [UInt8], identity: String) async throws(CustodyClientError) -> [UInt8] {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            let answer = try client.call(Endpoint.protectData, json: DataRequest(identity: identity, data: Data(data).base64EncodedString()), as: DataResult.self)
            guard let bytes = Data(base64Encoded: answer.data) else { throw .badResponse("data is not base64") }
            return Array(bytes)
        }
    }

    /// The plaintext; bytes that were never protected come back unchanged.
    public func unprotect(_ data: [UInt8]) async throws(CustodyClientError) -> [UInt8] {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            let answer = try client.call(Endpoint.unprotectData, json: DataRequest(identity: nil, data: Data(data).base64EncodedString()), as: DataResult.self)
            guard let bytes = Data(base64Encoded: answer.data) else { throw .badResponse("data is not base64") }
            return Array(bytes)
        }
    }

    public func protect(_ string: String, identity: String) async throws(CustodyClientError) -> [UInt8] {
        try await protect(Array(string.utf8), identity: identity)
    }

    public func unprotectString(_ data: [UInt8]) async throws(CustodyClientError) -> String {
        String(decoding: try await unprotect(data), as: UTF8.self)
    }

    public func protectionInfo(_ data: [UInt8]) async throws(CustodyClientError) -> DataProtectionInfo {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.dataInfo, json: DataRequest(identity: nil, data: Data(data).base64EncodedString()), as: DataProtectionInfo.self)
        }
    }
}

/// Enrollment: register, enroll, deregister (with or without wipe).
public struct EnrollmentManager: Sendable {
    public let client: ControlClient

    public init(client: ControlClient = ControlClient()) { self.client = client }

    @discardableResult
    public func registerAndEnrollAccount(id: String, upn: String, policy: CustodyPolicy? = nil, passphrase: String? = nil,
                                         uid: UInt32? = nil) async throws(CustodyClientError) -> CustodyAccount {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.enroll, json: EnrollRequest(id: id, upn: upn, enroll: true, policy: policy, passphrase: passphrase, uid: uid),
                            as: CustodyAccount.self)
        }
    }

    /// Registers without enrolling: the account is known, its files unmanaged.
    @discardableResult
    public func registerAccount(id: String, upn: String, uid: UInt32? = nil) async throws(CustodyClientError) -> CustodyAccount {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            try client.call(Endpoint.enroll, json: EnrollRequest(id: id, upn: upn, enroll: false, uid: uid), as: CustodyAccount.self)
        }
    }

    /// Deregisters; with `wipe` its keys are destroyed and its files deleted first. Returns the
    /// wipe's result (nil without wipe).
    @discardableResult
    public func deRegisterAndUnenrollAccount(_ identity: String, withWipe wipe: Bool) async throws(CustodyClientError) -> WipeResult? {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in
            if wipe { return try client.call(Endpoint.deregister, identity, query: [("wipe", "true")], as: WipeResult.self) }
            _ = try client.call(Endpoint.deregister, identity, as: ControlClient.Empty.self)
            return nil
        }
    }

    public func registeredAccounts() async throws(CustodyClientError) -> [CustodyAccount] {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in try client.call(Endpoint.accounts, as: [CustodyAccount].self) }
    }

    /// The accounts that may enroll (the SDK's `allowedAccounts`; empty: any), with
    /// `AllowedAccountsAction` and the enrolled accounts the list does not name. Administrators only.
    public func allowedAccounts() async throws(CustodyClientError) -> CustodyAllowedAccounts {
        let client = self.client
        return try await offload { () throws(CustodyClientError) in try client.call(Endpoint.allowedAccounts, as: CustodyAllowedAccounts.self) }
    }
}
