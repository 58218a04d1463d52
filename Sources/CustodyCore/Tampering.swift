/// What authenticated encryption found wrong with a stored file.
public enum TamperKind: String, Sendable, CaseIterable {
    /// A content block's tag did not verify: bytes were changed, moved between files or positions.
    case block
    /// The header's tag did not verify: the header was changed, or belongs to another key.
    case header
    /// The content ends early: the final block was cut off.
    case truncated
}

/// What an authentication failure is taken for.
public enum DamageCause: String, Sendable {
    /// Changed by someone without the keys.
    case tampering
    /// Left by a write the daemon had not finished when it stopped uncleanly (`UncleanStop`).
    case tornWrite
}

extension Engine {
    /// Reports an encrypted file that failed authentication: an event naming its owner, the kind
    /// of damage and the path (relative to the mount, scrubbed), at most
    /// `EventRateLimiter.perSecond` a second (the rest are counted in the next one). A file last
    /// changed (`changed`: its ctime, wall-clock seconds) during a run of the daemon that did not
    /// stop cleanly is reported as a torn write (`tornWrite`), not as tampering. Nothing is read or
    /// repaired: the caller has already refused the request with an error. Returns what the damage
    /// was taken for.
    @discardableResult
    public func reportTampering(_ kind: TamperKind, owner: String?, path: String, changed: Double? = nil) -> DamageCause {
        let stop = changed.flatMap { uncleanStop(covering: $0) }
        guard let suppressed = tamperEvents.admit(now: clock.now()) else { return stop == nil ? .tampering : .tornWrite }
        // The owner as people know it (the file names its object ID, or an unmanaged name).
        let owner = owner.map { (try? account($0))?.upn ?? $0 }
        var details = ["kind": kind.rawValue, "path": scrubbedPath(path)]
        if suppressed > 0 { details["suppressed"] = "\(suppressed)" }
        let whose = owner.map { "\($0)'s" } ?? "a"
        if let stop {
            details["runStarted"] = "\(stop.started)"
            details["uncleanStopFoundAt"] = "\(stop.foundAt)"
            events.emit(.tornWrite, identity: owner,
                        "\(whose) encrypted file was being written when custodyd stopped without a clean shutdown; it ends in a torn block " +
                            "(\(kind.rawValue)): \(details["path"] ?? ""); cut it back to its last authentic block with custodyctl repair",
                        details: details)
            return .tornWrite
        }
        events.emit(.tamperDetected, identity: owner, "\(whose) encrypted file failed authentication (\(kind.rawValue)): \(details["path"] ?? "")",
                    details: details)
        return .tampering
    }
}
