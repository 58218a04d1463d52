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
    static let version = "0.2.0"

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
    }

    struct ErrorBody: Encodable { var code: Int; var name: String; var message: String }

    static func failure(_ status: Int, _ code: Int, _ name: String, _ message: String) -> HTTPResponse {
        let body = (try? JSONEncoder().encode(ErrorBody(code: code, name: name, message: message))).map { Array($0) } ?? []
        return HTTPResponse(status: status, body: body)
    }

    static func failure(_ error: EngineError) -> Failure {
        let status: Int
        switch error {
        case .unknownAccount, .noSuchProcess: status = 404
        case .alreadyEnrolled, .notEnrolled, .singleManagedAccountMode: status = 409
        case .accountNotAllowed, .wrongPassphrase: status = 403
        case .invalidIdentity, .invalidPolicy, .passphraseRequired: status = 400
        case .rateLimited: status = 429
        case .locked: status = 423
        case .corruptState, .io, .crypto, .format: status = 500
        }
        return Failure(status: status, code: error.code, name: error.name, message: error.description)
    }

    static func notAuthorized(_ what: String) -> Failure {
        Failure(status: 403, code: 401, name: "NotAuthorized", message: "not allowed to \(what)")
    }

    func decode<T: Decodable>(_ type: T.Type, _ request: HTTPRequest) throws(Failure) -> T {
        do {
            return try JSONDecoder().decode(T.self, from: Data(request.body.isEmpty ? Array("{}".utf8) : request.body))
        } catch {
            throw Failure(status: 400, code: 400, name: "BadRequest", message: "invalid JSON body: \(Self.describe(error))")
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

    func json<T: Encodable>(_ value: T, status: Int = 200) -> HTTPResponse {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let body = (try? encoder.encode(value)).map { Array($0) } ?? []
        return HTTPResponse(status: status, body: body)
    }

    func handle(_ request: HTTPRequest, from caller: Caller) -> HTTPResponse {
        do throws(Failure) {
            return try route(request, caller)
        } catch {
            return Self.failure(error.status, error.code, error.name, error.message)
        }
    }

    // MARK: Routes

    func route(_ request: HTTPRequest, _ caller: Caller) throws(Failure) -> HTTPResponse {
        let parts = request.path.split(separator: "/").map(String.init)
        guard parts.first == "v1" else { throw unknownRoute(request) }
        let rest = Array(parts.dropFirst())
        switch (request.method, rest.count, rest.first) {
        case ("GET", 1, "status"):
            return json(status())
        case ("GET", 1, "accounts"):
            return json(engine.accounts().map(AccountView.init))
        case ("POST", 1, "accounts"):
            guard caller.isAdmin else { throw Self.notAuthorized("enroll accounts") }
            return try enroll(try decode(EnrollRequest.self, request))
        case ("GET", 2, "accounts"):
            return try run { () throws(EngineError) in json(AccountView(try engine.account(rest[1]))) }
        case ("POST", 3, "accounts") where rest[2] == "lock":
            try authorize(caller, forAccount: rest[1], "lock \(rest[1])")
            return try run { () throws(EngineError) in
                try engine.lock(rest[1])
                return json(LockView(identity: rest[1], status: try engine.lockStatus(rest[1])))
            }
        case ("POST", 3, "accounts") where rest[2] == "unlock":
            try authorize(caller, forAccount: rest[1], "unlock \(rest[1])")
            let body = try decode(UnlockRequest.self, request)
            return try run { () throws(EngineError) in
                let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                try engine.unlock(rest[1], passphrase: passphrase)
                return json(LockView(identity: rest[1], status: try engine.lockStatus(rest[1])))
            }
        case ("POST", 3, "accounts") where rest[2] == "wipe":
            guard caller.isAdmin else { throw Self.notAuthorized("wipe \(rest[1])") }
            return try wipe(rest[1])
        case ("DELETE", 2, "accounts"):
            guard caller.isAdmin else { throw Self.notAuthorized("deregister \(rest[1])") }
            if request.query["wipe"] == "true" { return try wipe(rest[1]) }
            return try run { () throws(EngineError) in
                try engine.deregister(rest[1], wipe: false)
                return HTTPResponse(status: 204, body: [])
            }
        case ("PUT", 3, "accounts") where rest[2] == "policy":
            guard caller.isAdmin else { throw Self.notAuthorized("change the policy of \(rest[1])") }
            let policy = try decode(Policy.self, request)
            return try run { () throws(EngineError) in json(AccountView(try engine.setPolicy(rest[1], policy))) }
        case ("GET", 3, "accounts") where rest[2] == "policy":
            return try run { () throws(EngineError) in
                let account = try engine.account(rest[1])
                guard let policy = account.policy else { throw .notEnrolled(account.upn) }
                return json(policy)
            }
        case ("POST", 1, "lock"):
            guard caller.isAdmin else { throw Self.notAuthorized("lock every account") }
            engine.lockAll()
            return json(status())
        case ("POST", 1, "unlock"):
            guard caller.isAdmin else { throw Self.notAuthorized("unlock every account") }
            let needPassphrase = engine.unlockAll()
            return json(["stillLocked": needPassphrase])
        case ("POST", 1, "bindings"):
            let body = try decode(BindRequest.self, request)
            return try bind(body, caller)
        case ("DELETE", 2, "bindings"):
            guard let pid = Int32(rest[1]) else { throw Failure(status: 400, code: 400, name: "BadRequest", message: "not a process ID: \(rest[1])") }
            try authorizeProcess(caller, pid, "unbind process \(pid)")
            return try run { () throws(EngineError) in
                try engine.unbindProcess(pid)
                return HTTPResponse(status: 204, body: [])
            }
        case ("GET", 3, "processes") where rest[2] == "identity":
            guard let pid = Int32(rest[1]) else { throw Failure(status: 400, code: 400, name: "BadRequest", message: "not a process ID: \(rest[1])") }
            let processes = LinuxProcessTable()
            guard processes.startTime(of: pid) != nil else { throw Self.failure(.noSuchProcess(pid)) }
            let resolved = engine.resolve(thread: pid, uid: processes.uid(of: pid) ?? 0)
            return json(IdentityView(pid: pid, identity: resolved.identity, source: resolved.source.description))
        default:
            if ["status", "accounts", "lock", "unlock", "bindings", "processes"].contains(rest.first ?? "") {
                throw Failure(status: 405, code: 405, name: "MethodNotAllowed", message: "\(request.method) is not served on \(request.path)")
            }
            throw unknownRoute(request)
        }
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

    func status() -> StatusView {
        StatusView(version: Self.version, accounts: engine.accounts().map { account in
            var view = AccountView(account)
            if account.isEnrolled { view.lock = (try? engine.lockStatus(account.id))?.name }
            return view
        })
    }

    func enroll(_ body: EnrollRequest) throws(Failure) -> HTTPResponse {
        try run { () throws(EngineError) in
            let account: Account
            if body.enroll ?? true {
                let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
                account = try engine.enroll(id: body.id, upn: body.upn, policy: body.policy ?? Policy(), passphrase: passphrase, uid: body.uid)
            } else {
                account = try engine.register(id: body.id, upn: body.upn, uid: body.uid)
            }
            return json(AccountView(account), status: 201)
        }
    }

    /// Wipes an identity: keys destroyed first, then its files deleted, then it is deregistered.
    func wipe(_ identity: String) throws(Failure) -> HTTPResponse {
        let started = engine.events.events().last?.sequence ?? 0
        return try run { () throws(EngineError) in
            let account = try engine.account(identity)
            try engine.deregister(identity, wipe: true)
            let events = engine.events.events(after: started).filter { $0.kind == .wipeProgress && $0.identity == account.upn }
            let progress = events.last { $0.details["scanned"] != nil }
            let keys = events.first { $0.details["keysDestroyedSeconds"] != nil }?.details["keysDestroyedSeconds"]
            return json(WipeView(identity: account.upn, code: 104, result: "UnenrollmentSuccess",
                                 keysDestroyedSeconds: keys.flatMap(Double.init) ?? 0,
                                 scanned: Int(progress?.details["scanned"] ?? "0") ?? 0,
                                 deleted: Int(progress?.details["deleted"] ?? "0") ?? 0,
                                 bytesFreed: UInt64(progress?.details["bytesFreed"] ?? "0") ?? 0))
        }
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
}

struct UnlockRequest: Decodable { var passphrase: String? }

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
    var reprotectPending: Bool
    var lock: String?

    init(_ account: Account) {
        id = account.id
        upn = account.upn
        enrolled = account.isEnrolled
        policy = account.policy
        uid = account.uid
        hasPassphrase = account.hasPassphrase
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
    var accounts: [AccountView]
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

extension LockStatus {
    var name: String {
        switch self {
        case .unlocked: return "unlocked"
        case .locking: return "locking"
        case .locked: return "locked"
        }
    }
}
