import CTPM
import CustodyCrypto
import FoundationEssentials
import Glibc

/// Why the TPM refused or failed. `kind` says what it means for the caller; `message` is the
/// TSS's decoding of the return code.
public struct TPMError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// No TPM at that TCTI, or it did not answer.
        case unreachable
        /// The object does not load under this TPM's storage key: another TPM, or this one was cleared.
        case foreign
        /// The PCR policy does not hold: the bound PCRs changed.
        case policy
        /// The TPM is in dictionary-attack lockout.
        case lockout
        /// A wrong authorization value (the TPM counted it).
        case badAuthorization
        /// A malformed blob or argument.
        case invalid
        case other
    }

    public let kind: Kind
    public let code: UInt32
    public let message: String

    init(kind: Int32, code: UInt32) {
        switch UInt32(kind) {
        case CTPM_UNREACHABLE.rawValue: self.kind = .unreachable
        case CTPM_FOREIGN.rawValue: self.kind = .foreign
        case CTPM_POLICY.rawValue: self.kind = .policy
        case CTPM_LOCKOUT.rawValue: self.kind = .lockout
        case CTPM_BAD_AUTH.rawValue: self.kind = .badAuthorization
        case CTPM_INVALID.rawValue: self.kind = .invalid
        default: self.kind = .other
        }
        self.code = code
        message = ctpm_describe(code).map { String(cString: $0) } ?? "TPM error 0x\(String(code, radix: 16))"
    }

    public var description: String { "\(message) (0x\(String(code, radix: 16)))" }
}

/// A secret sealed to a TPM: the marshalled public and private parts of a keyed-hash object under
/// the owner hierarchy's storage primary key, and the PCRs its policy binds.
public struct SealedObject: Codable, Equatable, Sendable {
    public var publicArea: Data
    public var privateArea: Data
    /// SHA-256 PCR indexes whose values at sealing time unsealing needs (empty: none).
    public var pcrs: [Int]
    /// Whether unsealing needs an authorization value (then failures count against the TPM's
    /// dictionary-attack lockout).
    public var hasAuthorization: Bool

    static func mask(_ pcrs: [Int]) -> UInt32 {
        pcrs.reduce(UInt32(0)) { $0 | (($1 >= 0 && $1 < 24) ? UInt32(1) << UInt32($1) : 0) }
    }
}

/// The TPM's dictionary-attack state.
public struct TPMLockoutState: Sendable, Equatable {
    public var failures: UInt32
    public var maxTries: UInt32
    /// Seconds after which one failure is forgotten.
    public var interval: UInt32
    public var recovery: UInt32
}

/// A TPM 2.0 reached through a TCTI (tpm2-tss ESAPI): seal and unseal small secrets. Each call
/// opens the TPM and closes it again, so the daemon holds no TPM resources between them.
public struct TPM: Sendable {
    /// The TCTI configuration: "device:/dev/tpmrm0", "swtpm:host=127.0.0.1,port=2321", "mssim:…".
    public let tcti: String

    public init(tcti: String) { self.tcti = tcti }

    /// The kernel's resource manager device, when this machine has a TPM 2.0.
    public static let defaultDevice = "/dev/tpmrm0"
    public static let defaultTCTI = "device:" + defaultDevice

