import CustodyFormat

/// The keys of managed identities' names (`NameCipher`). An identity's name key comes from its
/// class C key: it is there from the identity's first unlock (as on iOS, where a locked device
/// still lists its files) until the daemon stops or the identity is wiped, when it goes with the
/// identity's other keys.
extension Engine {
    /// The name key of `identity` while it is held; nil before the identity's first unlock, for an
    /// unmanaged or unknown identity, and after a wipe.
    public func nameKey(for identity: String) -> NameKey? {
        guard let account = try? account(identity) else { return nil }
        return state.withLock { $0.keys[account.key]?.nameKey }
    }

    /// Every name key held now, by its tag (what a stored name carries), with its identity's UPN.
    public func nameKeysByTag() -> [String: (key: NameKey, identity: String)] {
        let accounts = self.accounts()
        return state.withLock { state in
            var result: [String: (key: NameKey, identity: String)] = [:]
            for account in accounts {
                if let key = state.keys[account.key]?.nameKey { result[key.tag] = (key, account.upn) }
            }
            return result
        }
    }
}
