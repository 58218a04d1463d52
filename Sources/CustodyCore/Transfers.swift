import CustodySystem
import Glibc
import Synchronization

/// Which other identities a managed identity's data may go to, or come from (the console's
/// "all apps / policy managed apps / none").
public enum TransferScope: String, Codable, Sendable, CaseIterable {
    /// Every identity, managed or not, and processes with no identity.
    case all
    /// Only enrolled (managed) identities.
    case managed
    /// No other identity.
    case none
}

/// The process moving data: its uid and, looked up only when needed, its executable's path (for
/// events) and what the kernel says about the program it runs (for exemptions).
public struct TransferParty: Sendable {
    public var uid: UInt32
    /// The process (or thread) ID, for the event; 0 when not a process (the control API's checks).
    public var pid: Int32
    private let programLookup: @Sendable () -> RunningProgram?

    public init(uid: UInt32, pid: Int32, program: @escaping @Sendable () -> RunningProgram?) {
        self.uid = uid
        self.pid = pid
        self.programLookup = program
    }

    /// A process of the machine, inspected through /proc (`RunningProgram.inspect`).
    public static func process(_ pid: Int32, uid: UInt32) -> TransferParty {
        TransferParty(uid: uid, pid: pid) { RunningProgram.inspect(pid) }
    }

    /// The program the process runs, as the kernel tells the daemon.
    public var program: RunningProgram? { programLookup() }

    /// An owner given to a file through the control API: no process reads it, so no exemption.
    public static let ownerChange = TransferParty(uid: UInt32.max, pid: 0) { nil }
}

/// The answer to "may this data go from one identity to another": allowed or not, why, and for
/// a refusal the stable code and name the control API reports.
public struct TransferDecision: Codable, Equatable, Sendable {
    public var allowed: Bool
    public var reason: String
    /// 312 SharingNotAllowed (the sender's policy), 313 ReceivingNotAllowed (the receiver's).
    public var code: Int?
    public var name: String?
    /// Data moved between two different identities (an allowed transfer), not within one.
    public var crossesIdentities: Bool
    /// Allowed only because the process is exempt (its uid or executable).
    public var exempt: Bool = false

    static func allow(_ reason: String, crossing: Bool, exempt: Bool = false) -> TransferDecision {
        TransferDecision(allowed: true, reason: reason, code: nil, name: nil, crossesIdentities: crossing, exempt: exempt)
    }

    static func refuseSending(_ reason: String) -> TransferDecision {
        TransferDecision(allowed: false, reason: reason, code: 312, name: "SharingNotAllowed", crossesIdentities: true)
    }

    /// A refusal whose side is not known.
    public static func refused(_ reason: String) -> TransferDecision { refuseSending(reason) }

    static func refuseReceiving(_ reason: String) -> TransferDecision {
        TransferDecision(allowed: false, reason: reason, code: 313, name: "ReceivingNotAllowed", crossesIdentities: true)
    }
}

/// The identity boundary at run time: data of a managed identity reaches another identity (or
/// a process with none) only as the sender's `sendToOtherIdentities` and the receiver's
/// `receiveFromOtherIdentities` allow. Reading a file moves its owner's data to the reader;
/// writing into a file, or giving a file a new owner, moves the writer's (or old owner's) data
/// to the file's owner. See docs/identity.md.
extension Engine {
    /// Whether opening a file of `owner` needs the caller's identity: the owner is managed (its
    /// policy decides now, and may refuse later: handles across identities are granted and
    /// checked again), or some managed identity restricts what it receives. When not, the mount
    /// does not need to know who is asking. Cheap: no /proc, no allocation.
    public func transfersNeedChecking(owner: String?) -> Bool {
        let rules = transferRules()
        if rules.anyRestrictedReceiver { return true }
        guard let owner else { return false }
        return rules.managedIdentities.contains(IdentityKey(owner))
    }

    /// May data of `source` (nil: no identity) go to `target` (nil: no identity), moved by
    /// `party`? Same identity: always. Then the exceptions (uids and executables in the
    /// settings and in the managed side's policy), then the sender's scope, then the receiver's.
    public func transferDecision(from source: String?, to target: String?, by party: TransferParty) -> TransferDecision {
        let sender = source.flatMap { try? account($0) }
        let receiver = target.flatMap { try? account($0) }
        if sameIdentity(source, sender, target, receiver) {
            return .allow("the data stays with \(sender?.upn ?? source ?? "no identity")", crossing: false)
        }
        let senderPolicy = sender?.policy, receiverPolicy = receiver?.policy
        let sourceName = sender?.upn ?? source.map { "unmanaged identity \($0)" } ?? "no identity"
        let targetName = receiver?.upn ?? target.map { "unmanaged identity \($0)" } ?? "no identity"
        if senderPolicy == nil, receiverPolicy == nil {
            return .allow("neither \(sourceName) nor \(targetName) is managed", crossing: true)
        }
        let (exemption, impostor) = exemption(of: party, policies: [senderPolicy, receiverPolicy].compactMap { $0 })
        if let exemption { return .allow(exemption, crossing: true, exempt: true) }
        let decision = scopeDecision(sender, senderPolicy, sourceName, receiver, receiverPolicy, targetName)
        // A process that looks like an exempt program but is not trusted as one: say why.
        guard let impostor, !decision.allowed else { return decision }
        var refused = decision
        refused.reason += "; not exempt: \(impostor)"
        return refused
    }

