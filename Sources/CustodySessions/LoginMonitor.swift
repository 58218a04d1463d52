import CSystemd
import CustodyCore
import CustodySystem
import Glibc
import Synchronization

/// Follows systemd-logind (`org.freedesktop.login1` on the system bus, through sd-bus) and drives
/// the engine's locks with the login sessions, as Apple's lock screen drives Data Protection:
///
/// - every session of a user locked (the session's `Lock` signal, or `LockedHint` true) → that
///   user's identities start locking (the grace period, then class A keys go);
/// - a session unlocked (`Unlock`, `LockedHint` false) → a lock still in its grace period is
///   called off, and identities without a passphrase unlock;
/// - the user's last session ends (`SessionRemoved`) → its identities lock;
/// - `PrepareForSleep(true)` → every identity locks at once, and the mounts drop cached plaintext,
///   while a *delay* inhibitor holds the suspend back; the inhibitor is released then, and taken
///   again after the resume (`PrepareForSleep(false)`).
///
/// Without a bus or without logind the monitor logs it once and the daemon carries on with
/// manual locking. The bus is served on a thread of its own.
public final class LoginMonitor: @unchecked Sendable {
    private let engine: Engine
    private let log: @Sendable (String) -> Void
    private var bus: OpaquePointer?
    private var tracker = SessionTracker() {
        didSet { let ids = tracker.sessions.values.map { ($0.uid, $0.id) }; sessionIDs.withLock { $0 = ids } }
    }
    /// The sessions logind knows (uid, session ID), for other threads (`Engine.followLoginSessions`).
    private let sessionIDs = Mutex<[(UInt32, String)]>([])
    private var inhibitor: Int32 = -1
    private var slots: [OpaquePointer?] = []
    private let running = Atomic<Bool>(false)
    private var thread: pthread_t?

    public init(engine: Engine, log: @escaping @Sendable (String) -> Void) {
        self.engine = engine
        self.log = log
    }

    /// Connects and starts following logind; false (logged) when there is no bus or no logind.
    @discardableResult
    public func start() -> Bool {
        var connection: OpaquePointer?
        let opened = sd_bus_open_system(&connection)
        guard opened >= 0, let connection else {
            log("no system bus (\(Errno(-opened))): screen lock, suspend and logout do not lock identities; lock them with custodyctl")
            return false
        }
        bus = connection
        // A bus whose logind does not answer must not hold the daemon's start up for long.
        _ = sd_bus_set_method_call_timeout(connection, 2_000_000)
        guard subscribe() else {
            log("cannot follow logind on the system bus: screen lock, suspend and logout do not lock identities")
            close()
            return false
        }
        guard resynchronize() else {
            log("logind is not on the system bus: screen lock, suspend and logout do not lock identities; lock them with custodyctl")
            close()
            return false
        }
        takeInhibitor()
        // A PAM session's close locks only when logind knows no other session of the user.
        engine.followLoginSessions { [weak self] uid, excluding in
            self?.sessionIDs.withLock { $0.filter { $0.0 == uid && $0.1 != excluding }.count } ?? 0
        }
        running.store(true, ordering: .releasing)
        do throws(Errno) {
            thread = try DaemonThread.start("custody-logind") { [self] in serve() }
        } catch {
            running.store(false, ordering: .releasing)
            close()
            return false
        }
        log("following logind: identities lock with the screen, on suspend and at logout")
        return true
    }

    /// Stops the thread and closes the bus (the inhibitor, if held, is released).
    public func stop() {
        guard running.exchange(false, ordering: .acquiringAndReleasing), let thread else { return }
        engine.followLoginSessions(nil)
        pthread_join(thread, nil)
        self.thread = nil
        close()
    }

    /// Whether a sleep inhibitor is held now (for status and tests).
    public var holdsInhibitor: Bool { inhibitor >= 0 }

    // MARK: The bus thread

    private func serve() {
        while running.load(ordering: .acquiring), let bus {
            let processed = sd_bus_process(bus, nil)
            if processed < 0 {
                log("the system bus connection failed (\(Errno(-processed))); sessions no longer lock identities")
                return
            }
            if processed > 0 { continue }
            _ = sd_bus_wait(bus, 250_000)
        }
    }

    private func close() {
        for slot in slots { sd_bus_slot_unref(slot) }
        slots = []
        releaseInhibitor()
        if let bus { sd_bus_flush_close_unref(bus) }
        bus = nil
    }

