import CustodyAPI
import CustodyCore
import CustodySystem

/// Who may call a route: the "who" column of docs/api.md's route table, which a unit test holds
/// to this table. `admin` and `accountOwner` are enforced before the route's handler runs; the
/// others depend on what the handler finds (the process, the file, the user a body names), so
/// the handler enforces them.
enum Access: String, Sendable, CaseIterable {
    case anyone = "anyone"
    /// Root or the admin group.
    case admin = "admin"
    /// An administrator, or the local user the account `{identity}` is mapped to.
    case accountOwner = "admin or mapped uid"
    /// An administrator, or the owner of the process the request names.
    case processOwner = "admin, or the process's owner"
    /// Any user for itself; an administrator for the `user` the body names.
    case loginUser = "anyone for itself; admin for `user`"
    /// Anyone, acting with its own file system credentials on the path.
    case fileReader = "who can read it"
    case fileWriter = "who can write it"
    case fileReaderWriter = "who can read and write it"
    /// Anyone, for its own accounts and unmanaged identities.
    case ownAccounts = "anyone (own accounts)"
    /// Anyone; the answer holds what the caller may see.
    case filtered = "anyone (filtered)"
}

/// A request as its route's handler gets it.
struct RouteRequest {
    let http: HTTPRequest
    let parameters: [String: String]
    let caller: Caller
    /// The `{identity}` path parameter ("" for routes without one).
    var identity: String { parameters["identity"] ?? "" }
    /// A `true`/`false` query parameter.
    func flag(_ name: String, default value: Bool) -> Bool { http.query[name].map { $0 == "true" } ?? value }
}

/// One route of the control API, in one row: method, path, who may call it, what its body must
/// be (checked in the control front before anything reaches the daemon, and by the daemon
/// again), and the handler that serves it. `ControlAPI.table` lists them all; the front's check,
/// the daemon's dispatch and the tests read that one list (as OpenSSH's monitor reads
/// `mon_dispatch_proto20`).
struct Route: Sendable {
    let endpoint: Endpoint
    var method: String { endpoint.method }
    let access: Access
    /// What a caller who may not is told it may not do ("enroll accounts"); `{identity}` is the
    /// path's identity.
    let action: String
    /// Everything about the body and parameters that needs no engine.
    let check: @Sendable (HTTPRequest, [String: String]) throws(ControlAPI.Failure) -> Void
    let serve: @Sendable (ControlAPI, RouteRequest) throws(ControlAPI.Failure) -> HTTPResponse

    /// A route without a body (one sent is ignored).
    init(_ endpoint: Endpoint, _ access: Access, _ action: String = "",
         check: @escaping @Sendable (HTTPRequest, [String: String]) throws(ControlAPI.Failure) -> Void = { _, _ in },
         serve: @escaping @Sendable (ControlAPI, RouteRequest) throws(ControlAPI.Failure) -> HTTPResponse) {
        self.endpoint = endpoint
        self.access = access
        self.action = action
        self.check = check
        self.serve = serve
    }

    /// A route whose body is a `Body`: decoded (400 when it is not one), checked by `check`, and
    /// handed to `serve`.
    static func with<Body: Decodable & SendableMetatype>(_ endpoint: Endpoint, _ access: Access, _ action: String = "", body: Body.Type,
                                      check: @escaping @Sendable (Body) throws(ControlAPI.Failure) -> Void = { _ in },
                                      serve: @escaping @Sendable (ControlAPI, RouteRequest, Body) throws(ControlAPI.Failure) -> HTTPResponse) -> Route {
        Route(endpoint, access, action,
              check: { (request, _) throws(ControlAPI.Failure) in try check(try ControlAPI.decode(Body.self, request)) },
              serve: { (api, request) throws(ControlAPI.Failure) in try serve(api, request, try ControlAPI.decode(Body.self, request.http)) })
    }