    /// The sender's scope, then the receiver's.
    private func scopeDecision(_ sender: Account?, _ senderPolicy: Policy?, _ sourceName: String,
                               _ receiver: Account?, _ receiverPolicy: Policy?, _ targetName: String) -> TransferDecision {
        if let sender, let policy = senderPolicy {
            switch policy.sendToOtherIdentities {
            case .all:
                break
            case .managed where receiverPolicy != nil:
                break
            case .managed:
                return .refuseSending("\(sender.upn)'s policy sends its data only to managed identities, not to \(targetName)")
            case .none:
                return .refuseSending("\(sender.upn)'s policy keeps its data from other identities (\(targetName))")
            }
        }
        if let receiver, let policy = receiverPolicy {
            switch policy.receiveFromOtherIdentities {
            case .all:
                break
            case .managed where senderPolicy != nil:
                break
            case .managed:
                return .refuseReceiving("\(receiver.upn)'s policy accepts data only from managed identities, not from \(sourceName)")
            case .none:
                return .refuseReceiving("\(receiver.upn)'s policy accepts no data from other identities (\(sourceName))")
            }
        }
        return .allow("\(sourceName) may send to \(targetName) and \(targetName) may receive it", crossing: true)
    }

    private func sameIdentity(_ source: String?, _ sender: Account?, _ target: String?, _ receiver: Account?) -> Bool {
        switch (source, target) {
        case (nil, nil): return true
        case (nil, _), (_, nil): return false
        case let (source?, target?):
            if let sender, let receiver { return sender.id == receiver.id }
            if sender != nil || receiver != nil { return false }
            return IdentityKey(source) == IdentityKey(target)
        }
    }

    /// Why `party` is let through whatever the scopes say; else, when it looks like an exempt
    /// program but is not trusted as one, why not (`ExemptPrograms`).
    func exemption(of party: TransferParty, policies: [Policy]) -> (exempt: String?, impostor: String?) {
        let settings = self.settings
        if settings.transferExemptUids.contains(party.uid) { return ("uid \(party.uid) is exempt (settings)", nil) }
        if policies.contains(where: { $0.transferExemptUids.contains(party.uid) }) { return ("uid \(party.uid) is exempt (policy)", nil) }
        let executables = settings.transferExemptExecutables + policies.flatMap(\.transferExemptExecutables)
        guard !executables.isEmpty, let program = party.program else { return (nil, nil) }
        switch ExemptPrograms.match(program, among: executables) {
        case .exempt(let path): return ("\(path) is exempt", nil)
        case .impostor(let why): return (nil, why)
        case .none: return (nil, nil)
        }
    }

    /// Reports a refused transfer: an event (at most `TransferEvents.perSecond` a second; the
    /// rest are counted in the next one) with who tried, whose data, and where.
    public func reportBlockedTransfer(_ decision: TransferDecision, source: String?, target: String?, party: TransferParty,
                                      operation: String, path: String) {
        guard let suppressed = transferEvents.admit(now: clock.now()) else { return }
        var details = ["pid": "\(party.pid)", "uid": "\(party.uid)", "operation": operation,
                       "path": scrubbedPath(path), "code": "\(decision.code ?? 0)", "reason": decision.reason]
        details["executable"] = party.program?.path ?? "unknown"
        details["from"] = source ?? ""
        details["to"] = target ?? ""
        if suppressed > 0 { details["suppressed"] = "\(suppressed)" }
        let managed = (source.flatMap { try? account($0) }?.isEnrolled == true) ? source : target
        events.emit(.transferBlocked, identity: managed, code: decision.code,
                    "blocked: \(operation) of \(source ?? "no identity")'s data by a process of \(target ?? "no identity")", details: details)
    }

    /// `path` with every value of `ValuesToScrubFromLogging` replaced, as the log does.
    func scrubbedPath(_ path: String) -> String {
        var result = path
        for value in settings.valuesToScrubFromLogging where !value.isEmpty {
            result = result.replacingAll(of: value, with: "[scrubbed]")
        }
        return result
    }

    /// The managed identities and whether any restricts receiving, for `transfersNeedChecking`;
    /// recomputed when the policy generation changes.
    func transferRules() -> TransferRules {
        let generation = policyGeneration.load(ordering: .acquiring)
        if let cached = transferRulesBox.withLock({ $0 }), cached.generation == generation { return cached }
        var rules = TransferRules(generation: generation)
        for account in accounts() {
            guard let policy = account.policy else { continue }
            rules.managedIdentities.insert(account.key)
            rules.managedIdentities.insert(IdentityKey(account.upn))
            if policy.receiveFromOtherIdentities != .all { rules.anyRestrictedReceiver = true }
        }
        transferRulesBox.withLock { $0 = rules }
        return rules
    }

    /// A number that changes whenever a policy or the settings change (grants check again).
    public var currentPolicyGeneration: UInt64 { policyGeneration.load(ordering: .acquiring) }
}

struct TransferRules: Sendable {
    var generation: UInt64
    var managedIdentities: Set<IdentityKey> = []
    var anyRestrictedReceiver = false
}

/// Keeps a process that retries a refused open (or reads a damaged file) in a loop from flooding
/// the event stream.
final class EventRateLimiter: Sendable {
    static let perSecond = 20
    private struct Window { var start: Double = 0; var admitted = 0; var suppressed = 0 }
    private let window = Mutex(Window())

    /// The number of events suppressed before this one, or nil to suppress this one.
    func admit(now: Double) -> Int? {
        window.withLock { window in
            if now - window.start >= 1 {
                window.start = now
                window.admitted = 0
            }
            guard window.admitted < Self.perSecond else {
                window.suppressed += 1
                return nil
            }
            window.admitted += 1
            defer { window.suppressed = 0 }
            return window.suppressed
        }
    }
}
