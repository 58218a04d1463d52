import Dispatch

/// `AllowedAccounts` (the SDK's allowed accounts): when the list is not empty, only the accounts it
/// names may enroll (`enroll` refuses the others with 209 AccountNotAllowed). An account enrolled
/// before the list stopped naming it is not silently left as it was: the status marks it, an
/// event names it, and `AllowedAccountsAction` decides what happens to it: `warn` (the default:
/// it stays enrolled), `deregister` (its keys stay sealed and its files encrypted, so allowing
/// and enrolling it again restores them) or `wipe`.
public enum AllowedAccountsAction: String, Codable, Sendable, CaseIterable {
    case warn, deregister, wipe
}

extension Engine {
    /// Whether `account` may be enrolled under the current `AllowedAccounts` (any, when it is empty).
    public func isAllowed(_ account: Account) -> Bool {
        Self.isAllowed(id: account.id, upn: account.upn, settings.allowedAccounts)
    }

    /// Whether `allowed` (an `AllowedAccounts` list; empty: every account) names the account with
    /// `id` and `upn`, by either, in any case.
    public static func isAllowed(id: String, upn: String, _ allowed: [String]) -> Bool {
        guard !allowed.isEmpty else { return true }
        let keys = allowed.map(IdentityKey.init)
        return keys.contains(IdentityKey(id)) || keys.contains(IdentityKey(upn))
    }

    /// Enrolled accounts that `AllowedAccounts` does not name.
    public func accountsNotAllowed() -> [Account] {
        let allowed = settings.allowedAccounts
        return accounts().filter { $0.isEnrolled && !Self.isAllowed(id: $0.id, upn: $0.upn, allowed) }
    }

    /// Acts on the enrolled accounts `AllowedAccounts` does not name, as `AllowedAccountsAction`
    /// says: an event for each (209 AccountNotAllowed), then nothing, a deregistration or a wipe
    /// (in the background, as a wipe deletes files). The daemon calls it once its mounts are
    /// attached, and after every reload. Returns the accounts it acted on.
    @discardableResult
    public func applyAllowedAccounts() -> [Account] {
        let refused = accountsNotAllowed()
        for account in refused { act(on: account, settings.allowedAccountsAction, because: "AllowedAccounts does not name it") }
        return refused
    }

    /// Tells observers why `account` should no longer be enrolled, then does what `action` says.
    func act(on account: Account, _ action: AllowedAccountsAction, because reason: String) {
        let outcome: String
        switch action {
        case .warn: outcome = "it stays enrolled (AllowedAccountsAction = warn)"
        case .deregister: outcome = "deregistering it; its keys stay sealed (AllowedAccountsAction = deregister)"
        case .wipe: outcome = "wiping it (AllowedAccountsAction = wipe)"
        }
        events.emit(.accountNotAllowed, identity: account.upn, code: 209,
                    "\(account.upn) is enrolled, but \(reason): \(outcome)", details: ["action": action.rawValue])
        switch action {
        case .warn: break
        case .deregister:
            do { try deregister(account.id, wipe: false) } catch {
                events.emit(.stateProblem, identity: account.upn, code: error.code, "deregistering \(account.upn) failed: \(error)")
            }
        case .wipe:
            DispatchQueue.global().async { [self] in try? self.deregister(account.id, wipe: true) }
        }
    }

    /// Tells observers that the list changed (the SDK's IntuneMAMAllowedAccountsDidChangeNotification).
    func allowedAccountsChanged(from old: [String], to new: [String]) {
        guard Set(old.map { IdentityKey($0).folded }) != Set(new.map { IdentityKey($0).folded }) else { return }
        events.emit(.allowedAccountsChanged, identity: nil,
                    new.isEmpty ? "AllowedAccounts is empty: every account may enroll" : "AllowedAccounts names \(new.count) accounts",
                    details: ["count": "\(new.count)", "notAllowed": "\(accountsNotAllowed().count)"])
    }
}
