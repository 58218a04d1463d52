import CustodyAPI
import CLinux
import CustodyCore
import CustodyFormat
import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

// The file and data routes: the SDK's FileProtectionManager and DataProtectionManager calls.
//
// A path in a mount is served from its backing file, and owner changes go through the mount (the
// `ProtectedVolume`), so the mount's inodes and caches stay right. A path outside every mount is
// an export: the engine works on it directly. Callers other than root act with their own file
// system credentials (the thread's fsuid, fsgid and groups), so the daemon never reads or writes
// a file for them that they could not themselves.


/// A path from a request, made absolute and normalized, and where it lives.
struct LocatedPath {
    /// Normalized (directories resolved; the last name is not followed).
    var path: String
    var volume: VolumePath?
    /// The backing file for a mount path; the path itself otherwise.
    var stored: String { volume?.backingPath ?? path }
}

extension ControlAPI {
    func locate(_ raw: String, _ caller: Caller) throws(Failure) -> LocatedPath {
        // What the schema states of a path (absolute, no NUL) is 400; a path that is well formed
        // but not usable is 409, one that does not exist 404 (both InvalidPath, 101).
        guard raw.isAbsolutePath else { throw Self.malformedPath(raw, "give an absolute path") }
        guard !raw.utf8.contains(0) else { throw Self.malformedPath(raw, "contains a NUL byte") }
        var (directory, name) = Syscall.split(raw)
        if name.isEmpty || name == "." || name == ".." { (directory, name) = (raw, "") }
        let resolved = try asCaller(caller) { () throws(Failure) -> String in
            guard let resolved = resolvedPath(directory) else {
                let error = Errno.current
                throw Self.failure(error == .noSuchFile ? .pathNotFound(raw, reason: "its directory does not exist") : .io(file: raw, error))
            }
            return resolved
        }
        let path = name.isEmpty ? resolved : (resolved == "/" ? "/" + name : resolved + "/" + name)
        for volume in engine.volumes {
            let backing = volume.backingDirectory
            if path.isPath(inside: backing) {
                throw Self.failure(.invalidPath(path, reason: "inside the backing store of \(volume.mountPoint); use the path in the mount"))
            }
        }
        let volume = engine.volume(containing: path)
        if let volume, !caller.isAdmin, !volume.volume.allowsOtherUsers, caller.uid != geteuid() {
            throw Self.notAuthorized("use \(volume.volume.mountPoint) (it is mounted for its owner only)")
        }
        return LocatedPath(path: path, volume: volume)
    }

    static func malformedPath(_ raw: String, _ reason: String) -> Failure {
        var failure = failure(.invalidPath(raw, reason: reason))
        failure.status = 400
        return failure
    }

    /// Runs `body` with the caller's file system credentials on this thread (root runs as itself).
    func asCaller<T>(_ caller: Caller, _ body: () throws(Failure) -> T) throws(Failure) -> T {
        guard caller.uid != 0 else { return try body() }
        let saved = Self.threadGroups()
        let groups = LinuxProcessTable().groups(of: caller.pid)
        _ = groups.withUnsafeBufferPointer { clinux_thread_setgroups($0.count, $0.baseAddress) }
        _ = clinux_setfsgid(caller.gid)
        _ = clinux_setfsuid(caller.uid)
        defer {
            _ = clinux_setfsuid(0)
            _ = clinux_setfsgid(0)
            _ = saved.withUnsafeBufferPointer { clinux_thread_setgroups($0.count, $0.baseAddress) }
        }
        return try body()
    }

    static func threadGroups() -> [gid_t] {
        let count = getgroups(0, nil)
        guard count > 0 else { return [] }
        var groups = [gid_t](repeating: 0, count: Int(count))
        let got = getgroups(count, &groups)
        return got > 0 ? Array(groups[0..<Int(got)]) : []
    }

    /// Whether the caller may `access` (R_OK, W_OK) the path, judged with its own credentials.
    func checkAccess(_ path: String, _ mode: Int32, _ caller: Caller, _ what: String) throws(Failure) {
        guard !caller.isAdmin else { return }
        let allowed = try asCaller(caller) { () throws(Failure) -> Bool in faccessat(AT_FDCWD, path, mode, AT_EACCESS) == 0 }
        guard allowed else { throw Self.notAuthorized("\(what) \(path)") }
    }

    /// Runs an engine call; its error answers with the paths the caller used: a file in a mount
    /// is stored in the backing directory, which the engine's messages would name.
    func engineCall<T>(naming paths: [LocatedPath] = [], _ body: () throws(EngineError) -> T) throws(Failure) -> T {
        do { return try body() } catch {
            var failure = Self.failure(error)
            for located in paths { if let volume = located.volume?.volume { failure.message = Self.inMount(failure.message, volume) } }
            throw failure
        }
    }

