/// Which users are present: the login sessions of each, and whether each is locked. It turns
/// what logind reports into the two things the engine acts on — a user left (every session
/// locked, or the last one ended) and a user returned (a session unlocked) — without any bus,
/// so it is tested on its own.
public struct SessionTracker: Sendable {
    public struct Session: Equatable, Sendable {
        public var id: String
        public var uid: UInt32
        public var locked: Bool
    }

    /// What the engine should do after an update.
    public enum Change: Equatable, Sendable {
        /// Every session of the user is locked now.
        case locked(UInt32)
        /// The user's last session ended.
        case loggedOut(UInt32)
        /// A session of the user is unlocked again.
        case returned(UInt32)
    }

    /// By object path.
    public private(set) var sessions: [String: Session] = [:]

    public init() {}

    /// A user is present when it has a session that is not locked.
    func isPresent(_ uid: UInt32) -> Bool { sessions.values.contains { $0.uid == uid && !$0.locked } }

    /// Replaces the sessions with a fresh list (ListSessions, and each one's LockedHint).
    public mutating func replace(with list: [(path: String, session: Session)]) -> [Change] {
        let before = sessions
        sessions = Dictionary(list.map { ($0.path, $0.session) }, uniquingKeysWith: { _, last in last })
        var changes: [Change] = []
        let users = Set(before.values.map(\.uid)).union(sessions.values.map(\.uid))
        for uid in users.sorted() {
            let was = before.values.contains { $0.uid == uid && !$0.locked }
            let had = before.values.contains { $0.uid == uid }
            let has = sessions.values.contains { $0.uid == uid }
            if had, !has { changes.append(.loggedOut(uid)) } else if was, !isPresent(uid), has { changes.append(.locked(uid)) } else if !was, isPresent(uid), had { changes.append(.returned(uid)) }
        }
        return changes
    }

    /// A session locked (the `Lock` signal or `LockedHint` true) or unlocked.
    public mutating func setLocked(_ path: String, _ locked: Bool) -> [Change] {
        guard var session = sessions[path], session.locked != locked else { return [] }
        let was = isPresent(session.uid)
        session.locked = locked
        sessions[path] = session
        let now = isPresent(session.uid)
        if was, !now { return [.locked(session.uid)] }
        if !locked { return [.returned(session.uid)] }
        return []
    }
}
