import Glibc

/// The capabilities of a process that calls into the mount, where the kernel leaves a decision
/// to the daemon that it would make from them (the daemon's own are not the caller's). Read from
/// /proc/TID/status while the caller waits for its request; counted only for a caller in the
/// daemon's user namespace, since a capability held in another one covers only that namespace's
/// files.
public enum CallerCapabilities {
    /// CAP_FSETID: keep set-ID bits where others lose them.
    public static let setID = 4

    /// Whether thread `thread` has `capability` in its effective set, in the daemon's user
    /// namespace. False when it cannot be told (the thread is gone, /proc is not readable).
    public static func has(_ capability: Int, thread: pid_t) -> Bool {
        guard thread > 0, capability >= 0, capability < 64, sharesUserNamespace(thread: thread),
              let effective = effectiveSet(of: thread) else { return false }
        return effective & (1 << UInt64(capability)) != 0
    }

    /// The `CapEff:` mask of /proc/TID/status.
    static func effectiveSet(of thread: pid_t) -> UInt64? {
        mask(ProcStatus.values("CapEff:", of: thread))
    }

    /// The `CapEff:` mask of a /proc status text; nil when the line is missing or malformed.
    static func effectiveSet(inStatus status: String) -> UInt64? {
        mask(ProcStatus.values("CapEff:", in: status))
    }

    /// A capability line's one value, 64 bits of hexadecimal.
    private static func mask(_ values: [Substring]?) -> UInt64? {
        guard let values, values.count == 1, let value = values.first, value.count <= 16 else { return nil }
        return UInt64(value, radix: 16)
    }

    static func sharesUserNamespace(thread: pid_t) -> Bool {
        var caller = stat(), own = stat()
        guard stat("/proc/\(thread)/ns/user", &caller) == 0, stat("/proc/self/ns/user", &own) == 0 else { return false }
        return caller.st_dev == own.st_dev && caller.st_ino == own.st_ino
    }
}
