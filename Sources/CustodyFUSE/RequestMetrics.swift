import CFuse3
import CustodyCore
import CustodyFormat
import CustodyMetrics
import CustodySystem

/// What the thread serving a request noted about its answer: the errno it replied with.
final class RequestSlot {
    var errno: Int32 = 0
    static let slots = PerThread { RequestSlot() }
}

/// Answers a request with an error (0: success without data), noting the errno for the metrics.
@inline(__always)
func replyError(_ req: fuse_req_t?, _ code: Int32) {
    if code != 0 { RequestSlot.slots.value.errno = code }
    fuse_reply_err(req, code)
}

extension MountFileSystem {
    /// Serves one request with `body` and, when the daemon counts, counts it: its operation, the
    /// time to the answer, and the errno it was answered with.
    @inline(__always)
    func serve(_ operation: FileOperation, _ body: (MountFileSystem) -> Void) {
        if StorageEdges.waitsForReleases[operation.rawValue] { storageEdges.settleReleases() }
        guard let metrics else { return body(self) }
        let slot = RequestSlot.slots.value
        slot.errno = 0
        let start = monotonicNanoseconds()
        body(self)
        metrics.served(operation, nanoseconds: monotonicNanoseconds() &- start, errno: slot.errno)
    }

    /// Counts an encrypted file that failed authentication and reports it to the engine (an event
    /// naming its owner), once per open content, so a program that retries does not flood the
    /// stream. Every kind counts: a changed header (any field: the magic, the version, a length,
    /// the key ID, the wrap), a changed or moved block, a file cut short. A file last changed
    /// while a run of the daemon that did not stop cleanly was writing it is counted and reported
    /// as a torn write instead (`Engine.reportTampering`).
    func noteTampering(_ error: FormatError, of inode: Inode?, owner: String?, content: ProtectedContent? = nil) {
        guard let kind = Self.tamperKind(error) else { return }
        let cause: DamageCause
        if let content, let reported = content.damageReported.withLock({ $0 }) {
            cause = reported
        } else {
            let changed = inode.flatMap { try? Syscall.stat(of: $0.fd) }.map { Double($0.st_ctim.tv_sec) + Double($0.st_ctim.tv_nsec) / 1e9 }
            cause = engine?.reportTampering(kind, owner: owner, path: inode.map { mountRelativePath(of: $0) } ?? "", changed: changed) ?? .tampering
            content?.damageReported.withLock { $0 = cause }
        }
        switch cause {
        case .tampering: metrics?.tampered(kind)
        case .tornWrite: metrics?.tornWrite(kind)
        }
    }

    /// What kind of damage an error of the format is, or nil when it is not damage (I/O, crypto).
    static func tamperKind(_ error: FormatError) -> TamperKind? {
        switch error {
        case .blockAuthenticationFailed: return .block
        case .headerAuthenticationFailed, .corruptHeader, .wrongKey, .notProtected, .unsupportedVersion, .invalidOwner: return .header
        case .truncated, .corruptLength: return .truncated
        // Names are not content: a name that does not open is reported where names are read.
        case .unsupported, .io, .crypto, .corruptName: return nil
        }
    }
}
