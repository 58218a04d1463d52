import CustodyCrypto
import CustodyFormat
import FoundationEssentials

/// An identity's class keys as stored: each wrapped, never in clear.
struct StoredKeybag: Codable, Equatable {
    struct WrappedKey: Codable, Equatable {
        var id: Data
        var wrapped: Data
        /// Class B only: the public key, stored in clear (files are created with it while locked).
        var publicKey: Data?
    }

    var version = 1
    /// The canonical identity this keybag belongs to (also bound into every wrap).
    var identity: String
    var salt: Data
    /// Argon2id parameters when the identity has a passphrase; nil when it unlocks on authorization alone.
    var passphrase: Argon2Parameters?
    /// "A", "B", "C", "D".
    var classes: [String: WrappedKey]
    /// Classes A, B (private) and C wrapped once more, under the owner's login password (see
    /// `KeyProtector`); nil when there is none.
    var loginProtector: KeyProtector?
    /// The same, under the identity's recovery key (see `RecoveryKey`); nil when there is none.
    var recoveryProtector: KeyProtector?
}

/// Another way to unlock an identity: its class keys wrapped under a key derived from a secret
/// (Argon2id, a salt of its own) and the machine key. The login protector's secret is its local
/// user's login password (as pam_fscrypt's); the recovery protector's is the recovery key. The
/// passphrase stays as it was.
struct KeyProtector: Codable, Equatable {
    var uid: UInt32
    var salt: Data
    var parameters: Argon2Parameters
    var classes: [String: StoredKeybag.WrappedKey]

    /// The protector as a keybag of its own, for the usual unlock and rewrap.
    func keybag(of stored: StoredKeybag) -> StoredKeybag {
        var view = stored
        view.salt = salt
        view.passphrase = parameters
        view.classes.merge(classes) { _, protected in protected }
        view.loginProtector = nil
        view.recoveryProtector = nil
        return view
    }
}

/// Class keys unwrapped in memory.
struct ClassKeys {
    var complete: (id: [UInt8], key: AESGCMKey)?
    var completeUnlessOpenPrivate: SecretBytes?
    var untilFirstAuthentication: (id: [UInt8], key: AESGCMKey)?
}

/// Creating, unwrapping and rewrapping keybags.
enum Keybags {
    static let userInfo = Array("custody/v1/keybag-user".utf8)
    static let machineInfo = Array("custody/v1/keybag-machine".utf8)

    static func parameters(for cost: String) throws(EngineError) -> Argon2Parameters {
        do {
            switch cost {
            case "moderate": return try Argon2Parameters.moderate()
            case "minimal":
                var parameters = try Argon2Parameters.interactive()
                parameters.opsLimit = 1
                parameters.memLimit = 8 << 20
                return parameters
            default: return try Argon2Parameters.interactive()
            }
        } catch {
            throw .crypto(error)
        }
    }