    /// Refuses a caller the route's access does not admit (for the access checked before the handler).
    func authorize(_ request: RouteRequest, _ api: ControlAPI) throws(ControlAPI.Failure) {
        let what = action.replacingAll(of: "{identity}", with: request.identity)
        switch access {
        case .admin: guard request.caller.isAdmin else { throw ControlAPI.notAuthorized(what) }
        case .accountOwner: try api.authorize(request.caller, forAccount: request.identity, what)
        default: break
        }
    }
}

extension ControlAPI {
    /// Every route served.
    static let table: [Route] = accountRoutes + loginRoutes + machineRoutes + fileRoutes + otherRoutes

    static let accountRoutes: [Route] = [
        Route(.status, .filtered) { (api, r) throws(Failure) in api.json(api.status(for: r.caller)) },
        Route(.accounts, .filtered) { (api, r) throws(Failure) in
            api.json(api.engine.accounts().filter { r.caller.isAdmin || $0.uid == r.caller.uid }.map { CustodyAccount($0) })
        },
        .with(.enroll, .admin, "enroll accounts", body: EnrollRequest.self,
              check: { (body) throws(Failure) in
                  if let passphrase = body.passphrase { try checkPassphrase(passphrase) }
                  if let policy = body.policy { _ = try Self.policy(policy) }
              },
              serve: { (api, _, body) throws(Failure) in try api.enroll(body) }),
        Route(.account, .filtered) { (api, r) throws(Failure) in
            try api.run { () throws(EngineError) in api.json(CustodyAccount(try api.visibleAccount(r.identity, r.caller))) }
        },
        Route(.deregister, .admin, "deregister {identity}") { (api, r) throws(Failure) in
            if r.flag("wipe", default: false) { return try api.wipe(r.identity, wait: r.flag("wait", default: true), by: r.caller) }
            return try api.run { () throws(EngineError) in
                try api.engine.deregister(r.identity, wipe: false)
                return HTTPResponse(status: 204, body: [])
            }
        },
        Route(.wipe, .admin, "wipe {identity}") { (api, r) throws(Failure) in
            try api.wipe(r.identity, wait: r.flag("wait", default: true), by: r.caller)
        },
        Route(.ownedFiles, .admin, "list the files of {identity}") { (api, r) throws(Failure) in try api.ownedFiles(r) },
        Route(.allowedAccounts, .admin, "read the allowed accounts") { (api, _) throws(Failure) in
            let settings = api.engine.settings
            return api.json(CustodyAllowedAccounts(allowedAccounts: settings.allowedAccounts, action: settings.allowedAccountsAction.rawValue,
                                                   notAllowed: api.engine.accountsNotAllowed().map(\.upn)))
        },
        Route(.policy, .filtered) { (api, r) throws(Failure) in
            try api.run { () throws(EngineError) in
                let account = try api.visibleAccount(r.identity, r.caller)
                guard let policy = account.policy else { throw .notEnrolled(account.upn) }
                return api.json(Self.document(policy))
            }
        },
        .with(.setPolicy, .admin, "change the policy of {identity}", body: CustodyPolicy.self,
              check: { (document) throws(Failure) in _ = try Self.policy(document) },
              serve: { (api, r, document) throws(Failure) in
                  let policy = try Self.policy(document)
                  return try api.run { () throws(EngineError) in api.json(CustodyAccount(try api.engine.setPolicy(r.identity, policy))) }
              }),
        Route(.lock, .accountOwner, "lock {identity}") { (api, r) throws(Failure) in
            try api.run { () throws(EngineError) in
                try api.engine.lock(r.identity)
                return api.json(LockState(identity: r.identity, lock: try api.engine.lockStatus(r.identity).name))
            }
        },
        .with(.unlock, .accountOwner, "unlock {identity}", body: UnlockRequest.self,
              check: { (body) throws(Failure) in if let passphrase = body.passphrase { try checkPassphrase(passphrase) } },
              serve: { (api, r, body) throws(Failure) in
                  try api.run { () throws(EngineError) in
                      let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                      try api.engine.unlock(r.identity, passphrase: passphrase)
                      return api.json(LockState(identity: r.identity, lock: try api.engine.lockStatus(r.identity).name))
                  }
              }),
        .with(.passphrase, .accountOwner, "change the passphrase of {identity}", body: PassphraseRequest.self,
              check: { (body) throws(Failure) in
                  if let old = body.old { try checkPassphrase(old) }
                  if let new = body.new { try checkPassphrase(new) }
              },
              serve: { (api, r, body) throws(Failure) in
                  try api.run { () throws(EngineError) in
                      let old = try body.old.map { (text) throws(EngineError) in try Self.secret(text) }
                      let new = try body.new.map { (text) throws(EngineError) in try Self.secret(text) }
                      try api.engine.changePassphrase(r.identity, old: old, new: new)
                      return api.json(CustodyAccount(try api.engine.account(r.identity)))
                  }
              }),
        .with(.addLoginProtector, .accountOwner, "set the login protector of {identity}", body: ProtectorRequest.self,
              check: { (body) throws(Failure) in try checkPassphrase(body.password) },
              serve: { (api, r, body) throws(Failure) in try api.addLoginProtector(r.identity, body) }),
        Route(.removeLoginProtector, .accountOwner, "remove the login protector of {identity}") { (api, r) throws(Failure) in
            try api.removeLoginProtector(r.identity)
        },
        .with(.createRecoveryKey, .accountOwner, "create a recovery key for {identity}", body: RecoveryKeyRequest.self,
              check: { (body) throws(Failure) in _ = try escrowKey(body) },
              serve: { (api, r, body) throws(Failure) in try api.createRecoveryKey(r.identity, body) }),
        Route(.removeRecoveryKey, .accountOwner, "remove the recovery key of {identity}") { (api, r) throws(Failure) in
            try api.removeRecoveryKey(r.identity)
        },
        .with(.recover, .accountOwner, "recover {identity}", body: RecoverRequest.self,
              check: { (body) throws(Failure) in if let new = body.newPassphrase { try checkPassphrase(new) } },
              serve: { (api, r, body) throws(Failure) in try api.recover(r.identity, body) }),
        Route(.hostKey, .anyone) { (api, _) throws(Failure) in try api.hostKey() },
        .with(.exportIdentity, .admin, "export the keys of {identity}", body: ExportIdentityRequest.self,
              check: { (body) throws(Failure) in _ = try hostKey(body) },
              serve: { (api, r, body) throws(Failure) in try api.exportIdentity(r.identity, body) }),
        Route(.rotateKeys, .admin, "rotate the keys of {identity}") { (api, r) throws(Failure) in try api.rotateKeys(r.identity) },
        .with(.importIdentity, .admin, "import identities", body: ImportIdentityRequest.self,
              check: { (body) throws(Failure) in
                  if let passphrase = body.passphrase { try checkPassphrase(passphrase) }
                  if let policy = body.policy { _ = try Self.policy(policy) }
              },
              serve: { (api, r, body) throws(Failure) in try api.importIdentity(body, checking: r.flag("check", default: false)) }),
    ]