    /// `text` with the backing directory of `volume` named as its mount point.
    static func inMount(_ text: String, _ volume: ProtectedVolume) -> String {
        let backing = volume.backingDirectory, mount = volume.mountPoint
        return text.replacingAll(of: backing + "/", with: mount + "/").replacingAll(of: backing, with: mount)
    }

    func info(of located: LocatedPath, _ caller: Caller) throws(Failure) -> CustodyCore.FileProtectionInfo {
        try asCaller(caller) { () throws(Failure) in
            try engineCall(naming: [located]) { () throws(EngineError) in
                try engine.protectionInfo(ofStoredPath: located.stored, shownAs: located.path, mountPoint: located.volume?.volume.mountPoint)
            }
        }
    }

    /// The info of a path the caller can read.
    func readableInfo(_ body: PathRequest, _ caller: Caller) throws(Failure) -> CustodyCore.FileProtectionInfo {
        let located = try locate(body.path, caller)
        try checkAccess(located.path, R_OK, caller, "read")
        return try info(of: located, caller)
    }

    /// An owner as `caller` may see it: an account of another local user is not named to anyone
    /// but administrators (the account routes answer 404 for it, and the answers about files and
    /// data must not tell more); identities that are no account, and the caller's own accounts,
    /// are shown.
    func visibleOwner(_ owner: String?, to caller: Caller) -> String? {
        guard let owner, !caller.isAdmin, let account = try? engine.account(owner), account.uid != caller.uid else { return owner }
        return nil
    }

    /// `text` without the names of `owner` when `caller` may not see them (`visibleOwner`).
    func hidingOwner(_ owner: String?, in text: String, from caller: Caller) -> String {
        guard let owner, visibleOwner(owner, to: caller) == nil, let account = try? engine.account(owner) else { return text }
        return [account.upn, account.id, owner].reduce(text) { $0.replacingAll(of: $1, with: "its owner") }
    }

    /// Non-admins act only for accounts mapped to their uid; other identity strings (unmanaged)
    /// are free.
    func authorizeIdentity(_ caller: Caller, _ identity: String, _ what: String) throws(Failure) {
        guard !caller.isAdmin, let account = try? engine.account(identity) else { return }
        guard account.uid == caller.uid else { throw Self.notAuthorized("\(what) for \(account.upn)") }
    }

    // MARK: protect

    func protect(_ body: ProtectRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        // A malformed identity is the request's fault (400), before anything is looked up.
        if let identity = body.identity {
            do throws(EngineError) { _ = try Account.checkedName(identity) } catch { throw Self.failure(error) }
        }
        let located = try locate(body.path, caller)
        guard let volumePath = located.volume else {
            throw Self.failure(.invalidPath(located.path, reason: "not in a mount: owners live in mounts (use encrypt-file for a file elsewhere)"))
        }
        try checkAccess(located.path, W_OK, caller, "change the owner of")
        if let identity = body.identity { try authorizeIdentity(caller, identity, "protect files") }
        let current = try info(of: located, caller)
        if let owner = current.owner { try authorizeIdentity(caller, owner, "change files") }
        let engine = self.engine
        let job = jobs.start(kind: "protect", target: located.path, startedBy: caller.uid) { (job) throws(Failure) -> JSONValue in
            do throws(EngineError) {
                try volumePath.volume.changeOwner(volumePath.relativePath, to: body.identity) { done in job.update(["done": UInt64(done)]) }
                return JSONValue.of(CustodyAPI.FileProtectionInfo(try engine.protectionInfo(ofStoredPath: volumePath.backingPath, shownAs: located.path,
                                                                                 mountPoint: volumePath.volume.mountPoint)))
            } catch {
                throw Self.failure(error)
            }
        }
        return respond(to: job, wait: body.wait ?? true)
    }

    // MARK: encrypt and decrypt