    private func subscribe() -> Bool {
        guard let bus else { return false }
        let userdata = Unmanaged.passUnretained(self).toOpaque()
        let matches: [(String?, String?, String, String, sd_bus_message_handler_t)] = [
            (CUSTODY_LOGIN1, CUSTODY_LOGIN1_PATH, CUSTODY_LOGIN1_MANAGER, "PrepareForSleep", { message, data, _ in
                LoginMonitor.from(data).prepareForSleep(message)
            }),
            (CUSTODY_LOGIN1, CUSTODY_LOGIN1_PATH, CUSTODY_LOGIN1_MANAGER, "SessionNew", { _, data, _ in
                LoginMonitor.from(data).sessionsChanged()
            }),
            (CUSTODY_LOGIN1, CUSTODY_LOGIN1_PATH, CUSTODY_LOGIN1_MANAGER, "SessionRemoved", { _, data, _ in
                LoginMonitor.from(data).sessionsChanged()
            }),
            (CUSTODY_LOGIN1, nil, "org.freedesktop.login1.Session", "Lock", { message, data, _ in
                LoginMonitor.from(data).sessionLocked(message, true)
            }),
            (CUSTODY_LOGIN1, nil, "org.freedesktop.login1.Session", "Unlock", { message, data, _ in
                LoginMonitor.from(data).sessionLocked(message, false)
            }),
            (CUSTODY_LOGIN1, nil, "org.freedesktop.DBus.Properties", "PropertiesChanged", { message, data, _ in
                LoginMonitor.from(data).propertiesChanged(message)
            }),
        ]
        for (sender, path, interface, member, handler) in matches {
            var slot: OpaquePointer?
            let result = sd_bus_match_signal(bus, &slot, sender, path, interface, member, handler, userdata)
            guard result >= 0 else { return false }
            slots.append(slot)
        }
        return true
    }

    private static func from(_ data: UnsafeMutableRawPointer?) -> LoginMonitor {
        Unmanaged<LoginMonitor>.fromOpaque(data!).takeUnretainedValue()
    }

    /// Reads the sessions and their lock state again; false when logind does not answer.
    @discardableResult
    private func resynchronize() -> Bool {
        guard let bus else { return false }
        var listed = [custody_login1_session](repeating: custody_login1_session(), count: 256)
        let count = custody_login1_list_sessions(bus, &listed, Int32(listed.count))
        guard count >= 0 else { return false }
        var sessions: [(path: String, session: SessionTracker.Session)] = []
        for var entry in listed.prefix(Int(count)) {
            let id = withUnsafeBytes(of: &entry.id) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            let path = withUnsafeBytes(of: &entry.path) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            let locked = custody_login1_session_flag(bus, path, "LockedHint") == 1
            sessions.append((path, SessionTracker.Session(id: id, uid: entry.uid, locked: locked)))
        }
        apply(tracker.replace(with: sessions))
        return true
    }

    private func sessionsChanged() -> Int32 {
        resynchronize()
        return 0
    }

    private func sessionLocked(_ message: OpaquePointer?, _ locked: Bool) -> Int32 {
        guard let message, let raw = sd_bus_message_get_path(message) else { return 0 }
        let path = String(cString: raw)
        if tracker.sessions[path] == nil { resynchronize() }
        apply(tracker.setLocked(path, locked))
        return 0
    }

    /// A session's properties changed: `LockedHint` is read again (screen lockers set it).
    private func propertiesChanged(_ message: OpaquePointer?) -> Int32 {
        guard let message, let bus, let raw = sd_bus_message_get_path(message) else { return 0 }
        let path = String(cString: raw)
        guard path.hasPrefix("/org/freedesktop/login1/session/") else { return 0 }
        let locked = custody_login1_session_flag(bus, path, "LockedHint")
        if locked >= 0 {
            if tracker.sessions[path] == nil { resynchronize() }
            apply(tracker.setLocked(path, locked == 1))
        }
        return 0
    }

    private func prepareForSleep(_ message: OpaquePointer?) -> Int32 {
        guard let message else { return 0 }
        let sleeping = custody_message_read_bool(message)
        if sleeping == 1 {
            engine.prepareForSleep()
            log("suspending: identities locked and cached plaintext dropped; releasing the sleep inhibitor")
            releaseInhibitor()
        } else if sleeping == 0 {
            takeInhibitor()
            resynchronize()
        }
        return 0
    }

    private func apply(_ changes: [SessionTracker.Change]) {
        for change in changes {
            switch change {
            case .locked(let uid): engine.userLeft(uid, cause: .sessionLock)
            case .loggedOut(let uid): engine.userLeft(uid, cause: .logout)
            case .returned(let uid): engine.userReturned(uid)
            }
        }
    }

    // MARK: The sleep inhibitor

    private func takeInhibitor() {
        guard inhibitor < 0, let bus, engine.settings.lockOnSuspend || engine.accounts().contains(where: { $0.policy?.lockOnSuspend == true }) else { return }
        let fd = custody_login1_inhibit(bus, "sleep", "custodyd", "Lock protected identities before the machine sleeps", "delay")
        if fd >= 0 { inhibitor = fd } else { log("cannot take a sleep inhibitor (\(Errno(-fd))); a suspend may start before identities lock") }
    }

    private func releaseInhibitor() {
        if inhibitor >= 0 { Glibc.close(inhibitor) }
        inhibitor = -1
    }
}
