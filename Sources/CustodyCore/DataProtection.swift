import CustodyFormat

/// What a protected buffer says about itself (`protectionInfo` for data).
public struct DataProtectionInfo: Codable, Equatable, Sendable {
    /// False for bytes that were never protected.
    public var isProtected: Bool
    public var owner: String?
    public var managed: Bool
    public var encrypted: Bool
    public var protectionClass: String?
}

/// The SDK's data protection calls (IntuneMAMDataProtectionManager) on byte buffers: a managed
/// identity's data is encrypted in the file format (so a protected buffer written to disk is a
/// valid encrypted file); an unmanaged identity's data gets a header naming it and stays plain;
/// unprotecting bytes that were never protected returns them unchanged.
extension Engine {
    public func protectData(_ bytes: [UInt8], for identity: String) throws(EngineError) -> [UInt8] {
        let name = registeredName(identity)
        let owner: Owner
        do { owner = try Owner(name) } catch { throw .invalidIdentity("\(error)") }
        do {
            guard let protectionClass = effectiveProtection(for: name) else {
                return try ProtectedData.tag(bytes, owner: owner)
            }
            let classKey = try self.classKey(for: name, protectionClass, purpose: .create)
            return try ProtectedData.encrypt(bytes, owner: nil, protectionClass: protectionClass, classKey: classKey)
        } catch let error as EngineError {
            throw error
        } catch {
            throw .failedToProtectData("\(error)")
        }
    }

    public func unprotectData(_ bytes: [UInt8]) throws(EngineError) -> [UInt8] {
        var refusal: EngineError?
        do {
            return try ProtectedData.unprotect(bytes) { (header) throws(FormatError) -> ClassKey in
                do throws(EngineError) {
                    return try self.classKey(for: try self.account(of: header).id, header.protectionClass, purpose: .open, id: header.classKeyID)
                } catch {
                    refusal = error
                    throw FormatError.unsupported("no key")
                }
            }
        } catch {
            switch refusal {
            case .unknownAccount?, .notEnrolled?:
                let owner = (try? ProtectedData.header(of: bytes))?.map { ownerName(of: $0) } ?? "its owner"
                throw .failedToUnprotectData("no keys for \(owner) (wiped, or never enrolled here)")
            case let refusal?: throw refusal
            case nil: throw .failedToUnprotectData("\(error)")
            }
        }
    }

    public func dataProtectionInfo(_ bytes: [UInt8]) throws(EngineError) -> DataProtectionInfo {
        let header: FileHeader?
        do { header = try ProtectedData.header(of: bytes) } catch { throw .failedToUnprotectData("\(error)") }
        guard let header else { return DataProtectionInfo(isProtected: false, owner: nil, managed: false, encrypted: false, protectionClass: nil) }
        let encrypted = header.kind == .encrypted
        return DataProtectionInfo(isProtected: true, owner: ownerName(of: header),
                                  managed: (try? account(of: header))?.isEnrolled ?? false,
                                  encrypted: encrypted, protectionClass: encrypted ? header.protectionClass.description : nil)
    }
}
