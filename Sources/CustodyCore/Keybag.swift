import CustodyCrypto
import CustodyFormat
import CustodySystem
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
    /// By Apple's letter: "A", "B", "C", "D" (`self[.complete]` and so on in code).
    var classes: [String: WrappedKey]
    /// Classes A, B (private) and C wrapped once more, under the owner's login password (see
    /// `KeyProtector`); nil when there is none.
    var loginProtector: KeyProtector?
    /// The same, under the identity's recovery key (see `RecoveryKey`); nil when there is none.
    var recoveryProtector: KeyProtector?
    /// The ID of the machine key that wraps `machineSecret`; nil in keybags made before machine
    /// secrets, which use the state directory's `machine.key` directly as their secret.
    var machineKeyID: String?
    /// This keybag's machine secret, wrapped by the machine key. Every other wrap derives from it
    /// (not from the machine key), so moving to a new machine key rewraps only this.
    var machineSecret: Data?
    /// The passphrase's gate in the TPM (see `PassphraseGates.swift`); nil without one.
    var passphraseGate: Data?
    /// What the account was when it was deregistered with its keys kept: enrolling it again
    /// without naming a policy (or a user) restores these. Nil while it is enrolled.
    var kept: KeptAccount?
    /// Later generations of class keys (`Engine.rotateKeys`), oldest first; nil before the
    /// first rotation. `classes` stays the generation every protector wraps.
    var generations: [KeyGeneration]?
    /// The generation new files get: 0 is `classes`, n is `generations[n - 1]`; nil is 0.
    var currentGeneration: Int?
}

extension StoredKeybag {
    /// The wrapped keys of every generation: `classes` by letter, then each later generation's.
    var allWrappedKeys: [WrappedKey] {
        func sorted(_ classes: [String: WrappedKey]) -> [WrappedKey] { classes.keys.sorted().compactMap { classes[$0] } }
        return sorted(classes) + (generations ?? []).flatMap { sorted($0.classes) }
    }
}

/// A later generation of an identity's class keys: A, B (its private key; its public key in
/// clear, as in `classes`), C and D, each wrapped under a key derived from the key of its class
/// in the keybag's `classes`, so that each is there exactly when that one is: D from the start,
/// C from the first unlock, A and B while unlocked. The protectors (passphrase, login password,
/// recovery key, TPM gates) need no change when a generation is added.
struct KeyGeneration: Codable, Equatable {
    var classes: [String: StoredKeybag.WrappedKey]
    /// Wall-clock seconds since 1970.
    var made: Double
}

/// An account's policy and local user, kept with its sealed keys across a deregistration.
struct KeptAccount: Codable, Equatable {
    var policy: Policy
    var uid: UInt32?
}

/// Another way to unlock an identity: its class keys wrapped under a key derived from a secret
/// (Argon2id, a salt of its own) and the keybag's machine secret. The login protector's secret
/// is its local user's login password (as pam_fscrypt's); the recovery protector's is the
/// recovery key. The passphrase stays as it was.
struct KeyProtector: Codable, Equatable {
    var uid: UInt32
    var salt: Data
    var parameters: Argon2Parameters
    var classes: [String: StoredKeybag.WrappedKey]
    /// True for a recovery protector that needs no machine key: derived from the recovery key
    /// alone (about 133 bits, beyond guessing) and wrapping class D too, so that it still opens
    /// the identity when the machine key is lost (a cleared TPM).
    var independent: Bool?
    /// The login password's gate in the TPM; nil without one.
    var gate: Data?

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

/// Creating, unwrapping and rewrapping keybags.
enum Keybags {
    static let userInfo = Array("custody/v1/keybag-user".utf8)
    static let machineInfo = Array("custody/v1/keybag-machine".utf8)
    static let recoveryInfo = Array("custody/v2/keybag-recovery".utf8)
    static let machineSecretInfo = Array("custody/v2/keybag-machine-secret".utf8)

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

