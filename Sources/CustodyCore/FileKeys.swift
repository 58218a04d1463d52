import CustodyCrypto
import CustodyFormat
import Synchronization

/// An unwrapped per-file key lent to open handles of one file. Counted per open: the key goes
/// away at the last close. At a lock's grace expiry the engine revokes class A leases at once:
/// from then on every use must fail, and holders drop the key and what they derived from it.
public final class FileKeyLease: @unchecked Sendable {
    public let identity: IdentityKey
    public let protectionClass: ProtectionClass
    public let fileID: [UInt8]
    public let fileKey: SecretBytes
    private let revoked = Atomic<Bool>(false)

    init(identity: IdentityKey, protectionClass: ProtectionClass, fileID: [UInt8], fileKey: SecretBytes) {
        self.identity = identity
        self.protectionClass = protectionClass
        self.fileID = fileID
        self.fileKey = fileKey
    }

    /// True once the engine has withdrawn the key (class A at lock, or a wipe).
    public var isRevoked: Bool { revoked.load(ordering: .acquiring) }

    func revoke() { revoked.store(true, ordering: .releasing) }
}

/// The keys of open files, one lease per file ID, with the number of opens.
struct OpenFileKeys {
    private var entries: [[UInt8]: (lease: FileKeyLease, opens: Int)] = [:]

    mutating func reuse(_ fileID: [UInt8]) -> FileKeyLease? {
        guard let entry = entries[fileID], !entry.lease.isRevoked else { return nil }
        entries[fileID] = (entry.lease, entry.opens + 1)
        return entry.lease
    }

    mutating func add(_ lease: FileKeyLease) {
        entries[lease.fileID] = (lease, 1)
    }

    /// One close; true when that was the last open (the key is dropped).
    @discardableResult
    mutating func close(_ lease: FileKeyLease) -> Bool {
        guard let entry = entries[lease.fileID], entry.lease === lease else { return true }
        if entry.opens > 1 {
            entries[lease.fileID] = (entry.lease, entry.opens - 1)
            return false
        }
        entries[lease.fileID] = nil
        return true
    }

    /// Revokes and drops the leases that match; returns how many.
    mutating func revoke(where matches: (FileKeyLease) -> Bool) -> Int {
        let doomed = entries.filter { matches($0.value.lease) }
        for (fileID, entry) in doomed {
            entry.lease.revoke()
            entries[fileID] = nil
        }
        return doomed.count
    }

    func count(where matches: (FileKeyLease) -> Bool) -> Int {
        entries.values.filter { matches($0.lease) }.count
    }
}