    func encryptFile(_ body: PathIdentityRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        try authorizeIdentity(caller, body.identity, "encrypt files")
        let located = try locate(body.path, caller)
        try checkAccess(located.path, R_OK | W_OK, caller, "encrypt")
        let account = try engineCall { () throws(EngineError) in try engine.account(body.identity) }
        guard let policy = account.policy else { throw Self.failure(.identityNotManaged(account.upn)) }
        let current = try info(of: located, caller)
        guard current.kind == "file" else { throw Self.failure(.invalidPath(located.path, reason: "not a regular file")) }
        guard !current.encrypted else { throw Self.failure(.fileAlreadyEncrypted(located.path)) }
        if let volumePath = located.volume {
            // In a mount a file is stored as its owner's policy says: encrypting is protecting
            // it for the account, which must be one whose files the mount encrypts.
            guard policy.fileEncryptionRequired else {
                throw Self.failure(.failedToEncryptFile(located.path, reason: "\(account.upn)'s policy does not encrypt files in mounts"))
            }
            if let owner = current.owner { try authorizeIdentity(caller, owner, "change files") }
            try engineCall(naming: [located]) { () throws(EngineError) in try volumePath.volume.changeOwner(volumePath.relativePath, to: account.upn) { _ in } }
        } else {
            try asCaller(caller) { () throws(Failure) in
                try engineCall { () throws(EngineError) in try engine.encryptFile(storedPath: located.path, for: account.upn) }
            }
        }
        return json(CustodyAPI.FileProtectionInfo(try info(of: located, caller)))
    }

    func decryptFile(_ body: DecryptRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let located = try locate(body.path, caller)
        try checkAccess(located.path, body.copyPath == nil ? R_OK | W_OK : R_OK, caller, "decrypt")
        let current = try info(of: located, caller)
        guard current.kind == "file" else { throw Self.failure(.invalidPath(located.path, reason: "not a regular file")) }
        guard current.encrypted else { throw Self.failure(.fileNotEncrypted(located.path)) }
        if let owner = current.owner { try authorizeIdentity(caller, owner, "decrypt files") }
        guard let copyPath = body.copyPath else {
            if let volumePath = located.volume {
                // In a mount, decrypting in place is removing the owner (the file becomes plain).
                try engineCall(naming: [located]) { () throws(EngineError) in try volumePath.volume.changeOwner(volumePath.relativePath, to: nil) { _ in } }
            } else {
                try asCaller(caller) { () throws(Failure) in
                    try engineCall { () throws(EngineError) in try engine.decryptFile(storedPath: located.path) }
                }
            }
            return json(CustodyAPI.FileProtectionInfo(try info(of: located, caller)))
        }
        let copy = try locate(copyPath, caller)
        guard copy.path != located.path else { throw Self.failure(.invalidPath(copy.path, reason: "the copy path is the file itself")) }
        if located.volume != nil {
            // Writes still in the kernel's cache reach the daemon before the copy is taken.
            let fd = open(located.path, O_RDONLY | O_CLOEXEC)
            if fd >= 0 { _ = fsync(fd); close(fd) }
        }
        try asCaller(caller) { () throws(Failure) in
            try engineCall(naming: [located, copy]) { () throws(EngineError) in try engine.decryptFile(storedPath: located.stored, toCopyPath: copy.volume?.mountPath ?? copy.path) }
        }
        return json(CustodyAPI.FileProtectionInfo(try info(of: copy, caller)))
    }

    /// Cuts an encrypted file back to its last authentic block (administrators).
    func repairFile(_ body: PathRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let located = try locate(body.path, caller)
        let outcome = try engineCall(naming: [located]) { () throws(EngineError) -> RepairOutcome in
            if let volumePath = located.volume { return try volumePath.volume.repair(volumePath.relativePath) }
            return try engine.repairFile(storedPath: located.path)
        }
        return json(RepairResult(path: located.path, repaired: outcome.repaired, sizeBefore: outcome.sizeBefore, sizeAfter: outcome.sizeAfter,
                               firstDamagedBlock: outcome.firstDamagedBlock))
    }

    func canReceive(_ body: PathIdentityRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let located = try locate(body.path, caller)
        try checkAccess(located.path, R_OK, caller, "read")
        var decision = try asCaller(caller) { () throws(Failure) in
            try engineCall(naming: [located]) { () throws(EngineError) in try engine.canReceiveSharedFile(storedPath: located.stored, identity: body.identity) }
        }
        // The owner's account is not named to other users.
        let owner = try asCaller(caller) { () throws(Failure) in try info(of: located, caller) }.owner
        decision.reason = hidingOwner(owner, in: decision.reason, from: caller)
        return json(CustodyAPI.SharingDecision(decision))
    }

    // MARK: data

    static func decodeData(_ body: DataRequest) throws(Failure) -> [UInt8] {
        switch (body.data, body.string) {
        case (let data?, nil):
            guard let bytes = Data(base64Encoded: data) else {
                throw Failure(status: 400, code: 400, name: "BadRequest", message: "data must be base64")
            }
            return Array(bytes)
        case (nil, let string?):
            return Array(string.utf8)
        default:
            throw Failure(status: 400, code: 400, name: "BadRequest", message: "give exactly one of data (base64) and string")
        }
    }

