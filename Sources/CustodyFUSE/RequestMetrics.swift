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

extension PassthroughFilesystem {
    /// Serves one request with `body` and, when the daemon counts, counts it: its operation, the
    /// time to the answer, and the errno it was answered with.
    @inline(__always)
    func serve(_ operation: FileOperation, _ body: (PassthroughFilesystem) -> Void) {
        if StorageEdges.waitsForReleases[operation.rawValue] { storageEdges.settleReleases() }
        guard let metrics else { return body(self) }
        let slot = RequestSlot.slots.value
        slot.errno = 0
        let start = monotonicNanoseconds()
        body(self)
        metrics.served(operation, nanoseconds: monotonicNanoseconds() &- start, errno: slot.errno)
    }

    /// Counts an encrypted file that failed authentication and reports it to the engine (an event
    /// naming its owner), once per open content, so a program that retries does not flood the stream.
    func noteTampering(_ error: FormatError, of inode: Inode?, owner: String?, content: ProtectedContent? = nil) {
        let kind: TamperKind
        switch error {
        case .blockAuthenticationFailed: kind = .block
        case .headerAuthenticationFailed: kind = .header
        case .truncated: kind = .truncated
        default: return
        }
        metrics?.tampered(kind)
        if let content, content.tamperReported.exchange(true, ordering: .relaxed) { return }
        engine?.reportTampering(kind, owner: owner, path: inode.map { mountRelativePath(of: $0) } ?? "")
    }
}
