import CustodyAPI
import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import FoundationEssentials
import Glibc

/// The routes of the control API (docs/api.md). Admin operations need root or the admin group;
/// a user may lock, unlock and bind only accounts mapped to its uid.
struct ControlAPI: Sendable {
    let engine: Engine
    let adminGroup: gid_t?
    let jobs = JobRegistry()
    /// What the daemon adds to a support bundle (its configuration, scrubbed) and how it scrubs
    /// text; set by custodyd.
    let diagnostics = DiagnosticsHooks()
    /// What `GET /v1/metrics` answers; set by custodyd.
    let metrics = MetricsHooks()
    let streams = StreamCounter()
    static let version = CustodyVersion.string

    func caller(pid: Int32, uid: UInt32, gid: UInt32) -> Caller {
        var admin = uid == 0
        if !admin, let adminGroup {
            admin = gid == adminGroup || LinuxProcessTable().groups(of: pid).contains(adminGroup)
        }
        return Caller(pid: pid, uid: uid, gid: gid, isAdmin: admin)
    }

    // MARK: Requests and answers

    struct Failure: Error {
        var status: Int
        var code: Int
        var name: String
        var message: String
        var headers: [String: String] = [:]
    }

    static func failure(_ status: Int, _ code: Int, _ name: String, _ message: String) -> HTTPResponse {
        let body = (try? encoder().encode(ErrorAnswer(code: code, name: name, message: message))).map { Array($0) } ?? []
        return HTTPResponse(status: status, body: body)
    }

    static func failure(_ error: EngineError) -> Failure {
        let status: Int
        switch error {
        case .unknownAccount, .noSuchProcess, .pathNotFound: status = 404
        case .alreadyEnrolled, .notEnrolled, .singleManagedAccountMode, .passphraseRequired, .noLocalUser: status = 409
        case .accountNotAllowed, .wrongPassphrase, .sharingNotAllowed, .transferNotAllowed, .invalidRecoveryKey: status = 403
        case .invalidIdentity, .invalidPolicy: status = 400
        case .noRecoveryKey, .machineKeyUnavailable, .machineKeyInUse, .keysUnavailable, .keysKeptHere: status = 409
        case .identityExportInvalid: status = 422
        case .rateLimited: status = 429
        case .locked: status = 423
        case .io(_, let errno): status = Self.status(for: errno)
        case .corruptState, .crypto, .format: status = 500
        case .identityNotManaged: status = 400
        case .invalidPath: status = 409
        case .fileNotEncrypted, .fileAlreadyEncrypted, .fileBusy: status = 409
        case .failedToEncryptFile, .failedToDecryptFile, .failedToProtectData, .failedToUnprotectData: status = 422
        }
        return Failure(status: status, code: error.code, name: error.name, message: error.description)
    }

    /// The answer for a file system error met on a caller's behalf: what the caller asked for
    /// (a path that is not there, not theirs, busy) is a 4xx; only the daemon's own trouble is 5xx.
    static func status(for errno: Errno) -> Int {
        switch errno.rawValue {
        case EACCES, EPERM, EROFS: return 403
        case ENOENT: return 404
        case ENAMETOOLONG, EINVAL, ENXIO, ENODEV, EFBIG, EOPNOTSUPP: return 400
        case EEXIST, EBUSY, ETXTBSY, EMLINK, ENOTDIR, ELOOP, EISDIR, EXDEV, ENOTEMPTY: return 409
        case ENOSPC, EDQUOT: return 507
        default: return 500
        }
    }

    /// A local user name that names no user: not found, as an unknown account is.
    static func unknownUser(_ name: String) -> Failure {
        Failure(status: 404, code: 319, name: "UnknownUser", message: "no local user named \(name)")
    }

    static func notAuthorized(_ what: String) -> Failure {
        Failure(status: 403, code: 401, name: "NotAuthorized", message: "not allowed to \(what)")
    }

    func decode<T: Decodable>(_ type: T.Type, _ request: HTTPRequest) throws(Failure) -> T {
        try Self.decode(type, request)
    }

