import CustodyAPI
import CustodyCore
import FoundationEssentials

// Engine values as the API's documents (CustodyAPI), the one definition the daemon writes and
// clients read.
//
// The policy travels as `CustodyPolicy` (CustodyAPI: names as strings, every field optional, what
// clients build and read) and lives in the engine as `Policy` (typed, with defaults). The daemon
// turns one into the other with the engine's own decoding, the same that reads custody.toml's
// policies and accounts.json: a level, location or scope is accepted or refused by one rule.

extension ControlAPI {
    /// The engine's policy for a document a request sent; a value the engine does not take (a
    /// level, location or scope it does not know) is the policy error (301 InvalidPolicy), which
    /// names it and what is accepted.
    static func policy(_ document: CustodyPolicy) throws(Failure) -> Policy {
        do {
            return try JSONDecoder().decode(Policy.self, from: JSONEncoder().encode(document))
        } catch {
            throw failure(.invalidPolicy(describe(error)))
        }
    }

    /// The document an answer carries for the engine's policy.
    static func document(_ policy: Policy) -> CustodyPolicy? {
        try? JSONDecoder().decode(CustodyPolicy.self, from: JSONEncoder().encode(policy))
    }
}

extension CustodyAccount {
    /// The document an answer carries for an account (the status adds its lock state).
    init(_ account: Account) {
        self.init(id: account.id, upn: account.upn, enrolled: account.isEnrolled, policy: account.policy.flatMap(ControlAPI.document),
                  uid: account.uid)
        hasPassphrase = account.hasPassphrase
        hasLoginProtector = account.hasLoginProtector ?? false
        hasRecoveryKey = account.hasRecoveryKey ?? false
        reprotectPending = account.reprotectPending
        if account.isEnrolled, let ids = account.keyIDs, !ids.isEmpty { keyGenerations = max(1, ids.count / 4) }
    }
}

extension CustodyMachineKey {
    init(_ status: MachineKeyStatus) {
        self.init(store: status.store?.rawValue, id: status.id, pcrs: status.pcrs, tpm: status.tpm,
                  dictionaryAttack: status.dictionaryAttack.map {
                      DictionaryAttack(failures: $0.failures, maxTries: $0.maxTries, intervalSeconds: $0.intervalSeconds)
                  },
                  problem: status.problem,
                  keys: status.keys.map { Key(id: $0.id, store: $0.store.rawValue, current: $0.current, available: $0.available, problem: $0.problem) },
                  warning: status.warning, stranded: status.stranded)
    }
}

extension CustodyStateProblem {
    init(_ problem: StateProblem) {
        self.init(kind: problem.kind.rawValue, file: problem.file, message: problem.message, identity: problem.identity, setAsideAs: problem.setAsideAs)
    }
}

extension CustodyGuardStatus {
    init(_ status: GuardStatus) {
        self.init(level: status.level, reason: status.reason, fileSystems: status.fileSystems, holders: status.holders, refusals: status.refusals)
    }
}

extension CustodyAPI.FileProtectionInfo {
    init(_ info: CustodyCore.FileProtectionInfo) {
        self.init(path: info.path, kind: info.kind, owner: info.owner, managed: info.managed, encrypted: info.encrypted,
                  protectionClass: info.protectionClass, size: info.size, mountPoint: info.mountPoint, plainReason: info.plainReason)
    }
}

extension CustodyAPI.DataProtectionInfo {
    init(_ info: CustodyCore.DataProtectionInfo) {
        self.init(isProtected: info.isProtected, owner: info.owner, managed: info.managed, encrypted: info.encrypted, protectionClass: info.protectionClass)
    }
}

extension CustodyAPI.SharingDecision {
    init(_ decision: CustodyCore.SharingDecision) {
        self.init(allowed: decision.allowed, reason: decision.reason, code: decision.code, name: decision.name)
    }
}

extension CustodyAPI.LocationSummary {
    init(_ summary: CustodyCore.LocationSummary) {
        self.init(name: summary.name, paths: summary.paths, neverMatches: summary.neverMatches,
                  saveToAllowed: summary.saveToAllowed, openFromAllowed: summary.openFromAllowed)
    }
}

extension CustodyAPI.PathLocation {
    init(_ location: CustodyCore.PathLocation) {
        self.init(path: location.path, location: location.location, under: location.under)
    }
}

extension CustodyEvent {
    init(_ event: EngineEvent) {
        self.init(sequence: event.sequence, time: event.time, kind: event.kind.rawValue, identity: event.identity, code: event.code,
                  message: event.message, details: event.details)
    }
}

extension LoginResult {
    init(_ outcome: Engine.LoginOutcome) {
        self.init(unlocked: outcome.unlocked, stillLocked: outcome.stillLocked, protected: outcome.protected)
    }
}

extension RecoveryEscrow {
    init(_ escrow: EscrowedRecoveryKey) {
        self.init(format: escrow.format, version: escrow.version, accountID: escrow.accountID, upn: escrow.upn, created: escrow.created,
                  publicKey: escrow.publicKey, sealed: escrow.sealed)
    }
}

extension CustodyIdentityExport {
    init(_ export: IdentityExport) {
        self.init(format: export.format, accountID: export.accountID, upn: export.upn, to: export.to, toFingerprint: export.toFingerprint,
                  from: export.from, created: export.created, sealed: export.sealed)
    }
}

extension IdentityExport {
    init(_ document: CustodyIdentityExport) {
        self.init(format: document.format, accountID: document.accountID, upn: document.upn, to: document.to,
                  toFingerprint: document.toFingerprint, from: document.from, created: document.created, sealed: document.sealed)
    }
}
