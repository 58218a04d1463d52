import CustodyAPI
import CustodyCore
import FoundationEssentials

// One identity on several hosts over the socket: this host's receiving key, an identity's keys
// sealed to another host's, and an import of such an export. Administrators only (see
// `Engine.exportIdentity`, `Engine.importIdentity`).
extension ControlAPI {
    static func hostKey(_ body: ExportIdentityRequest) throws(Failure) -> [UInt8] {
        try publicKey(body.hostKey, field: "hostKey")
    }

    func hostKey() throws(Failure) -> HTTPResponse {
        try run { () throws(EngineError) in
            let key = try engine.hostKey()
            return json(CustodyHostKey(publicKey: Data(key.publicKey).base64EncodedString(), fingerprint: key.fingerprint))
        }
    }

    func exportIdentity(_ identity: String, _ body: ExportIdentityRequest) throws(Failure) -> HTTPResponse {
        let recipient = try Self.hostKey(body)
        return try run { () throws(EngineError) in
            let export = try engine.exportIdentity(identity, to: recipient)
            return json(CustodyIdentityExport(export))
        }
    }

    /// The account with its new generation of keys (`keyGenerations`); its files are brought to
    /// them in the background (`reprotectPending` until then).
    func rotateKeys(_ identity: String) throws(Failure) -> HTTPResponse {
        try run { () throws(EngineError) in json(CustodyAccount(try engine.rotateKeys(identity))) }
    }

    /// 201 and the account when it was enrolled; 200 and the account when it is enrolled here
    /// with those keys already, or was with earlier generations of them and has the new ones now
    /// (`keyGenerations` says how many it has); with `checking`, 204 when it would change.
    func importIdentity(_ body: ImportIdentityRequest, checking: Bool) throws(Failure) -> HTTPResponse {
        let uid = try Self.localUser(uid: body.uid, user: body.user)
        let policy = try body.policy.map { (document) throws(Failure) in try Self.policy(document) }
        let export = IdentityExport(body.export)
        return try run { () throws(EngineError) in
            let passphrase = try body.passphrase.map { (text) throws(EngineError) in try Self.secret(text) }
            switch try engine.importIdentity(export, passphrase: passphrase, policy: policy, uid: uid, checking: checking) {
            case .imported(let account?): return json(CustodyAccount(account), status: 201)
            case .imported(nil): return HTTPResponse(status: 204, body: [])
            case .alreadyHere(let account), .rotated(let account?): return json(CustodyAccount(account))
            case .rotated(nil): return HTTPResponse(status: 204, body: [])
            }
        }
    }
}
