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
    /// The engine's policy for a document a request sent; a name the engine does not know is a
    /// 400 that names it.
    static func policy(_ document: CustodyPolicy) throws(Failure) -> Policy {
        do {
            return try JSONDecoder().decode(Policy.self, from: JSONEncoder().encode(document))
        } catch {
            throw badRequest("invalid JSON body: policy: \(describe(error))")
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
    }
}