    /// Whether a TPM answers at `tcti`. For a device TCTI: whether the device opens (it may exist
    /// and still be refused, as under a service's `DevicePolicy=closed`), without talking to it.
    public static func isPresent(tcti: String) -> Bool {
        if tcti.hasPrefix("device:") || tcti == "device" {
            let path = tcti == "device" ? defaultDevice : String(tcti.dropFirst("device:".count))
            let fd = open(path.isEmpty ? defaultDevice : path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { return false }
            close(fd)
            return true
        }
        return (try? TPM(tcti: tcti).lockoutState()) != nil
    }

    private func withContext<R>(_ body: (OpaquePointer) throws(TPMError) -> R) throws(TPMError) -> R {
        var context: OpaquePointer?
        var rc: UInt32 = 0
        let kind = ctpm_open(tcti, &context, &rc)
        guard kind == Int32(CTPM_OK.rawValue), let context else { throw TPMError(kind: kind, code: rc) }
        defer { ctpm_close(context) }
        return try body(context)
    }

    /// Seals `secret` (at most 128 bytes), bound to `pcrs` and, with `authorization`, needing it.
    public func seal(_ secret: SecretBytes, pcrs: [Int] = [], authorization: SecretBytes? = nil) throws(TPMError) -> SealedObject {
        try withContext { (context) throws(TPMError) in
            var publicArea = [UInt8](repeating: 0, count: 1024), privateArea = [UInt8](repeating: 0, count: 1024)
            var publicCount = 0, privateCount = 0
            var rc: UInt32 = 0
            let kind = secret.withUnsafeBytes { s in
                Self.withOptional(authorization) { a in
                    publicArea.withUnsafeMutableBytes { p in
                        privateArea.withUnsafeMutableBytes { v in
                            ctpm_seal(context, s.bindMemory(to: UInt8.self).baseAddress, s.count, SealedObject.mask(pcrs),
                                      a.bindMemory(to: UInt8.self).baseAddress, a.count,
                                      p.bindMemory(to: UInt8.self).baseAddress, p.count, &publicCount,
                                      v.bindMemory(to: UInt8.self).baseAddress, v.count, &privateCount, &rc)
                        }
                    }
                }
            }
            guard kind == Int32(CTPM_OK.rawValue) else { throw TPMError(kind: kind, code: rc) }
            return SealedObject(publicArea: Data(publicArea.prefix(publicCount)), privateArea: Data(privateArea.prefix(privateCount)),
                                pcrs: pcrs.sorted(), hasAuthorization: authorization != nil)
        }
    }

    /// The secret `seal` sealed, in secure memory.
    public func unseal(_ sealed: SealedObject, authorization: SecretBytes? = nil) throws(TPMError) -> SecretBytes {
        let out: SecretBytes
        do { out = try SecretBytes(count: 128) } catch { throw TPMError(kind: Int32(CTPM_OTHER.rawValue), code: 0) }
        let count = try withContext { (context) throws(TPMError) -> Int in
            var count = 0
            var rc: UInt32 = 0
            let publicArea = Array(sealed.publicArea), privateArea = Array(sealed.privateArea)
            let kind = out.withUnsafeMutableBytes { o in
                Self.withOptional(authorization) { a in
                    ctpm_unseal(context, publicArea, publicArea.count, privateArea, privateArea.count, SealedObject.mask(sealed.pcrs),
                                a.bindMemory(to: UInt8.self).baseAddress, a.count,
                                o.bindMemory(to: UInt8.self).baseAddress, o.count, &count, &rc)
                }
            }
            guard kind == Int32(CTPM_OK.rawValue) else { throw TPMError(kind: kind, code: rc) }
            return count
        }
        do {
            return try out.withUnsafeBytes { (bytes) throws(CryptoError) in try SecretBytes(copying: UnsafeRawBufferPointer(rebasing: bytes.prefix(count))) }
        } catch {
            throw TPMError(kind: Int32(CTPM_OTHER.rawValue), code: 0)
        }
    }

    /// The dictionary-attack counter and its limits.
    public func lockoutState() throws(TPMError) -> TPMLockoutState {
        try withContext { (context) throws(TPMError) in
            var state = TPMLockoutState(failures: 0, maxTries: 0, interval: 0, recovery: 0)
            var rc: UInt32 = 0
            let kind = ctpm_lockout_state(context, &state.failures, &state.maxTries, &state.interval, &state.recovery, &rc)
            guard kind == Int32(CTPM_OK.rawValue) else { throw TPMError(kind: kind, code: rc) }
            return state
        }
    }

    private static func withOptional<R>(_ secret: SecretBytes?, _ body: (UnsafeRawBufferPointer) -> R) -> R {
        if let secret { return secret.withUnsafeBytes { body($0) } }
        return body(UnsafeRawBufferPointer(start: nil, count: 0))
    }
}
