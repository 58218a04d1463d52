import CustodyAPI
import CustodyCore
import FoundationEssentials

// Recovery keys over the socket: create (optionally escrowed to an administrator's public key),
// remove, and recover (unlock, and reset the passphrase). An account's owner or an administrator.




extension ControlAPI {
    static func escrowKey(_ body: RecoveryKeyRequest) throws(Failure) -> [UInt8]? {
        try body.escrowPublicKey.map { (text) throws(Failure) in try publicKey(text, field: "escrowPublicKey") }
    }

    /// An X25519 public key a body gives in `field`: 32 bytes in base64.
    static func publicKey(_ text: String, field: String) throws(Failure) -> [UInt8] {
        guard let key = Data(base64Encoded: text), key.count == 32 else { throw badRequest("\(field) must be 32 bytes in base64") }
        return Array(key)
    }

    func createRecoveryKey(_ identity: String, _ body: RecoveryKeyRequest) throws(Failure) -> HTTPResponse {
        let escrowTo = try Self.escrowKey(body)
        if body.show == false, escrowTo == nil { throw Self.badRequest("show false needs an escrowPublicKey: the key would be lost") }
        return try run { () throws(EngineError) in
            let (key, escrow) = try engine.createRecoveryKey(identity, escrowTo: escrowTo)
            let account = try engine.account(identity)
            return json(RecoveryKeyCreated(identity: account.upn, recoveryKey: body.show == false ? nil : key.printable, escrow: escrow.map { RecoveryEscrow($0) }), status: 201)
        }
    }

    func removeRecoveryKey(_ identity: String) throws(Failure) -> HTTPResponse {
        return try run { () throws(EngineError) in
            try engine.removeRecoveryKey(identity)
            return HTTPResponse(status: 204, body: [])
        }
    }

    func recover(_ identity: String, _ body: RecoverRequest) throws(Failure) -> HTTPResponse {
        return try run { () throws(EngineError) in
            let key = try RecoveryKey(parsing: body.recoveryKey)
            let passphrase = try body.newPassphrase.map { (text) throws(EngineError) in try Self.secret(text) }
            try engine.recover(identity, with: key, newPassphrase: passphrase, removePassphrase: body.removePassphrase ?? false)
            return json(CustodyAccount(try engine.account(identity)))
        }
    }
}
