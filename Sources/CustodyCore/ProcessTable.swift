import CustodySystem
import Glibc

/// What identity resolution needs to know about processes. The Linux implementation reads /proc;
/// tests substitute a table of their own (to stage a reused PID, for example).
public protocol ProcessTable: Sendable {
    /// The process (thread group) a thread belongs to: the `Tgid:` of /proc/TID/status.
    func process(ofThread tid: Int32) -> Int32?
    /// The parent process (`PPid:`), nil for the top of the tree or a process that is gone.
    func parent(of pid: Int32) -> Int32?
    /// When the process or thread started (field 22 of /proc/PID/stat, clock ticks since boot):
    /// a PID that is reused by an unrelated process has another start time.
    func startTime(of pid: Int32) -> UInt64?
    /// Something that tells, cheaply and later, whether `id` is still the same process or thread
    /// (not one that reused its ID); nil when it is gone already.
    func probe(_ id: Int32) -> TaskProbe?
}

/// Whether a process or thread seen earlier still runs (see `ProcessTable.probe`).
public protocol TaskProbe: AnyObject, Sendable {
    var isSameTask: Bool { get }
}

extension ProcessTable {
    /// Compares start times again on every check.
    public func probe(_ id: Int32) -> TaskProbe? {
        guard let start = startTime(of: id) else { return nil }
        return StartTimeProbe(table: self, id: id, start: start)
    }
}

final class StartTimeProbe: TaskProbe {
    let table: ProcessTable
    let id: Int32
    let start: UInt64
    init(table: ProcessTable, id: Int32, start: UInt64) {
        self.table = table
        self.id = id
        self.start = start
    }
    var isSameTask: Bool { table.startTime(of: id) == start }
}

/// A descriptor of `/proc/ID/comm`, held open: reading it fails with ESRCH once that task has
/// exited, even when its ID is reused (the descriptor names the task, not the number). One
/// `pread` of a few bytes, about a microsecond, instead of reading and parsing two /proc files.
final class ProcDescriptorProbe: TaskProbe {
    let fd: Int32
    init?(id: Int32) {
        let fd = open("/proc/\(id)/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        self.fd = fd
    }
    deinit { close(fd) }
    var isSameTask: Bool {
        var byte: UInt8 = 0
        return pread(fd, &byte, 1, 0) == 1
    }
}

public struct LinuxProcessTable: ProcessTable {
    public init() {}

    public func process(ofThread tid: Int32) -> Int32? { statusField("Tgid:", of: tid) }

    public func probe(_ id: Int32) -> TaskProbe? { ProcDescriptorProbe(id: id) }

    public func parent(of pid: Int32) -> Int32? {
        guard let parent = statusField("PPid:", of: pid), parent > 0 else { return nil }
        return parent
    }

    public func startTime(of pid: Int32) -> UInt64? { ProcessStat(pid)?.start }

    /// The real uid of a process (first value of `Uid:`).
    public func uid(of pid: Int32) -> UInt32? {
        ProcStatus.values("Uid:", of: pid)?.first.flatMap { UInt32($0) }
    }

    /// The supplementary groups of a process (`Groups:`).
    public func groups(of pid: Int32) -> [UInt32] {
        ProcStatus.values("Groups:", of: pid)?.compactMap { UInt32($0) } ?? []
    }

    private func statusField(_ name: String, of pid: Int32) -> Int32? {
        ProcStatus.values(name, of: pid)?.first.flatMap { Int32($0) }
    }

}

/// A process or thread as bound: its ID and start time, so that a reused ID does not match.
public struct TaskKey: Hashable, Codable, Sendable {
    public var id: Int32
    public var startTime: UInt64
}

/// Where an effective identity came from.
public enum IdentitySource: Equatable, Sendable, CustomStringConvertible {
    case thread(Int32)
    case process(Int32)
    /// Inherited from an ancestor process bound to it.
    case ancestor(Int32)
    case uidDefault(UInt32)
    /// The managed account that belongs to the uid (enrolled with its uid or user name).
    case uidAccount(UInt32)
    case primaryAccount
    case none

    public var description: String {
        switch self {
        case .thread(let tid): return "thread \(tid)"
        case .process(let pid): return "process \(pid)"
        case .ancestor(let pid): return "ancestor process \(pid)"
        case .uidDefault(let uid): return "default of uid \(uid)"
        case .uidAccount(let uid): return "account of uid \(uid)"
        case .primaryAccount: return "primary account"
        case .none: return "none"
        }
    }
}

/// The effective identity of a caller (nil identity: no identity).
public struct ResolvedIdentity: Equatable, Sendable {
    public var identity: String?
    public var source: IdentitySource

    public init(identity: String?, source: IdentitySource) {
        self.identity = identity
        self.source = source
    }

    /// No identity at all.
    public static let nobody = ResolvedIdentity(identity: nil, source: .none)
}