    /// A request's body as `T`: strictly (`StrictJSON`), so that a field the route does not know
    /// is refused by name rather than read as absent.
    static func decode<T: Decodable>(_ type: T.Type, _ request: HTTPRequest) throws(Failure) -> T {
        do {
            return try StrictJSON.decode(T.self, from: request.body.isEmpty ? Array("{}".utf8) : request.body)
        } catch let unknown as StrictJSON.UnknownKey {
            throw badRequest("\(unknown)")
        } catch {
            throw badRequest("invalid JSON body: \(Self.describe(error))")
        }
    }

    static func describe(_ error: Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, _): return "missing field \(key.stringValue)"
        case DecodingError.typeMismatch(let type, let context): return "\(context.codingPath.map(\.stringValue).joined(separator: ".")) must be \(type)"
        case DecodingError.dataCorrupted(let context): return context.debugDescription
        case DecodingError.valueNotFound(_, let context): return "\(context.codingPath.map(\.stringValue).joined(separator: ".")) is missing"
        default: return "\(error)"
        }
    }

    static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    func json<T: Encodable>(_ value: T, status: Int = 200) -> HTTPResponse {
        let body = (try? Self.encoder().encode(value)).map { Array($0) } ?? []
        return HTTPResponse(status: status, body: body)
    }

    static func badRequest(_ message: String) -> Failure {
        Failure(status: 400, code: 400, name: "BadRequest", message: message)
    }

    func handle(_ request: HTTPRequest, from caller: Caller) -> HTTPResponse {
        do throws(Failure) {
            return try route(request, caller)
        } catch {
            return Self.answer(error)
        }
    }

    static func answer(_ error: Failure) -> HTTPResponse {
        var response = failure(error.status, error.code, error.name, error.message)
        response.headers = error.headers
        return response
    }

    // MARK: Routes

    /// Every route served, as method and path (from `table`, in `RouteTable.swift`).
    public static var routes: [Endpoint] { table.map(\.endpoint) }

    func route(_ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        // The front has checked it; the daemon checks again rather than trust another process.
        let (route, parameters) = try Self.checkedRoute(request)
        let call = RouteRequest(http: request, parameters: parameters, caller: caller)
        try route.authorize(call, self)
        return try route.serve(self, call)
    }

    /// The route a request asks for and its path parameters; 404 for an unknown path, 405 (with
    /// `Allow`, RFC 9110 15.5.6) for a known path and a method it does not serve.
    static func match(_ request: HTTPRequest) throws(Failure) -> (Route, [String: String]) {
        var allowed: [String] = []
        for route in table {
            guard let parameters = route.endpoint.match(request.path) else { continue }
            if route.method == request.method { return (route, parameters) }
            allowed.append(route.method)
        }
        guard allowed.isEmpty else {
            throw Failure(status: 405, code: 405, name: "MethodNotAllowed", message: "\(request.method) is not served on \(request.path)",
                          headers: ["Allow": allowed.joined(separator: ", ")])
        }
        throw Failure(status: 404, code: 404, name: "UnknownRoute", message: "no route \(request.method) \(request.path)")
    }

    /// Query parameters the routes read, checked for shape (unknown ones are ignored).
    static func checkQuery(_ request: HTTPRequest) throws(Failure) {
        for name in ["wait", "wipe", "follow", "thread", "check"] {
            if let value = request.query[name], value != "true", value != "false" {
                throw badRequest("query parameter \(name) must be true or false, not \(value)")
            }
        }
        if let after = request.query["after"], !after.isEmpty, after != "latest", after.count > 19 || UInt64(after) == nil {
            throw badRequest("query parameter after must be a sequence number or latest, not \(after)")
        }
    }

    /// Everything about a request that can be checked without the engine: the route, its path
    /// and query parameters, and its body's shape. The control front runs this before it forwards
    /// anything, so malformed requests are answered without reaching the daemon. The route and
    /// its parameters.
    @discardableResult
    static func check(_ request: HTTPRequest) throws(Failure) -> (Endpoint, [String: String]) {
        let (route, parameters) = try checkedRoute(request)
        return (route.endpoint, parameters)
    }

    /// `check`, answering the route itself.
    static func checkedRoute(_ request: HTTPRequest) throws(Failure) -> (Route, [String: String]) {
        let (route, parameters) = try match(request)
        try checkQuery(request)
        if let pid = parameters["pid"] { _ = try processID(pid) }
        try route.check(request, parameters)
        return (route, parameters)
    }

    /// A passphrase is at least one byte (an account without one is enrolled by leaving it out).
    static func checkPassphrase(_ text: String) throws(Failure) {
        guard !text.isEmpty else { throw badRequest("passphrase must not be empty; leave it out for an account without one") }
    }

    static func processID(_ text: String) throws(Failure) -> Int32 {
        guard let pid = Int32(text), pid > 0 else { throw Failure(status: 400, code: 400, name: "BadRequest", message: "not a process ID: \(text)") }
        return pid
    }

    func run(_ body: () throws(EngineError) -> HTTPResponse) throws(Failure) -> HTTPResponse {
        do { return try body() } catch { throw Self.failure(error) }
    }

    static func secret(_ text: String) throws(EngineError) -> SecretBytes {
        do { return try Array(text.utf8).withBytes { (bytes) throws(CryptoError) in try SecretBytes(copying: bytes) } } catch { throw .crypto(error) }
    }

    /// Admins may act on any account; a user only on accounts mapped to its uid.
    func authorize(_ caller: Caller, forAccount identity: String, _ what: String) throws(Failure) {
        if caller.isAdmin { return }
        guard let account = try? engine.account(identity), account.uid == caller.uid else { throw Self.notAuthorized(what) }
    }

    /// Admins may bind any process; a user only its own processes.
    func authorizeProcess(_ caller: Caller, _ pid: Int32, _ what: String) throws(Failure) {
        if caller.isAdmin { return }
        guard LinuxProcessTable().uid(of: pid) == caller.uid else { throw Self.notAuthorized(what) }
    }

    /// An account the caller may see: any for administrators, its own for a user. Another
    /// user's account answers as an unknown one, so its existence does not show.
    func visibleAccount(_ identity: String, _ caller: Caller) throws(EngineError) -> Account {
        let account = try engine.account(identity)
        guard caller.isAdmin || account.uid == caller.uid else { throw .unknownAccount(identity) }
        return account
    }

    /// The status; a user sees only its own accounts.
    func status(for caller: Caller? = nil) -> CustodyStatus {
        let accounts = engine.accounts().filter { caller.map { $0.isAdmin } ?? true || $0.uid == caller?.uid }
        var machineKey = engine.machineKeyStatus(counter: false)
        machineKey.stranded = machineKey.stranded.filter { upn in accounts.contains { $0.upn == upn } }
        return CustodyStatus(version: Self.version,
                   mounts: engine.volumes.map { CustodyMount(mountPoint: $0.mountPoint, backing: $0.backingDirectory) },
                   accounts: accounts.map { account in
                       var view = CustodyAccount(account)
                       if account.isEnrolled {
                           view.unavailable = engine.unavailability(of: account)
                           view.lock = (try? engine.lockStatus(account.id))?.name ?? (view.unavailable != nil ? "unavailable" : nil)
                           let attempts = engine.unlockAttempts(account.id)
                           view.failedUnlockAttempts = attempts.failures
                           view.retryAfterSeconds = attempts.retryAfter
                           if !engine.isAllowed(account) { view.allowed = false }
                       }
                       return view
                   },
                   machineKey: CustodyMachineKey(machineKey),
                   stateProblems: engine.stateProblems.filter { problem in
                       caller.map { $0.isAdmin } ?? true || accounts.contains { account in problem.identity.map(account.matches) ?? false }
                   }.map { CustodyStateProblem($0) },
                   guard: engine.dataHolders.map { CustodyGuardStatus($0.status) })
    }

    /// The store and PCRs a migration asks for.
    static func migration(_ body: MigrateRequest) throws(Failure) -> (MachineKeyStore, [Int]?) {
        guard let store = MachineKeyStore(rawValue: body.to) else { throw badRequest("to must be tpm2 or file, not \(body.to)") }
        if let pcrs = body.pcrs, !pcrs.isEmpty {
            guard store == .tpm2 else { throw badRequest("pcrs apply to tpm2 only") }
            for pcr in pcrs where !(0...23).contains(pcr) { throw badRequest("PCR \(pcr) does not exist (0 to 23)") }
        }
        return (store, body.pcrs)
    }

    /// The local user a body names, by `uid` or by name (`user`); both must agree.
    static func localUser(uid: UInt32?, user: String?) throws(Failure) -> UInt32? {
        guard let user else { return uid }
        guard let entry = getpwnam(user) else { throw unknownUser(user) }
        if let uid, uid != entry.pointee.pw_uid { throw badRequest("user \(user) is uid \(entry.pointee.pw_uid), not \(uid)") }
        return entry.pointee.pw_uid
    }

    func enroll(_ body: EnrollRequest) throws(Failure) -> HTTPResponse {
        let uid = try Self.localUser(uid: body.uid, user: body.user)
        // No policy: the one it had when deregistered with its keys kept, else the default.
        let policy = try body.policy.map { (document) throws(Failure) in try Self.policy(document) }
        return try run { () throws(EngineError) in
            let account: Account
            if body.enroll ?? true {
                let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                account = try engine.enroll(id: body.id, upn: body.upn, policy: policy, passphrase: passphrase, uid: uid)
            } else {
                account = try engine.register(id: body.id, upn: body.upn, uid: uid)
            }
            return json(CustodyAccount(account), status: 201)
        }
    }

    /// Wipes an identity as a job: keys destroyed first, then its files deleted in every mount,
    /// then it is deregistered. Waits for the result unless `wait` is false (then 202 and the job).
    func wipe(_ identity: String, wait: Bool, by caller: Caller) throws(Failure) -> HTTPResponse {
        let account = try engineCall { () throws(EngineError) in try self.engine.account(identity) }
        let engine = self.engine
        let job = jobs.start(kind: "wipe", target: account.upn, startedBy: caller.uid) { (job) throws(Failure) -> JSONValue in
            var last = WipeProgress(keysDestroyedSeconds: 0)
            do throws(EngineError) {
                try engine.deregister(account.upn, wipe: true) { progress in
                    last = progress
                    job.update(["scanned": UInt64(progress.files.scanned), "deleted": UInt64(progress.files.deleted),
                                "bytesFreed": progress.files.bytesFreed,
                                "keysDestroyedMicroseconds": UInt64(max(0, progress.keysDestroyedSeconds) * 1e6)])
                }
            } catch {
                throw Self.failure(error)
            }
            return JSONValue.of(WipeResult(identity: account.upn, code: 104, result: "UnenrollmentSuccess",
                                         keysDestroyedSeconds: last.keysDestroyedSeconds, scanned: last.files.scanned,
                                         deleted: last.files.deleted, bytesFreed: last.files.bytesFreed))
        }
        return respond(to: job, wait: wait)
    }

    /// The job's result when waiting (or its error), else 202 with the job as it stands.
    func respond(to job: Job, wait: Bool) -> HTTPResponse {
        guard wait else { return json(job.snapshot, status: 202) }
        job.wait()
        if let failure = job.failure { return Self.failure(failure.status, failure.code, failure.name, failure.message) }
        return json(job.snapshot.result ?? .null)
    }

    func bind(_ body: BindRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        guard (body.pid == nil) != (body.tid == nil) else {
            throw Failure(status: 400, code: 400, name: "BadRequest", message: "give exactly one of pid and tid")
        }
        let task = body.pid ?? body.tid ?? 0
        try authorizeProcess(caller, task, "bind process \(task)")
        if !caller.isAdmin, let account = try? engine.account(body.identity), account.uid != caller.uid {
            throw Self.notAuthorized("bind to \(body.identity)")
        }
        return try run { () throws(EngineError) in
            if let pid = body.pid { try engine.bindProcess(pid, to: body.identity) } else { try engine.bindThread(task, to: body.identity) }
            let resolved = engine.resolve(thread: task, uid: caller.uid)
            return json(ProcessIdentity(pid: task, identity: resolved.identity, source: resolved.source.description), status: 201)
        }
    }
}

// MARK: Bodies