    func protectData(_ body: DataRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        guard let identity = body.identity else { throw Failure(status: 400, code: 400, name: "BadRequest", message: "missing field identity") }
        try authorizeIdentity(caller, identity, "protect data")
        let bytes = try Self.decodeData(body)
        let protected = try engineCall { () throws(EngineError) in try engine.protectData(bytes, for: identity) }
        return json(DataResult(data: Data(protected).base64EncodedString(), string: nil, size: protected.count))
    }

    func unprotectData(_ body: DataRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let bytes = try Self.decodeData(body)
        let info = try engineCall { () throws(EngineError) in try engine.dataProtectionInfo(bytes) }
        if let owner = info.owner { try authorizeIdentity(caller, owner, "unprotect data") }
        let plain = try engineCall { () throws(EngineError) in try engine.unprotectData(bytes) }
        return json(DataResult(data: Data(plain).base64EncodedString(), string: String(validating: plain, as: UTF8.self), size: plain.count))
    }

    // MARK: events

    /// Newline-delimited JSON: the kept events after `after` (a sequence number, or `latest`), then (unless `follow=false`) every
    /// new one until the client disconnects. Non-admins see events of their own accounts and
    /// events naming no identity.
    func events(_ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        // A user may hold a few streams; the connections are shared by everyone.
        let follow = request.query["follow"] != "false"
        if follow, !caller.isAdmin, !streams.open(for: caller.uid) {
            throw Failure(status: 503, code: 503, name: "ServiceBusy", message: "at most \(StreamCounter.perUser) event streams per user")
        }
        let releaseStream: @Sendable () -> Void = { [streams] in if follow, !caller.isAdmin { streams.close(for: caller.uid) } }
        let engine = self.engine
        // "latest": only what happens from now on.
        let after = request.query["after"] == "latest" ? (engine.events.events().last?.sequence ?? 0) : UInt64(request.query["after"] ?? "0") ?? 0
        let visible: @Sendable (EngineEvent) -> Bool = { event in
            guard !caller.isAdmin, let identity = event.identity else { return true }
            return (try? engine.account(identity))?.uid == caller.uid
        }
        var response = HTTPResponse(status: 200, body: [], contentType: "application/x-ndjson")
        response.stream = { writer in
            defer { releaseStream() }
            let queue = EventQueue()
            let token = follow ? engine.events.subscribe { event in queue.push(event) } : nil
            defer { if let token { engine.events.unsubscribe(token) } }
            var last = after
            let encoder = ControlAPI.encoder()
            func send(_ events: [EngineEvent]) -> Bool {
                var bytes: [UInt8] = []
                for event in events where event.sequence > last {
                    last = event.sequence
                    guard visible(event), let line = try? encoder.encode(CustodyEvent(event)) else { continue }
                    bytes += Array(line) + [10]
                }
                return bytes.isEmpty || writer.send(bytes)
            }
            guard send(engine.events.events(after: after)), follow else { return }
            while !writer.clientClosed {
                let events = queue.take(waitingSeconds: 1)
                if !send(events) { return }
            }
        }
        return response
    }
}


/// Open event streams per user.
final class StreamCounter: Sendable {
    static let perUser = 8
    private let counts = Mutex<[UInt32: Int]>([:])

    func open(for uid: UInt32) -> Bool {
        counts.withLock { counts in
            guard counts[uid, default: 0] < Self.perUser else { return false }
            counts[uid, default: 0] += 1
            return true
        }
    }

    func close(for uid: UInt32) {
        counts.withLock { $0[uid, default: 1] -= 1 }
    }
}

/// Events waiting to be streamed to one client.
final class EventQueue: @unchecked Sendable {
    private var events: [EngineEvent] = []
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()

    init() {
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    deinit {
        pthread_cond_destroy(&condition)
        pthread_mutex_destroy(&mutex)
    }

    func push(_ event: EngineEvent) {
        pthread_mutex_lock(&mutex)
        events.append(event)
        if events.count > 10_000 { events.removeFirst(events.count - 10_000) }
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
    }

    /// The queued events, waiting up to `seconds` for one.
    func take(waitingSeconds seconds: Int) -> [EngineEvent] {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        if events.isEmpty {
            var deadline = timespec()
            clock_gettime(CLOCK_REALTIME, &deadline)
            deadline.tv_sec += seconds
            _ = pthread_cond_timedwait(&condition, &mutex, &deadline)
        }
        let taken = events
        events.removeAll()
        return taken
    }
}