    /// The key that wraps classes A, B (private) and C: from the machine key and, when set, the passphrase.
    static func userKey(_ stored: StoredKeybag, machineKey: SecretBytes, passphrase: SecretBytes?) throws(EngineError) -> AESGCMKey {
        do {
            var material = machineKey
            if let parameters = stored.passphrase {
                guard let passphrase else { throw EngineError.passphraseRequired(stored.identity) }
                let stretched = try Argon2id.derive(passphrase: passphrase, parameters: parameters)
                material = try SecretBytes(count: machineKey.count + stretched.count)
                try material.withUnsafeMutableBytes { (out) throws(CryptoError) in
                    machineKey.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                    stretched.withUnsafeBytes { (out.baseAddress! + machineKey.count).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                }
            }
            return try AESGCMKey(try HKDF.derive(.sha256, key: material, salt: Array(stored.salt), info: userInfo, count: 32))
        } catch {
            throw EngineError(mixing: error)
        }
    }

    /// The key that wraps class D: the machine key alone (so class D needs no unlock, and wiping
    /// the keybag makes it unreadable at once).
    static func machineKey(_ stored: StoredKeybag, machineKey: SecretBytes) throws(EngineError) -> AESGCMKey {
        do {
            return try AESGCMKey(try HKDF.derive(.sha256, key: machineKey, salt: Array(stored.salt), info: machineInfo, count: 32))
        } catch {
            throw .crypto(error)
        }
    }

    /// Binds a wrap to its identity, class and key ID, so that wraps cannot be moved between slots.
    static func context(_ identity: String, _ letter: String, _ id: Data) -> [UInt8] {
        Array("custody/v1/keybag|\(identity)|\(letter)|".utf8) + Array(id)
    }

    static func wrap(_ key: SecretBytes, identity: String, letter: String, id: Data, with kek: AESGCMKey) throws(EngineError) -> Data {
        do {
            return Data(try context(identity, letter, id).withBytes { (aad) throws(CryptoError) in try KeyWrap.wrap(key, with: kek, context: aad) })
        } catch {
            throw .crypto(error)
        }
    }

    static func unwrap(_ wrapped: StoredKeybag.WrappedKey?, identity: String, letter: String, with kek: AESGCMKey, file: String) throws(EngineError) -> SecretBytes {
        guard let wrapped else { throw .corruptState(file: file, reason: "class \(letter) key is missing") }
        let bytes = Array(wrapped.wrapped)
        do {
            return try bytes.withBytes { (w) throws(CryptoError) in
                try context(identity, letter, wrapped.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
            }
        } catch {
            throw .crypto(error)
        }
    }

    /// A new keybag with fresh class keys, and those keys unwrapped.
    static func create(identity: String, passphrase: SecretBytes?, cost: String, machineKey: SecretBytes) throws(EngineError)
        -> (StoredKeybag, ClassKeys, (id: [UInt8], key: AESGCMKey), (id: [UInt8], publicKey: [UInt8])) {
        do {
            var stored = StoredKeybag(identity: identity, salt: Data(try Random.bytes(16)),
                                      passphrase: passphrase == nil ? nil : try parameters(for: cost), classes: [:])
            let user = try userKey(stored, machineKey: machineKey, passphrase: passphrase)
            let machine = try Keybags.machineKey(stored, machineKey: machineKey)
            var keys = ClassKeys()
            var classD: (id: [UInt8], key: AESGCMKey)?
            for letter in ["A", "C", "D"] {
                let id = Data(try Random.bytes(FileHeader.classKeyIDSize))
                let key = try SecretBytes.random(count: 32)
                stored.classes[letter] = .init(id: id, wrapped: try wrap(key, identity: identity, letter: letter, id: id, with: letter == "D" ? machine : user))
                let pair = (id: Array(id), key: try AESGCMKey(key))
                switch letter {
                case "A": keys.complete = pair
                case "C": keys.untilFirstAuthentication = pair
                default: classD = pair
                }
            }
            let bID = Data(try Random.bytes(FileHeader.classKeyIDSize))
            let bPrivate = try X25519.generatePrivateKey()
            let bPublic = try X25519.publicKey(for: bPrivate)
            stored.classes["B"] = .init(id: bID, wrapped: try wrap(bPrivate, identity: identity, letter: "B", id: bID, with: user), publicKey: Data(bPublic))
            keys.completeUnlessOpenPrivate = bPrivate
            guard let classD else { throw EngineError.crypto(.library("class D key was not made")) }
            return (stored, keys, classD, (id: Array(bID), publicKey: bPublic))
        } catch {
            throw EngineError(mixing: error)
        }
    }

    /// One class key unwrapped, with its ID.
    static func unwrapKey(_ stored: StoredKeybag, _ letter: String, with kek: AESGCMKey, file: String) throws(EngineError) -> (id: [UInt8], key: AESGCMKey) {
        guard let wrapped = stored.classes[letter] else { throw .corruptState(file: file, reason: "class \(letter) key is missing") }
        let secret = try unwrap(wrapped, identity: stored.identity, letter: letter, with: kek, file: file)
        do { return (Array(wrapped.id), try AESGCMKey(secret)) } catch { throw .crypto(error) }
    }

    /// Unwraps classes A, B (private) and C. A wrong passphrase fails the first unwrap.
    static func unlock(_ stored: StoredKeybag, machineKey: SecretBytes, passphrase: SecretBytes?, file: String) throws(EngineError) -> ClassKeys {
        let user = try userKey(stored, machineKey: machineKey, passphrase: passphrase)
        var keys = ClassKeys()
        do {
            keys.untilFirstAuthentication = try unwrapKey(stored, "C", with: user, file: file)
        } catch .crypto(.authenticationFailed) {
            throw stored.passphrase == nil ? .corruptState(file: file, reason: "class keys do not unwrap with this machine key")
                                           : .wrongPassphrase(stored.identity)
        }
        do {
            keys.complete = try unwrapKey(stored, "A", with: user, file: file)
            keys.completeUnlessOpenPrivate = try unwrap(stored.classes["B"], identity: stored.identity, letter: "B", with: user, file: file)
        } catch .crypto(.authenticationFailed) {
            throw .corruptState(file: file, reason: "class A or B key does not unwrap")
        }
        return keys
    }

    static func unlockMachineClass(_ stored: StoredKeybag, machineKey: SecretBytes, file: String) throws(EngineError) -> (id: [UInt8], key: AESGCMKey) {
        let machine = try Keybags.machineKey(stored, machineKey: machineKey)
        do {
            return try unwrapKey(stored, "D", with: machine, file: file)
        } catch .crypto(.authenticationFailed) {
            throw .corruptState(file: file, reason: "class D key does not unwrap with this machine key")
        }
    }

    /// A protector for `keys` under `password` (fresh salt and parameters).
    static func protector(_ stored: StoredKeybag, keys: ClassKeys, password: SecretBytes, uid: UInt32, cost: String,
                               machineKey: SecretBytes, file: String) throws(EngineError) -> KeyProtector {
        var view = stored
        do { view.salt = Data(try Random.bytes(16)) } catch { throw .crypto(error) }
        let wrapped = try rewrap(view, keys: keys, newPassphrase: password, cost: cost, machineKey: machineKey, file: file)
        guard let parameters = wrapped.passphrase else { throw .corruptState(file: file, reason: "no parameters for the login protector") }
        var classes: [String: StoredKeybag.WrappedKey] = [:]
        for letter in ["A", "B", "C"] { classes[letter] = wrapped.classes[letter] }
        return KeyProtector(uid: uid, salt: wrapped.salt, parameters: parameters, classes: classes)
    }

    /// The same class keys wrapped under a new passphrase (or none). Needs them unwrapped.
    static func rewrap(_ stored: StoredKeybag, keys: ClassKeys, newPassphrase: SecretBytes?, cost: String, machineKey: SecretBytes, file: String) throws(EngineError) -> StoredKeybag {
        var updated = stored
        updated.passphrase = newPassphrase == nil ? nil : try parameters(for: cost)
        let user = try userKey(updated, machineKey: machineKey, passphrase: newPassphrase)
        guard let a = keys.complete, let c = keys.untilFirstAuthentication, let b = keys.completeUnlessOpenPrivate,
              let aStored = stored.classes["A"], let bStored = stored.classes["B"], let cStored = stored.classes["C"] else {
            throw .corruptState(file: file, reason: "class keys are not unlocked")
        }
        updated.classes["A"] = .init(id: aStored.id, wrapped: try wrap(a.key.secret, identity: stored.identity, letter: "A", id: aStored.id, with: user))
        updated.classes["B"] = .init(id: bStored.id, wrapped: try wrap(b, identity: stored.identity, letter: "B", id: bStored.id, with: user), publicKey: bStored.publicKey)
        updated.classes["C"] = .init(id: cStored.id, wrapped: try wrap(c.key.secret, identity: stored.identity, letter: "C", id: cStored.id, with: user))
        return updated
    }
}
