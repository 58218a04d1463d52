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
    static let version = "0.3.0"

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

    struct ErrorBody: Encodable { var code: Int; var name: String; var message: String }

    static func failure(_ status: Int, _ code: Int, _ name: String, _ message: String) -> HTTPResponse {
        let body = (try? encoder().encode(ErrorBody(code: code, name: name, message: message))).map { Array($0) } ?? []
        return HTTPResponse(status: status, body: body)
    }

    static func failure(_ error: EngineError) -> Failure {
        let status: Int
        switch error {
        case .unknownAccount, .noSuchProcess, .pathNotFound: status = 404
        case .alreadyEnrolled, .notEnrolled, .singleManagedAccountMode, .passphraseRequired, .noLocalUser: status = 409
        case .accountNotAllowed, .wrongPassphrase, .sharingNotAllowed, .transferNotAllowed, .invalidRecoveryKey: status = 403
        case .invalidIdentity, .invalidPolicy: status = 400
        case .noRecoveryKey, .machineKeyUnavailable, .machineKeyInUse, .keysUnavailable: status = 409
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

    static func decode<T: Decodable>(_ type: T.Type, _ request: HTTPRequest) throws(Failure) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(request.body.isEmpty ? Array("{}".utf8) : request.body))
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

    /// Every route served: the dispatch below and the OpenAPI test both read this table.
    public static let routes: [RouteSpec] = [
        RouteSpec("GET", "/v1/status"),
        RouteSpec("GET", "/v1/accounts"),
        RouteSpec("POST", "/v1/accounts"),
        RouteSpec("GET", "/v1/accounts/{identity}"),
        RouteSpec("DELETE", "/v1/accounts/{identity}"),
        RouteSpec("GET", "/v1/accounts/{identity}/policy"),
        RouteSpec("PUT", "/v1/accounts/{identity}/policy"),
        RouteSpec("POST", "/v1/accounts/{identity}/lock"),
        RouteSpec("POST", "/v1/accounts/{identity}/unlock"),
        RouteSpec("POST", "/v1/accounts/{identity}/passphrase"),
        RouteSpec("POST", "/v1/accounts/{identity}/login-protector"),
        RouteSpec("DELETE", "/v1/accounts/{identity}/login-protector"),
        RouteSpec("POST", "/v1/accounts/{identity}/recovery-key"),
        RouteSpec("DELETE", "/v1/accounts/{identity}/recovery-key"),
        RouteSpec("POST", "/v1/accounts/{identity}/recover"),
        RouteSpec("POST", "/v1/login/unlock"),
        RouteSpec("POST", "/v1/login/password"),
        RouteSpec("POST", "/v1/login/lock"),
        RouteSpec("POST", "/v1/login/open"),
        RouteSpec("POST", "/v1/accounts/{identity}/wipe"),
        RouteSpec("GET", "/v1/machine-key"),
        RouteSpec("POST", "/v1/machine-key/migrate"),
        RouteSpec("POST", "/v1/machine-key/reset"),
        RouteSpec("POST", "/v1/lock"),
        RouteSpec("POST", "/v1/unlock"),
        RouteSpec("POST", "/v1/bindings"),
        RouteSpec("DELETE", "/v1/bindings/{pid}"),
        RouteSpec("GET", "/v1/processes/{pid}/identity"),
        RouteSpec("POST", "/v1/files/info"),
        RouteSpec("POST", "/v1/files/is-encrypted"),
        RouteSpec("POST", "/v1/files/protect"),
        RouteSpec("POST", "/v1/files/encrypt"),
        RouteSpec("POST", "/v1/files/decrypt"),
        RouteSpec("POST", "/v1/files/can-receive"),
        RouteSpec("POST", "/v1/files/repair"),
        RouteSpec("GET", "/v1/locations"),
        RouteSpec("POST", "/v1/locations/classify"),
        RouteSpec("POST", "/v1/locations/save-to-allowed"),
        RouteSpec("POST", "/v1/locations/open-from-allowed"),
        RouteSpec("POST", "/v1/data/protect"),
        RouteSpec("POST", "/v1/data/unprotect"),
        RouteSpec("POST", "/v1/data/info"),
        RouteSpec("GET", "/v1/jobs"),
        RouteSpec("GET", "/v1/jobs/{id}"),
        RouteSpec("GET", "/v1/events"),
        RouteSpec("GET", "/v1/diagnostics"),
        RouteSpec("GET", "/v1/metrics"),
    ]

    func route(_ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        // The front has checked it; the daemon checks again rather than trust another process.
        let (spec, parameters) = try Self.check(request)
        return try dispatch(spec, parameters, request, caller)
    }

    /// The route a request asks for and its path parameters; 404 for an unknown path, 405 (with
    /// `Allow`, RFC 9110 15.5.6) for a known path and a method it does not serve.
    static func match(_ request: HTTPRequest) throws(Failure) -> (RouteSpec, [String: String]) {
        var allowed: [String] = []
        for spec in routes {
            guard let parameters = spec.match(request.path) else { continue }
            if spec.method == request.method { return (spec, parameters) }
            allowed.append(spec.method)
        }
        guard allowed.isEmpty else {
            throw Failure(status: 405, code: 405, name: "MethodNotAllowed", message: "\(request.method) is not served on \(request.path)",
                          headers: ["Allow": allowed.joined(separator: ", ")])
        }
        throw Failure(status: 404, code: 404, name: "UnknownRoute", message: "no route \(request.method) \(request.path)")
    }

    /// Query parameters the routes read, checked for shape (unknown ones are ignored).
    static func checkQuery(_ request: HTTPRequest) throws(Failure) {
        for name in ["wait", "wipe", "follow"] {
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
    static func check(_ request: HTTPRequest) throws(Failure) -> (RouteSpec, [String: String]) {
        let (spec, parameters) = try match(request)
        try checkQuery(request)
        if let pid = parameters["pid"] { _ = try processID(pid) }
        switch (spec.method, spec.pattern) {
        case ("POST", "/v1/accounts"):
            let body = try decode(EnrollRequest.self, request)
            if let passphrase = body.passphrase { try checkPassphrase(passphrase) }
        case ("POST", "/v1/accounts/{identity}/unlock"):
            if let passphrase = try decode(UnlockRequest.self, request).passphrase { try checkPassphrase(passphrase) }
        case ("POST", "/v1/accounts/{identity}/passphrase"):
            let body = try decode(PassphraseRequest.self, request)
            if let old = body.old { try checkPassphrase(old) }
            if let new = body.new { try checkPassphrase(new) }
        case ("POST", "/v1/accounts/{identity}/login-protector"): try checkPassphrase(try decode(ProtectorRequest.self, request).password)
        case ("POST", "/v1/accounts/{identity}/recovery-key"): _ = try escrowKey(try decode(RecoveryKeyRequest.self, request))
        case ("POST", "/v1/accounts/{identity}/recover"):
            let body = try decode(RecoverRequest.self, request)
            if let new = body.newPassphrase { try checkPassphrase(new) }
        case ("POST", "/v1/login/unlock"): try checkPassphrase(try decode(LoginRequest.self, request).password)
        case ("POST", "/v1/login/password"):
            let body = try decode(PasswordChangeRequest.self, request)
            try checkPassphrase(body.new)
            if let old = body.old { try checkPassphrase(old) }
        case ("POST", "/v1/login/lock"), ("POST", "/v1/login/open"):
            let body = try decode(LogoutRequest.self, request)
            if spec.pattern == "/v1/login/open", body.session == nil { throw badRequest("give the session: the PID of the process that opened it") }
            if let session = body.session, session <= 0 { throw badRequest("session must be a process ID (1 or more)") }
        case ("POST", "/v1/machine-key/migrate"): _ = try migration(try decode(MigrateRequest.self, request))
        case ("PUT", "/v1/accounts/{identity}/policy"): _ = try decode(Policy.self, request)
        case ("POST", "/v1/bindings"):
            let body = try decode(BindRequest.self, request)
            guard (body.pid == nil) != (body.tid == nil) else { throw badRequest("give exactly one of pid and tid") }
        case ("POST", "/v1/files/info"), ("POST", "/v1/files/is-encrypted"): _ = try decode(PathRequest.self, request)
        case ("POST", "/v1/files/protect"): _ = try decode(ProtectRequest.self, request)
        case ("POST", "/v1/files/encrypt"), ("POST", "/v1/files/can-receive"):
            guard !(try decode(EncryptRequest.self, request)).identity.isEmpty else { throw badRequest("identity must not be empty") }
        case ("POST", "/v1/files/decrypt"): _ = try decode(DecryptRequest.self, request)
        case ("POST", "/v1/files/repair"): _ = try decode(PathRequest.self, request)
        case ("POST", "/v1/locations/classify"): _ = try decode(PathRequest.self, request)
        case ("POST", "/v1/locations/save-to-allowed"), ("POST", "/v1/locations/open-from-allowed"):
            _ = try checkLocation(try decode(LocationQuery.self, request))
        case ("POST", "/v1/data/protect"), ("POST", "/v1/data/unprotect"), ("POST", "/v1/data/info"):
            let body = try decode(DataRequest.self, request)
            _ = try decodeData(body)
            if spec.pattern == "/v1/data/protect", body.identity?.isEmpty ?? true { throw badRequest("missing field identity") }
        default: break
        }
        return (spec, parameters)
    }

    /// A passphrase is at least one byte (an account without one is enrolled by leaving it out).
    static func checkPassphrase(_ text: String) throws(Failure) {
        guard !text.isEmpty else { throw badRequest("passphrase must not be empty; leave it out for an account without one") }
    }

    func dispatch(_ spec: RouteSpec, _ p: [String: String], _ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let identity = p["identity"] ?? ""
        switch (spec.method, spec.pattern) {
        case ("GET", "/v1/status"):
            return json(status(for: caller))
        case ("GET", "/v1/accounts"):
            return json(engine.accounts().filter { caller.isAdmin || $0.uid == caller.uid }.map(AccountView.init))
        case ("POST", "/v1/accounts"):
            guard caller.isAdmin else { throw Self.notAuthorized("enroll accounts") }
            return try enroll(try decode(EnrollRequest.self, request))
        case ("GET", "/v1/accounts/{identity}"):
            return try run { () throws(EngineError) in json(AccountView(try visibleAccount(identity, caller))) }
        case ("POST", "/v1/accounts/{identity}/lock"):
            try authorize(caller, forAccount: identity, "lock \(identity)")
            return try run { () throws(EngineError) in
                try engine.lock(identity)
                return json(LockView(identity: identity, status: try engine.lockStatus(identity)))
            }
        case ("POST", "/v1/accounts/{identity}/unlock"):
            try authorize(caller, forAccount: identity, "unlock \(identity)")
            let body = try decode(UnlockRequest.self, request)
            return try run { () throws(EngineError) in
                let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                try engine.unlock(identity, passphrase: passphrase)
                return json(LockView(identity: identity, status: try engine.lockStatus(identity)))
            }
        case ("POST", "/v1/accounts/{identity}/passphrase"):
            try authorize(caller, forAccount: identity, "change the passphrase of \(identity)")
            let body = try decode(PassphraseRequest.self, request)
            return try run { () throws(EngineError) in
                let old = try body.old.map { (text) throws(EngineError) in try Self.secret(text) }
                let new = try body.new.map { (text) throws(EngineError) in try Self.secret(text) }
                try engine.changePassphrase(identity, old: old, new: new)
                return json(AccountView(try engine.account(identity)))
            }
        case ("POST", "/v1/accounts/{identity}/login-protector"):
            return try addLoginProtector(identity, try decode(ProtectorRequest.self, request), caller)
        case ("DELETE", "/v1/accounts/{identity}/login-protector"):
            return try removeLoginProtector(identity, caller)
        case ("POST", "/v1/accounts/{identity}/recovery-key"):
            return try createRecoveryKey(identity, try decode(RecoveryKeyRequest.self, request), caller)
        case ("DELETE", "/v1/accounts/{identity}/recovery-key"):
            return try removeRecoveryKey(identity, caller)
        case ("POST", "/v1/accounts/{identity}/recover"):
            return try recover(identity, try decode(RecoverRequest.self, request), caller)
        case ("POST", "/v1/login/unlock"):
            return try login(try decode(LoginRequest.self, request), caller)
        case ("POST", "/v1/login/password"):
            return try loginPasswordChanged(try decode(PasswordChangeRequest.self, request), caller)
        case ("POST", "/v1/login/lock"):
            return try logout(try decode(LogoutRequest.self, request), caller)
        case ("POST", "/v1/login/open"):
            return try sessionOpened(try decode(LogoutRequest.self, request), caller)
        case ("POST", "/v1/accounts/{identity}/wipe"):
            guard caller.isAdmin else { throw Self.notAuthorized("wipe \(identity)") }
            return try wipe(identity, wait: request.query["wait"] != "false", by: caller)
        case ("DELETE", "/v1/accounts/{identity}"):
            guard caller.isAdmin else { throw Self.notAuthorized("deregister \(identity)") }
            if request.query["wipe"] == "true" { return try wipe(identity, wait: request.query["wait"] != "false", by: caller) }
            return try run { () throws(EngineError) in
                try engine.deregister(identity, wipe: false)
                return HTTPResponse(status: 204, body: [])
            }
        case ("PUT", "/v1/accounts/{identity}/policy"):
            guard caller.isAdmin else { throw Self.notAuthorized("change the policy of \(identity)") }
            let policy = try decode(Policy.self, request)
            return try run { () throws(EngineError) in json(AccountView(try engine.setPolicy(identity, policy))) }
        case ("GET", "/v1/accounts/{identity}/policy"):
            return try run { () throws(EngineError) in
                let account = try visibleAccount(identity, caller)
                guard let policy = account.policy else { throw .notEnrolled(account.upn) }
                return json(policy)
            }
        case ("GET", "/v1/machine-key"):
            guard caller.isAdmin else { throw Self.notAuthorized("see the machine key") }
            return json(engine.machineKeyStatus())
        case ("POST", "/v1/machine-key/migrate"):
            guard caller.isAdmin else { throw Self.notAuthorized("move the machine key") }
            let (store, pcrs) = try Self.migration(try decode(MigrateRequest.self, request))
            return try run { () throws(EngineError) in json(try engine.migrateMachineKey(to: store, pcrs: pcrs)) }
        case ("POST", "/v1/machine-key/reset"):
            guard caller.isAdmin else { throw Self.notAuthorized("replace the machine key") }
            return try run { () throws(EngineError) in json(try engine.resetMachineKey()) }
        case ("POST", "/v1/lock"):
            guard caller.isAdmin else { throw Self.notAuthorized("lock every account") }
            engine.lockAll()
            return json(status())
        case ("POST", "/v1/unlock"):
            guard caller.isAdmin else { throw Self.notAuthorized("unlock every account") }
            let needPassphrase = engine.unlockAll()
            return json(["stillLocked": needPassphrase])
        case ("POST", "/v1/bindings"):
            return try bind(try decode(BindRequest.self, request), caller)
        case ("DELETE", "/v1/bindings/{pid}"):
            let pid = try Self.processID(p["pid"] ?? "")
            try authorizeProcess(caller, pid, "unbind process \(pid)")
            return try run { () throws(EngineError) in
                try engine.unbindProcess(pid)
                return HTTPResponse(status: 204, body: [])
            }
        case ("GET", "/v1/processes/{pid}/identity"):
            let pid = try Self.processID(p["pid"] ?? "")
            let processes = LinuxProcessTable()
            guard processes.startTime(of: pid) != nil else { throw Self.failure(.noSuchProcess(pid)) }
            // Whose identity a process works as is its owner's business (and the administrators').
            try authorizeProcess(caller, pid, "read the identity of process \(pid)")
            let resolved = engine.resolve(thread: pid, uid: processes.uid(of: pid) ?? 0)
            return json(IdentityView(pid: pid, identity: resolved.identity, source: resolved.source.description))
        case ("POST", "/v1/files/info"):
            var info = try readableInfo(try decode(PathRequest.self, request), caller)
            info.owner = visibleOwner(info.owner, to: caller)
            return json(info)
        case ("POST", "/v1/files/is-encrypted"):
            let info = try readableInfo(try decode(PathRequest.self, request), caller)
            return json(["path": JSONValue.string(info.path), "encrypted": .bool(info.encrypted)])
        case ("POST", "/v1/files/protect"):
            return try protect(try decode(ProtectRequest.self, request), caller)
        case ("POST", "/v1/files/encrypt"):
            return try encryptFile(try decode(EncryptRequest.self, request), caller)
        case ("POST", "/v1/files/decrypt"):
            return try decryptFile(try decode(DecryptRequest.self, request), caller)
        case ("POST", "/v1/files/can-receive"):
            return try canReceive(try decode(EncryptRequest.self, request), caller)
        case ("POST", "/v1/files/repair"):
            guard caller.isAdmin else { throw Self.notAuthorized("repair files") }
            return try repairFile(try decode(PathRequest.self, request), caller)
        case ("GET", "/v1/locations"):
            return locations(request, caller)
        case ("POST", "/v1/locations/classify"):
            return try classify(try decode(PathRequest.self, request), caller)
        case ("POST", "/v1/locations/save-to-allowed"):
            return try locationAnswer(try decode(LocationQuery.self, request), caller, saving: true)
        case ("POST", "/v1/locations/open-from-allowed"):
            return try locationAnswer(try decode(LocationQuery.self, request), caller, saving: false)
        case ("POST", "/v1/data/protect"):
            return try protectData(try decode(DataRequest.self, request), caller)
        case ("POST", "/v1/data/unprotect"):
            return try unprotectData(try decode(DataRequest.self, request), caller)
        case ("POST", "/v1/data/info"):
            let bytes = try Self.decodeData(try decode(DataRequest.self, request))
            return try run { () throws(EngineError) in
                var info = try engine.dataProtectionInfo(bytes)
                info.owner = visibleOwner(info.owner, to: caller)
                return json(info)
            }
        case ("GET", "/v1/jobs"):
            return json(jobs.visible(to: caller).map(\.snapshot))
        case ("GET", "/v1/jobs/{id}"):
            guard let id = Int(p["id"] ?? ""), let job = jobs.job(id), caller.isAdmin || job.startedBy == caller.uid else {
                throw Failure(status: 404, code: 404, name: "UnknownJob", message: "no job \(p["id"] ?? "")")
            }
            return json(job.snapshot)
        case ("GET", "/v1/events"):
            return try events(request, caller)
        case ("GET", "/v1/metrics"):
            return metricsAnswer(caller)
        case ("GET", "/v1/diagnostics"):
            guard caller.isAdmin else { throw Self.notAuthorized("read the diagnostics") }
            return diagnosticsBundle()
        default:
            throw unknownRoute(request)
        }
    }

    static func processID(_ text: String) throws(Failure) -> Int32 {
        guard let pid = Int32(text), pid > 0 else { throw Failure(status: 400, code: 400, name: "BadRequest", message: "not a process ID: \(text)") }
        return pid
    }

    func unknownRoute(_ request: HTTPRequest) -> Failure {
        Failure(status: 404, code: 404, name: "UnknownRoute", message: "no route \(request.method) \(request.path)")
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
    func status(for caller: Caller? = nil) -> StatusView {
        let accounts = engine.accounts().filter { caller.map { $0.isAdmin } ?? true || $0.uid == caller?.uid }
        var machineKey = engine.machineKeyStatus(counter: false)
        machineKey.stranded = machineKey.stranded.filter { upn in accounts.contains { $0.upn == upn } }
        return StatusView(version: Self.version,
                   mounts: engine.volumes.map { MountView(mountPoint: $0.mountPoint, backing: $0.backingDirectory) },
                   accounts: accounts.map { account in
                       var view = AccountView(account)
                       if account.isEnrolled {
                           view.unavailable = engine.unavailability(of: account)
                           view.lock = (try? engine.lockStatus(account.id))?.name ?? (view.unavailable != nil ? "unavailable" : nil)
                           let attempts = engine.unlockAttempts(account.id)
                           view.failedUnlockAttempts = attempts.failures
                           view.retryAfterSeconds = attempts.retryAfter
                       }
                       return view
                   },
                   machineKey: machineKey,
                   stateProblems: engine.stateProblems.filter { problem in
                       caller.map { $0.isAdmin } ?? true || accounts.contains { account in problem.identity.map(account.matches) ?? false }
                   })
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

    func enroll(_ body: EnrollRequest) throws(Failure) -> HTTPResponse {
        var uid = body.uid
        if let user = body.user {
            guard let entry = getpwnam(user) else { throw Self.unknownUser(user) }
            if let uid, uid != entry.pointee.pw_uid { throw Self.badRequest("user \(user) is uid \(entry.pointee.pw_uid), not \(uid)") }
            uid = entry.pointee.pw_uid
        }
        return try run { () throws(EngineError) in
            let account: Account
            if body.enroll ?? true {
                let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                account = try engine.enroll(id: body.id, upn: body.upn, policy: body.policy ?? Policy(), passphrase: passphrase, uid: uid)
            } else {
                account = try engine.register(id: body.id, upn: body.upn, uid: uid)
            }
            return json(AccountView(account), status: 201)
        }
    }

    /// Wipes an identity as a job: keys destroyed first, then its files deleted in every mount,
    /// then it is deregistered. Waits for the result unless `wait` is false (then 202 and the job).
    func wipe(_ identity: String, wait: Bool, by caller: Caller) throws(Failure) -> HTTPResponse {
        let account = try engineCall { () throws(EngineError) in try self.engine.account(identity) }
        let engine = self.engine
        let job = jobs.start(kind: "wipe", target: account.upn, startedBy: caller.uid) { (job) throws(Failure) -> JSONValue in
            let token = engine.events.subscribe { event in
                guard event.kind == .wipeProgress, event.identity == account.upn else { return }
                var counters: [String: UInt64] = [:]
                for key in ["scanned", "deleted", "bytesFreed"] { if let value = event.details[key].flatMap(UInt64.init) { counters[key] = value } }
                if let seconds = event.details["keysDestroyedSeconds"].flatMap(Double.init) { counters["keysDestroyedMicroseconds"] = UInt64(seconds * 1e6) }
                job.update(counters)
            }
            defer { engine.events.unsubscribe(token) }
            do throws(EngineError) {
                try engine.deregister(account.upn, wipe: true)
            } catch {
                throw Self.failure(error)
            }
            let progress = job.snapshot.progress
            return JSONValue.of(WipeView(identity: account.upn, code: 104, result: "UnenrollmentSuccess",
                                         keysDestroyedSeconds: Double(progress["keysDestroyedMicroseconds"] ?? 0) / 1e6,
                                         scanned: Int(progress["scanned"] ?? 0), deleted: Int(progress["deleted"] ?? 0),
                                         bytesFreed: progress["bytesFreed"] ?? 0))
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
            return json(IdentityView(pid: task, identity: resolved.identity, source: resolved.source.description), status: 201)
        }
    }
}

// MARK: Bodies

struct EnrollRequest: Decodable {
    var id: String
    var upn: String
    var enroll: Bool?
    var policy: Policy?
    var passphrase: String?
    var uid: UInt32?
    /// The local user by name, instead of `uid`.
    var user: String?
}

struct UnlockRequest: Decodable { var passphrase: String? }
/// The current passphrase (absent when there is none) and the new one (absent: remove it).
struct PassphraseRequest: Decodable { var old: String?; var new: String? }

struct BindRequest: Decodable {
    var pid: Int32?
    var tid: Int32?
    var identity: String
}

struct AccountView: Encodable {
    var id: String
    var upn: String
    var enrolled: Bool
    var policy: Policy?
    var uid: UInt32?
    var hasPassphrase: Bool
    var hasLoginProtector: Bool
    var hasRecoveryKey: Bool
    var reprotectPending: Bool
    var lock: String?
    /// Why an enrolled identity cannot be opened (its machine key or its keybag).
    var unavailable: String?
    /// Wrong passphrases (or login passwords) in a row, and the wait before the next attempt.
    var failedUnlockAttempts: Int?
    var retryAfterSeconds: Double?

    init(_ account: Account) {
        id = account.id
        upn = account.upn
        enrolled = account.isEnrolled
        policy = account.policy
        uid = account.uid
        hasPassphrase = account.hasPassphrase
        hasLoginProtector = account.hasLoginProtector ?? false
        hasRecoveryKey = account.hasRecoveryKey ?? false
        reprotectPending = account.reprotectPending
    }
}

struct WipeView: Encodable {
    var identity: String
    var code: Int
    var result: String
    /// From the start of the wipe until the identity's keys were gone (its data unreadable).
    var keysDestroyedSeconds: Double
    var scanned: Int
    var deleted: Int
    var bytesFreed: UInt64
}

struct StatusView: Encodable {
    var version: String
    var mounts: [MountView]
    var accounts: [AccountView]
    /// Where the machine key is kept, a warning when it is a file, and the caller's identities
    /// that cannot be opened.
    var machineKey: MachineKeyStatus
    /// What the daemon could not use in its state directory (`StateProblem`).
    var stateProblems: [StateProblem]
}

struct MigrateRequest: Decodable {
    /// "tpm2" or "file".
    var to: String
    /// SHA-256 PCRs to bind a TPM-sealed key to (absent: the configured `tpm2-pcrs`).
    var pcrs: [Int]?
}

struct MountView: Encodable {
    var mountPoint: String
    var backing: String
}

struct LockView: Encodable {
    var identity: String
    var lock: String
    init(identity: String, status: LockStatus) {
        self.identity = identity
        self.lock = status.name
    }
}

struct IdentityView: Encodable {
    var pid: Int32
    var identity: String?
    var source: String
}

