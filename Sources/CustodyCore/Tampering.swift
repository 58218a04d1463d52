/// What authenticated encryption found wrong with a stored file.
public enum TamperKind: String, Sendable, CaseIterable {
    /// A content block's tag did not verify: bytes were changed, moved between files or positions.
    case block
    /// The header's tag did not verify: the header was changed, or belongs to another key.
    case header
    /// The content ends early: the final block was cut off.
    case truncated
}

extension Engine {
    /// Reports an encrypted file that failed authentication: an event naming its owner, the kind
    /// of damage and the path (relative to the mount, scrubbed), at most
    /// `EventRateLimiter.perSecond` a second (the rest are counted in the next one). Nothing is
    /// read or repaired: the caller has already refused the request with an error.
    public func reportTampering(_ kind: TamperKind, owner: String?, path: String) {
        guard let suppressed = tamperEvents.admit(now: clock.now()) else { return }
        // The owner as people know it (the file names its object ID, or an unmanaged name).
        let owner = owner.map { (try? account($0))?.upn ?? $0 }
        var details = ["kind": kind.rawValue, "path": scrubbedPath(path)]
        if suppressed > 0 { details["suppressed"] = "\(suppressed)" }
        let whose = owner.map { "\($0)'s" } ?? "a"
        events.emit(.tamperDetected, identity: owner, "\(whose) encrypted file failed authentication (\(kind.rawValue)): \(details["path"] ?? "")",
                    details: details)
    }
}