    static let loginRoutes: [Route] = [
        .with(.loginUnlock, .loginUser, body: LoginRequest.self,
              check: { (body) throws(Failure) in try checkPassphrase(body.password) },
              serve: { (api, r, body) throws(Failure) in try api.login(body, r.caller) }),
        .with(.loginPassword, .loginUser, body: PasswordChangeRequest.self,
              check: { (body) throws(Failure) in
                  try checkPassphrase(body.new)
                  if let old = body.old { try checkPassphrase(old) }
              },
              serve: { (api, r, body) throws(Failure) in try api.loginPasswordChanged(body, r.caller) }),
        .with(.loginOpen, .loginUser, body: SessionRequest.self,
              check: { (body) throws(Failure) in
                  guard let session = body.session else { throw badRequest("give the session: the PID of the process that opened it") }
                  if session <= 0 { throw badRequest("session must be a process ID (1 or more)") }
              },
              serve: { (api, r, body) throws(Failure) in try api.sessionOpened(body, r.caller) }),
        .with(.loginLock, .loginUser, body: SessionRequest.self,
              check: { (body) throws(Failure) in
                  if let session = body.session, session <= 0 { throw badRequest("session must be a process ID (1 or more)") }
              },
              serve: { (api, r, body) throws(Failure) in try api.logout(body, r.caller) }),
    ]