    /// The key that wraps classes A, B (private) and C: from the keybag's machine secret and,
    /// when set, the passphrase. With no machine secret (an independent recovery protector), from
    /// the passphrase alone.
    static func userKey(_ stored: StoredKeybag, machineSecret: SecretBytes?, passphrase: SecretBytes?) throws(EngineError) -> AESGCMKey {
        do {
            guard let machineSecret else {
                guard let parameters = stored.passphrase, let passphrase else { throw EngineError.passphraseRequired(stored.identity) }
                let stretched = try Argon2id.derive(passphrase: passphrase, parameters: parameters)
                return try AESGCMKey(try HKDF.derive(.sha256, key: stretched, salt: Array(stored.salt), info: recoveryInfo, count: 32))
            }
            var material = machineSecret
            if let parameters = stored.passphrase {
                guard let passphrase else { throw EngineError.passphraseRequired(stored.identity) }
                let stretched = try Argon2id.derive(passphrase: passphrase, parameters: parameters)
                material = try SecretBytes(count: machineSecret.count + stretched.count)
                try material.withUnsafeMutableBytes { (out) throws(CryptoError) in
                    machineSecret.withUnsafeBytes { out.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                    stretched.withUnsafeBytes { (out.baseAddress! + machineSecret.count).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
                }
            }
            return try AESGCMKey(try HKDF.derive(.sha256, key: material, salt: Array(stored.salt), info: userInfo, count: 32))
        } catch {
            throw EngineError(mixing: error)
        }
    }

    /// The key that wraps class D: the machine secret alone (so class D needs no unlock, and
    /// wiping the keybag makes it unreadable at once).
    static func classDKey(_ stored: StoredKeybag, machineSecret: SecretBytes) throws(EngineError) -> AESGCMKey {
        do {
            return try AESGCMKey(try HKDF.derive(.sha256, key: machineSecret, salt: Array(stored.salt), info: machineInfo, count: 32))
        } catch {
            throw .crypto(error)
        }
    }

    /// The keybag's machine secret wrapped by machine key `machine` (bound to the identity and
    /// the key's ID).
    static func bind(_ stored: StoredKeybag, secret: SecretBytes, to machine: (id: String, key: SecretBytes)) throws(EngineError) -> StoredKeybag {
        var updated = stored
        do {
            let kek = try AESGCMKey(try HKDF.derive(.sha256, key: machine.key, salt: Array(stored.salt), info: machineSecretInfo, count: 32))
            updated.machineSecret = Data(try machineSecretContext(stored.identity, machine.id).withBytes { (aad) throws(CryptoError) in
                try KeyWrap.wrap(secret, with: kek, context: aad)
            })
        } catch {
            throw .crypto(error)
        }
        updated.machineKeyID = machine.id
        return updated
    }

    /// The keybag's machine secret, given the machine key it names (the machine key itself for
    /// keybags made before machine secrets).
    static func machineSecret(_ stored: StoredKeybag, machine: (id: String, key: SecretBytes), file: String) throws(EngineError) -> SecretBytes {
        guard let wrapped = stored.machineSecret else { return machine.key }
        do {
            let kek = try AESGCMKey(try HKDF.derive(.sha256, key: machine.key, salt: Array(stored.salt), info: machineSecretInfo, count: 32))
            return try Array(wrapped).withBytes { (w) throws(CryptoError) in
                try machineSecretContext(stored.identity, machine.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
            }
        } catch .authenticationFailed {
            throw .corruptState(file: file, reason: "its machine secret does not unwrap with machine key \(machine.id)")
        } catch {
            throw .crypto(error)
        }
    }

    static func machineSecretContext(_ identity: String, _ machineKeyID: String) -> [UInt8] {
        Array("custody/v2/machine-secret|\(identity)|\(machineKeyID)".utf8)
    }

    /// Binds a wrap to its identity, class and key ID, so that wraps cannot be moved between slots.
    static func context(_ identity: String, _ slot: ProtectionClass, _ id: Data) -> [UInt8] {
        Array("custody/v1/keybag|\(identity)|\(slot.letter)|".utf8) + Array(id)
    }

    static func wrap(_ key: SecretBytes, identity: String, _ slot: ProtectionClass, id: Data, with kek: AESGCMKey) throws(EngineError) -> Data {
        do {
            return Data(try context(identity, slot, id).withBytes { (aad) throws(CryptoError) in try KeyWrap.wrap(key, with: kek, context: aad) })
        } catch {
            throw .crypto(error)
        }
    }

    static func unwrap(_ wrapped: StoredKeybag.WrappedKey?, identity: String, _ slot: ProtectionClass, with kek: AESGCMKey, file: String) throws(EngineError) -> SecretBytes {
        guard let wrapped else { throw .corruptState(file: file, reason: "class \(slot.letter) key is missing") }
        let bytes = Array(wrapped.wrapped)
        do {
            return try bytes.withBytes { (w) throws(CryptoError) in
                try context(identity, slot, wrapped.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
            }
        } catch {
            throw .crypto(error)
        }
    }

    /// A new keybag with fresh class keys (or `given` ones: an identity imported from another
    /// host) and a fresh machine secret bound to `machine`, and those keys unwrapped.
    static func create(identity: String, passphrase: SecretBytes?, cost: String, machine: (id: String, key: SecretBytes),
                       given: TransferredClassKeys? = nil) throws(EngineError)
        -> (StoredKeybag, ClassKeys, ClassKeyEntry, (id: [UInt8], publicKey: [UInt8]), SecretBytes) {
        do {
            var stored = StoredKeybag(identity: identity, salt: Data(try Random.bytes(16)),
                                      passphrase: passphrase == nil ? nil : try parameters(for: cost), classes: [:])
            let secret = try SecretBytes.random(count: 32)
            stored = try bind(stored, secret: secret, to: machine)
            let user = try userKey(stored, machineSecret: secret, passphrase: passphrase)
            let machine = try Keybags.classDKey(stored, machineSecret: secret)
            var keys = ClassKeys()
            var classD: ClassKeyEntry?
            for slot in [ProtectionClass.complete, .untilFirstAuthentication, .none] {
                let (id, key): (Data, SecretBytes)
                if let given = given?.symmetric[slot] {
                    (id, key) = (Data(given.id), given.key)
                } else {
                    (id, key) = (Data(try Random.bytes(FileHeader.classKeyIDSize)), try SecretBytes.random(count: 32))
                }
                stored[slot] = .init(id: id, wrapped: try wrap(key, identity: identity, slot, id: id, with: slot == .none ? machine : user))
                let entry = ClassKeyEntry(id: Array(id), key: try AESGCMKey(key))
                switch slot {
                case .complete: keys.complete = entry
                case .untilFirstAuthentication: keys.untilFirstAuthentication = entry
                default: classD = entry
                }
            }
            let bID: Data, bPrivate: SecretBytes
            if let given {
                (bID, bPrivate) = (Data(given.classB.id), given.classB.privateKey)
            } else {
                (bID, bPrivate) = (Data(try Random.bytes(FileHeader.classKeyIDSize)), try X25519.generatePrivateKey())
            }
            let bPublic = try X25519.publicKey(for: bPrivate)
            stored[.completeUnlessOpen] = .init(id: bID, wrapped: try wrap(bPrivate, identity: identity, .completeUnlessOpen, id: bID, with: user), publicKey: Data(bPublic))
            keys.completeUnlessOpenPrivate = bPrivate
            guard let classD else { throw EngineError.crypto(.library("class D key was not made")) }
            return (stored, keys, classD, (id: Array(bID), publicKey: bPublic), secret)
        } catch {
            throw EngineError(mixing: error)
        }
    }

    // MARK: Generations

    static let generationInfo = Array("custody/v1/keybag-generation".utf8)

    /// The key a later generation's key of `slot` is wrapped under: derived from the secret of
    /// the key of that class in `classes` (class B: its private key).
    static func generationKEK(_ stored: StoredKeybag, root: SecretBytes) throws(EngineError) -> AESGCMKey {
        do {
            return try AESGCMKey(try HKDF.derive(.sha256, key: root, salt: Array(stored.salt), info: generationInfo, count: 32))
        } catch {
            throw .crypto(error)
        }
    }

    /// Binds a generation's wrap to its identity, class and key ID (as `context` does for `classes`).
    static func generationContext(_ identity: String, _ slot: ProtectionClass, _ id: Data) -> [UInt8] {
        Array("custody/v1/keybag-generation|\(identity)|\(slot.letter)|".utf8) + Array(id)
    }

    /// A generation of the four keys `keys` (A, C and D by class; B's private key), wrapped under
    /// `root`, the secrets of the keybag's `classes` generation by class (B: its private key).
    static func generation(of keys: TransferredClassKeys, in stored: StoredKeybag, root: [ProtectionClass: SecretBytes],
                           made: Double) throws(EngineError) -> KeyGeneration {
        var classes: [String: StoredKeybag.WrappedKey] = [:]
        for slot in IdentityTransfer.keyOrder {
            guard let rootSecret = root[slot] else { throw .corruptState(file: stored.identity, reason: "class \(slot.letter) key is not unlocked") }
            let kek = try generationKEK(stored, root: rootSecret)
            let (id, secret) = slot == .completeUnlessOpen ? (keys.classB.id, keys.classB.privateKey) : (keys.symmetric[slot]?.id ?? [], keys.symmetric[slot]?.key)
            guard let secret, id.count == FileHeader.classKeyIDSize else { throw .crypto(.library("class \(slot.letter) key is missing")) }
            do {
                let wrapped = try generationContext(stored.identity, slot, Data(id)).withBytes { (aad) throws(CryptoError) in
                    try KeyWrap.wrap(secret, with: kek, context: aad)
                }
                let publicKey = slot == .completeUnlessOpen ? Data(try X25519.publicKey(for: secret)) : nil
                classes[String(slot.letter)] = .init(id: Data(id), wrapped: Data(wrapped), publicKey: publicKey)
            } catch {
                throw .crypto(error)
            }
        }
        return KeyGeneration(classes: classes, made: made)
    }

    /// The secrets of the `classes` generation by class (class B: its private key), as later
    /// generations are wrapped under them; nil unless all four are held.
    static func rootSecrets(_ unlocked: ClassKeys, classD: ClassKeyEntry) -> [ProtectionClass: SecretBytes]? {
        guard let a = unlocked.complete, let b = unlocked.completeUnlessOpenPrivate, let c = unlocked.untilFirstAuthentication else { return nil }
        return [.complete: a.key.secret, .completeUnlessOpen: b, .untilFirstAuthentication: c.key.secret, .none: classD.key.secret]
    }

    /// A new keybag (`classes` = `imported`'s first generation, unwrapped as `unlocked` and
    /// `classD`) with `imported`'s later generations and its current one.
    static func withGenerations(_ stored: StoredKeybag, unlocked: ClassKeys, classD: ClassKeyEntry,
                                _ imported: TransferredKeys) throws(EngineError) -> StoredKeybag {
        guard let root = rootSecrets(unlocked, classD: classD) else { throw .corruptState(file: stored.identity, reason: "class keys are not unlocked") }
        guard imported.generations.indices.contains(imported.current) else {
            throw .identityExportInvalid("its current generation \(imported.current) is not one of its \(imported.generations.count)")
        }
        var updated = stored
        updated.generations = []
        for generation in imported.generations.dropFirst() {
            updated.generations?.append(try Keybags.generation(of: generation, in: stored, root: root, made: wallClockSeconds()))
        }
        updated.currentGeneration = imported.current
        return updated
    }

    /// One key of a later generation, unwrapped with the secret of its class's key in `classes`.
    static func unwrapGeneration(_ generation: KeyGeneration, _ slot: ProtectionClass, root: SecretBytes, in stored: StoredKeybag,
                                 file: String) throws(EngineError) -> (id: [UInt8], secret: SecretBytes) {
        guard let wrapped = generation.classes[String(slot.letter)], wrapped.id.count == FileHeader.classKeyIDSize else {
            throw .corruptState(file: file, reason: "a generation's class \(slot.letter) key is missing")
        }
        let kek = try generationKEK(stored, root: root)
        do {
            let secret = try Array(wrapped.wrapped).withBytes { (w) throws(CryptoError) in
                try generationContext(stored.identity, slot, wrapped.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
            }
            return (Array(wrapped.id), secret)
        } catch .authenticationFailed {
            throw .corruptState(file: file, reason: "a generation's class \(slot.letter) key does not unwrap")
        } catch {
            throw .crypto(error)
        }
    }

    /// One class key unwrapped, with its ID.
    static func unwrapKey(_ stored: StoredKeybag, _ slot: ProtectionClass, with kek: AESGCMKey, file: String) throws(EngineError) -> ClassKeyEntry {
        guard let wrapped = stored[slot] else { throw .corruptState(file: file, reason: "class \(slot.letter) key is missing") }
        let secret = try unwrap(wrapped, identity: stored.identity, slot, with: kek, file: file)
        do { return ClassKeyEntry(id: Array(wrapped.id), key: try AESGCMKey(secret)) } catch { throw .crypto(error) }
    }

    /// Unwraps classes A, B (private) and C. A wrong passphrase fails the first unwrap.
    static func unlock(_ stored: StoredKeybag, machineSecret: SecretBytes?, passphrase: SecretBytes?, file: String) throws(EngineError) -> ClassKeys {
        try unlock(stored, with: try userKey(stored, machineSecret: machineSecret, passphrase: passphrase), file: file)
    }

    static func unlock(_ stored: StoredKeybag, with user: AESGCMKey, file: String) throws(EngineError) -> ClassKeys {
        var keys = ClassKeys()
        do {
            keys.untilFirstAuthentication = try unwrapKey(stored, .untilFirstAuthentication, with: user, file: file)
        } catch .crypto(.authenticationFailed) {
            throw stored.passphrase == nil ? .corruptState(file: file, reason: "class keys do not unwrap with this machine key")
                                           : .wrongPassphrase(stored.identity)
        }
        do {
            keys.complete = try unwrapKey(stored, .complete, with: user, file: file)
            keys.completeUnlessOpenPrivate = try unwrap(stored[.completeUnlessOpen], identity: stored.identity, .completeUnlessOpen, with: user, file: file)
        } catch .crypto(.authenticationFailed) {
            throw .corruptState(file: file, reason: "class A or B key does not unwrap")
        }
        return keys
    }

    static func unlockMachineClass(_ stored: StoredKeybag, machineSecret: SecretBytes, file: String) throws(EngineError) -> ClassKeyEntry {
        let machine = try Keybags.classDKey(stored, machineSecret: machineSecret)
        do {
            return try unwrapKey(stored, .none, with: machine, file: file)
        } catch .crypto(.authenticationFailed) {
            throw .corruptState(file: file, reason: "class D key does not unwrap with this machine key")
        }
    }

    /// A protector for `keys` under `password` (fresh salt and parameters), bound to the
    /// keybag's machine secret; with `independentOf` class D instead (no machine secret), one
    /// that needs nothing but `password` and also holds class D.
    static func protector(_ stored: StoredKeybag, keys: ClassKeys, password: SecretBytes, uid: UInt32, cost: String,
                          machineSecret: SecretBytes?, independentWith classD: ClassKeyEntry? = nil,
                          file: String) throws(EngineError) -> KeyProtector {
        var view = stored
        let parameters = try Self.parameters(for: cost)
        do { view.salt = Data(try Random.bytes(16)) } catch { throw .crypto(error) }
        view.passphrase = parameters
        let user = try userKey(view, machineSecret: classD == nil ? machineSecret : nil, passphrase: password)
        let wrapped = try rewrapped(view, keys: keys, with: user, file: file)
        var classes: [String: StoredKeybag.WrappedKey] = [:]
        for slot in [ProtectionClass.complete, .completeUnlessOpen, .untilFirstAuthentication] {
            classes[String(slot.letter)] = wrapped[slot]
        }
        if let classD, let dStored = stored[.none] {
            classes[String(ProtectionClass.none.letter)] = .init(id: dStored.id, wrapped: try wrap(classD.key.secret, identity: stored.identity, .none, id: dStored.id, with: user))
        }
        return KeyProtector(uid: uid, salt: view.salt, parameters: parameters, classes: classes, independent: classD == nil ? nil : true)
    }

    /// The same class keys wrapped under a new passphrase (or none). Needs them unwrapped.
    static func rewrap(_ stored: StoredKeybag, keys: ClassKeys, newPassphrase: SecretBytes?, cost: String, machineSecret: SecretBytes?, file: String) throws(EngineError) -> StoredKeybag {
        var updated = stored
        updated.passphrase = newPassphrase == nil ? nil : try parameters(for: cost)
        return try rewrapped(updated, keys: keys, with: try userKey(updated, machineSecret: machineSecret, passphrase: newPassphrase), file: file)
    }

    /// Classes A, B (private) and C wrapped under `user`.
    static func rewrapped(_ stored: StoredKeybag, keys: ClassKeys, with user: AESGCMKey, file: String) throws(EngineError) -> StoredKeybag {
        var updated = stored
        guard let a = keys.complete, let c = keys.untilFirstAuthentication, let b = keys.completeUnlessOpenPrivate,
              let aStored = stored[.complete], let bStored = stored[.completeUnlessOpen], let cStored = stored[.untilFirstAuthentication] else {
            throw .corruptState(file: file, reason: "class keys are not unlocked")
        }
        updated[.complete] = .init(id: aStored.id, wrapped: try wrap(a.key.secret, identity: stored.identity, .complete, id: aStored.id, with: user))
        updated[.completeUnlessOpen] = .init(id: bStored.id, wrapped: try wrap(b, identity: stored.identity, .completeUnlessOpen, id: bStored.id, with: user),
                                             publicKey: bStored.publicKey)
        updated[.untilFirstAuthentication] = .init(id: cStored.id, wrapped: try wrap(c.key.secret, identity: stored.identity, .untilFirstAuthentication, id: cStored.id, with: user))
        return updated
    }
}

extension Engine {
    /// Writes a keybag and keeps it in memory; the account's flags (passphrase, protectors) are
    /// what the keybag holds. The keybag is bound to the current machine key first.
    /// Keybag writes take `keybagWrites`, not the engine's lock (every CREATE waits on that one,
    /// and a write costs two disk `fsync`s): a machine key migration running at the same time
    /// takes it too, so neither writes over the other with an older copy.
    func saveKeybag(_ stored: StoredKeybag, of account: Account) throws(EngineError) {
        let key = account.key
        try keybagWrites.withLock { (_) throws(EngineError) in
            var stored = stored
            if let current = try? machineKeys.current(), stored.machineKeyID != current.id || stored.machineSecret == nil,
               let secret = state.withLock({ $0.keys[key]?.machineSecret }) {
                stored = try Keybags.bind(stored, secret: secret, to: current)
            }
            try files.write(stored, to: files.keybagName(account.id))
            let accounts = state.withLock { state -> OrderedStateFile<AccountsFile>.Snapshot? in
                state.keys[key]?.stored = stored
                guard let index = state.accounts.firstIndex(where: { $0.matches(account.id) }) else { return nil }
                state.accounts[index].hasPassphrase = stored.passphrase != nil
                state.accounts[index].hasLoginProtector = stored.loginProtector != nil
                state.accounts[index].hasRecoveryKey = stored.recoveryProtector != nil
                return accountsSnapshot(state)
            }
            if let accounts { try files.save(accounts) }
        }
    }
}