    static let machineRoutes: [Route] = [
        Route(.machineKey, .admin, "see the machine key") { (api, _) throws(Failure) in api.json(CustodyMachineKey(api.engine.machineKeyStatus())) },
        .with(.migrateMachineKey, .admin, "move the machine key", body: MigrateRequest.self,
              check: { (body) throws(Failure) in _ = try migration(body) },
              serve: { (api, _, body) throws(Failure) in
                  let (store, pcrs) = try Self.migration(body)
                  return try api.run { () throws(EngineError) in api.json(CustodyMachineKey(try api.engine.migrateMachineKey(to: store, pcrs: pcrs))) }
              }),
        Route(.resetMachineKey, .admin, "replace the machine key") { (api, _) throws(Failure) in
            try api.run { () throws(EngineError) in api.json(CustodyMachineKey(try api.engine.resetMachineKey())) }
        },
        Route(.lockAll, .admin, "lock every account") { (api, _) throws(Failure) in
            api.engine.lockAll()
            return api.json(api.status())
        },
        Route(.unlockAll, .admin, "unlock every account") { (api, _) throws(Failure) in
            api.json(UnlockAllResult(stillLocked: api.engine.unlockAll()))
        },
        .with(.bind, .processOwner, body: BindRequest.self,
              check: { (body) throws(Failure) in
                  guard (body.pid == nil) != (body.tid == nil) else { throw badRequest("give exactly one of pid and tid") }
              },
              serve: { (api, r, body) throws(Failure) in try api.bind(body, r.caller) }),
        Route(.unbind, .processOwner) { (api, r) throws(Failure) in
            let pid = try Self.processID(r.parameters["pid"] ?? "")
            // ?thread=true: the number is a thread's, and its own binding goes.
            let thread = r.flag("thread", default: false)
            try api.authorizeProcess(r.caller, pid, thread ? "unbind thread \(pid)" : "unbind process \(pid)")
            return try api.run { () throws(EngineError) in
                if thread { try api.engine.unbindThread(pid) } else { try api.engine.unbindProcess(pid) }
                return HTTPResponse(status: 204, body: [])
            }
        },
        Route(.processIdentity, .processOwner) { (api, r) throws(Failure) in
            let pid = try Self.processID(r.parameters["pid"] ?? "")
            let processes = LinuxProcessTable()
            guard processes.startTime(of: pid) != nil else { throw Self.failure(.noSuchProcess(pid)) }
            // Whose identity a process works as is its owner's business (and the administrators').
            try api.authorizeProcess(r.caller, pid, "read the identity of process \(pid)")
            let resolved = api.engine.resolve(thread: pid, uid: processes.uid(of: pid) ?? 0)
            return api.json(ProcessIdentity(pid: pid, identity: resolved.identity, source: resolved.source.description))
        },
    ]

    static let fileRoutes: [Route] = [
        .with(.fileInfo, .fileReader, body: PathRequest.self) { (api, r, body) throws(Failure) in
            var info = try api.readableInfo(body, r.caller)
            info.plainReason = info.plainReason.map { api.hidingOwner(info.owner, in: $0, from: r.caller) }
            info.owner = api.visibleOwner(info.owner, to: r.caller)
            return api.json(CustodyAPI.FileProtectionInfo(info))
        },
        .with(.isEncrypted, .fileReader, body: PathRequest.self) { (api, r, body) throws(Failure) in
            let info = try api.readableInfo(body, r.caller)
            return api.json(EncryptedAnswer(path: info.path, encrypted: info.encrypted))
        },
        .with(.protectFile, .fileWriter, body: ProtectRequest.self) { (api, r, body) throws(Failure) in try api.protect(body, r.caller) },
        .with(.encryptFile, .fileReaderWriter, body: PathIdentityRequest.self,
              check: { (body) throws(Failure) in guard !body.identity.isEmpty else { throw badRequest("identity must not be empty") } },
              serve: { (api, r, body) throws(Failure) in try api.encryptFile(body, r.caller) }),
        .with(.decryptFile, .fileReader, body: DecryptRequest.self) { (api, r, body) throws(Failure) in try api.decryptFile(body, r.caller) },
        .with(.canReceive, .fileReader, body: PathIdentityRequest.self,
              check: { (body) throws(Failure) in guard !body.identity.isEmpty else { throw badRequest("identity must not be empty") } },
              serve: { (api, r, body) throws(Failure) in try api.canReceive(body, r.caller) }),
        .with(.repairFile, .admin, "repair files", body: PathRequest.self) { (api, r, body) throws(Failure) in try api.repairFile(body, r.caller) },
        Route(.locations, .anyone) { (api, r) throws(Failure) in try api.locations(r.http, r.caller) },
        .with(.classify, .anyone, body: PathRequest.self) { (api, r, body) throws(Failure) in try api.classify(body, r.caller) },
        .with(.saveToAllowed, .anyone, body: LocationQuery.self,
              check: { (body) throws(Failure) in _ = try checkLocation(body) },
              serve: { (api, r, body) throws(Failure) in try api.locationAnswer(body, r.caller, saving: true) }),
        .with(.openFromAllowed, .anyone, body: LocationQuery.self,
              check: { (body) throws(Failure) in _ = try checkLocation(body) },
              serve: { (api, r, body) throws(Failure) in try api.locationAnswer(body, r.caller, saving: false) }),
        .with(.protectData, .ownAccounts, body: DataRequest.self,
              check: { (body) throws(Failure) in
                  _ = try decodeData(body)
                  if body.identity?.isEmpty ?? true { throw badRequest("missing field identity") }
              },
              serve: { (api, r, body) throws(Failure) in try api.protectData(body, r.caller) }),
        .with(.unprotectData, .ownAccounts, body: DataRequest.self,
              check: { (body) throws(Failure) in _ = try decodeData(body) },
              serve: { (api, r, body) throws(Failure) in try api.unprotectData(body, r.caller) }),
        .with(.dataInfo, .filtered, body: DataRequest.self,
              check: { (body) throws(Failure) in _ = try decodeData(body) },
              serve: { (api, r, body) throws(Failure) in
                  let bytes = try Self.decodeData(body)
                  return try api.run { () throws(EngineError) in
                      var info = try api.engine.dataProtectionInfo(bytes)
                      info.owner = api.visibleOwner(info.owner, to: r.caller)
                      return api.json(CustodyAPI.DataProtectionInfo(info))
                  }
              }),
    ]

    static let otherRoutes: [Route] = [
        Route(.jobs, .filtered) { (api, r) throws(Failure) in api.json(api.jobs.visible(to: r.caller).map(\.snapshot)) },
        Route(.job, .filtered) { (api, r) throws(Failure) in
            guard let id = Int(r.parameters["id"] ?? ""), let job = api.jobs.job(id), r.caller.isAdmin || job.startedBy == r.caller.uid else {
                throw Failure(status: 404, code: 404, name: "UnknownJob", message: "no job \(r.parameters["id"] ?? "")")
            }
            return api.json(job.snapshot)
        },
        Route(.events, .filtered) { (api, r) throws(Failure) in try api.events(r.http, r.caller) },
        Route(.diagnostics, .admin, "read the diagnostics") { (api, _) throws(Failure) in api.diagnosticsBundle() },
        Route(.metrics, .filtered) { (api, r) throws(Failure) in api.metricsAnswer(r.caller) },
    ]
}
