import CustodyCrypto
import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

/// The state key: seals every state file that names an identity (`accounts.json`, the keybags,
/// wipe journals, `bindings.json`, `attempts.json`, `holders.json`), so that a copy of the disk
/// without the machine key learns no identity from the state directory either (`format.md`,
/// "The state directory").
///
/// The key itself is in `state-key.json`, wrapped by each machine key and by each recovery key
/// made since (Argon2id of the recovery key, as the keybag's recovery protector): whoever can open
/// the keybags can open the state, and nobody else. When no machine key opens it (a cleared TPM,
/// another machine's TPM) the state is *sealed*: its accounts are unknown, to the daemon as to a
/// thief, until a recovery key opens it (`Engine.recover`).
///
/// State files keep their names (`accounts.json`); keybags and wipe journals are named by a
/// keyed hash of the identity (`name(of:in:)`), so that a name cannot be tested against a guess.
final class StateSeal: @unchecked Sendable {
    struct KeyFile: Codable {
        var version = 1
        /// Names the state key without revealing it.
        var id: String
        /// The state key wrapped by each machine key, by machine key ID.
        var machineKeys: [String: Data] = [:]
        /// The state key wrapped by recovery keys.
        var recovery: [RecoveryWrap] = []
    }

    struct RecoveryWrap: Codable {
        /// Which identity's recovery key: a keyed hash only the state key links to it.
        var handle: String
        var parameters: Argon2Parameters
        var wrapped: Data
    }

    /// A sealed state file: `box` is `nonce (12) ‖ ciphertext ‖ tag (16)` of the file's JSON,
    /// with `custody/v1/state|KEY ID|NAME` as associated data (a file moved to another name, or
    /// into another state directory, does not open).
    struct Envelope: Codable {
        var sealedState: Int
        var key: String
        var box: Data
    }

    static let keyFile = "state-key.json"
    static let idInfo = Array("custody/v1/state-key-id".utf8)
    static let machineInfo = Array("custody/v1/state-key|machine".utf8)
    static let recoveryInfo = Array("custody/v1/state-key|recovery".utf8)

    /// The state files sealed under the state key (names relative to the state directory).
    static func isSealed(_ name: String) -> Bool {
        name.hasPrefix("keybags/") || name.hasPrefix("wipes/")
            || ["accounts.json", "bindings.json", "attempts.json", "holders.json"].contains(name)
    }

    private struct Held {
        var id: String
        var secret: SecretBytes
        var aead: AESGCMKey
    }

    private struct Inner {
        var file: KeyFile?
        var held: Held?
        /// Why the state key cannot be had (nil when it is held, or there is none yet).
        var reason: String?
    }

    private let files: StateFiles
    private let inner = Mutex(Inner())

    init(directory: String) { files = StateFiles(directory: directory, seal: nil) }

    /// Opens the state key with a machine key, or makes one (sealed to the current machine key)
    /// when the state directory has none yet.
    func load(_ machineKeys: MachineKeys) throws(EngineError) {
        guard let file = try files.read(KeyFile.self, from: Self.keyFile) else {
            guard let current = try? machineKeys.current() else {
                inner.withLock { $0.reason = "there is no machine key to seal the state with" }
                return
            }
            let secret: SecretBytes
            do { secret = try SecretBytes.random(count: 32) } catch { throw .crypto(error) }
            let held = try Self.held(secret)
            var made = KeyFile(id: held.id)
            made.machineKeys[current.id] = try Self.machineWrap(held, machineKey: current)
            try files.write(made, to: Self.keyFile)
            inner.withLock { $0 = Inner(file: made, held: held, reason: nil) }
            return
        }
        var reasons: [String] = []
        for (id, wrapped) in file.machineKeys.sorted(by: { $0.key < $1.key }) {
            let machine: (id: String, key: SecretBytes)
            do { machine = try machineKeys.key(id) } catch {
                if case .machineKeyUnavailable(let reason) = error { reasons.append(reason) }
                continue
            }
            let kek: AESGCMKey
            let secret: SecretBytes
            do {
                kek = try Self.machineKEK(machine.key)
                secret = try Array(wrapped).withBytes { (w) throws(CryptoError) in
                    try Self.context(file.id, "machine", machine.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
                }
            } catch {
                throw .corruptState(file: files.path(Self.keyFile), reason: "its wrap under machine key \(machine.id) does not open (\(error))")
            }
            let held = try Self.held(secret)
            guard held.id == file.id else { throw .corruptState(file: files.path(Self.keyFile), reason: "it holds another state key than \(file.id)") }
            inner.withLock { $0 = Inner(file: file, held: held, reason: nil) }
            return
        }
        let reason = "the state directory is sealed under machine key\(file.machineKeys.count == 1 ? "" : "s") "
            + file.machineKeys.keys.sorted().joined(separator: ", ") + ", which cannot be had"
            + (reasons.isEmpty ? "" : " (" + reasons.joined(separator: "; ") + ")")
        inner.withLock { $0 = Inner(file: file, held: nil, reason: reason) }
    }

    /// Why the state cannot be opened: nil when it can (or has never been sealed).
    var sealedReason: String? { inner.withLock { $0.held == nil && $0.file != nil ? $0.reason : nil } }

    /// The state key's ID, when it is held.
    var keyID: String? { inner.withLock { $0.held?.id } }

    // MARK: Files

    func seal(_ bytes: [UInt8], name: String) throws(EngineError) -> [UInt8] {
        let (held, reason) = inner.withLock { ($0.held, $0.reason) }
        guard let held else { throw .machineKeyUnavailable("\(files.path(name)) cannot be written: \(reason ?? "the state key cannot be had")") }
        var box = [UInt8](repeating: 0, count: AESGCMKey.nonceSize + bytes.count + AESGCMKey.tagSize)
        do {
            try box.withMutableBytes { (out) throws(CryptoError) in
                guard let base = out.baseAddress else { return }
                let nonce = UnsafeMutableRawBufferPointer(start: base, count: AESGCMKey.nonceSize)
                try Random.fill(nonce)
                try Self.fileContext(held.id, name).withBytes { (aad) throws(CryptoError) in
                    try bytes.withBytes { (plain) throws(CryptoError) in
                        try held.aead.seal(nonce: UnsafeRawBufferPointer(nonce), aad: aad, plaintext: plain,
                                           ciphertext: base + AESGCMKey.nonceSize, tag: base + AESGCMKey.nonceSize + bytes.count)
                    }
                }
            }
        } catch {
            throw .crypto(error)
        }
        return try Self.encode(Envelope(sealedState: 1, key: held.id, box: Data(box)), name: files.path(name))
    }

    /// The file's JSON: opened when it is sealed, as it is when it is not (a state directory
    /// written before sealing; it is sealed at the next start that holds the key).
    func open(_ bytes: [UInt8], name: String) throws(EngineError) -> [UInt8] {
        guard let envelope = Self.envelope(bytes) else { return bytes }
        let (held, reason) = inner.withLock { ($0.held, $0.reason) }
        guard let held else { throw .machineKeyUnavailable("\(files.path(name)) cannot be read: \(reason ?? "the state key cannot be had")") }
        guard envelope.key == held.id else {
            throw .corruptState(file: files.path(name), reason: "it is sealed under state key \(envelope.key), not this state directory's (\(held.id))")
        }
        let box = Array(envelope.box)
        let overhead = AESGCMKey.nonceSize + AESGCMKey.tagSize
        guard box.count >= overhead else { throw .corruptState(file: files.path(name), reason: "its sealed box is \(box.count) bytes, shorter than \(overhead)") }
        let length = box.count - overhead
        var plain = [UInt8](repeating: 0, count: length)
        do {
            try box.withBytes { (sealed) throws(CryptoError) in
                guard let base = sealed.baseAddress else { return }
                try Self.fileContext(held.id, name).withBytes { (aad) throws(CryptoError) in
                    try plain.withMutableBytes { (out) throws(CryptoError) in
                        // An empty plaintext has no address of its own: one scratch byte stands in.
                        var scratch: UInt8 = 0
                        try withUnsafeMutableBytes(of: &scratch) { (spare) throws(CryptoError) in
                            guard let target = out.baseAddress ?? spare.baseAddress else { throw .authenticationFailed }
                            try held.aead.open(nonce: UnsafeRawBufferPointer(start: base, count: AESGCMKey.nonceSize), aad: aad,
                                               ciphertext: UnsafeRawBufferPointer(start: base + AESGCMKey.nonceSize, count: length),
                                               tag: base + AESGCMKey.nonceSize + length, plaintext: target)
                        }
                    }
                }
            }
        } catch {
            throw .corruptState(file: files.path(name), reason: "it does not authenticate under the state key (changed, or moved from another name)")
        }
        return plain
    }

    /// Whether `bytes` are a sealed file.
    static func envelope(_ bytes: [UInt8]) -> Envelope? {
        // Plain state files never have a `sealedState` key.
        guard bytes.count > 16 else { return nil }
        return try? JSONDecoder().decode(Envelope.self, from: Data(bytes))
    }

    /// The name of an identity's file in `directory` (`keybags`, `wipes`): a keyed hash of the
    /// identity under the state key; before the state directory had one, a plain hash.
    func name(of identity: String, in directory: String) -> String {
        guard let keyed = keyedHash("custody/v1/state-name|", of: identity) else { return Self.legacyName(of: identity, in: directory) }
        return directory + "/" + keyed + ".json"
    }

    /// 16 bytes of HKDF-SHA256(state key, `label` ‖ the case-folded identity), in hex; nil while
    /// the state key is not held.
    private func keyedHash(_ label: String, of identity: String) -> String? {
        guard let held = inner.withLock({ $0.held }),
              let keyed = try? HKDF.derive(.sha256, key: held.secret, salt: [], info: Array(label.utf8) + Array(IdentityKey(identity).folded.utf8), count: 16)
        else { return nil }
        return keyed.withUnsafeBytes { hexString($0) }
    }

    /// The name an identity's file had before the state was sealed (a plain hash of it).
    static func legacyName(of identity: String, in directory: String) -> String {
        let digest = Array(IdentityKey(identity).folded.utf8).withUnsafeBytes { sha256($0) }
        return directory + "/" + hexString(digest.prefix(16)) + ".json"
    }

    // MARK: Wraps

    /// Wraps the state key under `machine` too (a new machine key: a migration, a reset).
    func wrap(under machine: (id: String, key: SecretBytes)) throws(EngineError) {
        guard let (held, file) = inner.withLock({ state in state.held.flatMap { held in state.file.map { (held, $0) } } }),
              file.machineKeys[machine.id] == nil else { return }
        var updated = file
        updated.machineKeys[machine.id] = try Self.machineWrap(held, machineKey: machine)
        try files.write(updated, to: Self.keyFile)
        inner.withLock { $0.file = updated }
    }

    /// Drops the wrap under a machine key that is being destroyed.
    func dropWrap(of machineKeyID: String) throws(EngineError) {
        guard var file = inner.withLock({ $0.file }), file.machineKeys[machineKeyID] != nil, file.machineKeys.count > 1 else { return }
        file.machineKeys[machineKeyID] = nil
        try files.write(file, to: Self.keyFile)
        inner.withLock { $0.file = file }
    }

    /// Which recovery wrap is `identity`'s.
    func recoveryHandle(of identity: String) -> String? { keyedHash("custody/v1/recovery-handle|", of: identity) }

    /// Whether `identity`'s recovery key opens the state too.
    func hasRecoveryWrap(of identity: String) -> Bool {
        guard let handle = recoveryHandle(of: identity) else { return false }
        return inner.withLock { $0.file?.recovery.contains { $0.handle == handle } } == true
    }

    /// Wraps the state key under `identity`'s recovery key (replacing its earlier one).
    func addRecoveryWrap(of identity: String, recoveryKey: SecretBytes, cost: String) throws(EngineError) {
        guard let held = inner.withLock({ $0.held }), let handle = recoveryHandle(of: identity) else { return }
        let parameters = try Keybags.parameters(for: cost)
        let wrapped: [UInt8]
        do {
            let kek = try Self.recoveryKEK(recoveryKey, parameters)
            wrapped = try Self.context(held.id, "recovery", handle).withBytes { (aad) throws(CryptoError) in try KeyWrap.wrap(held.secret, with: kek, context: aad) }
        } catch {
            throw .crypto(error)
        }
        try updateFile { file in
            file.recovery.removeAll { $0.handle == handle }
            file.recovery.append(RecoveryWrap(handle: handle, parameters: parameters, wrapped: Data(wrapped)))
        }
    }

    /// Drops `identity`'s recovery wrap (its recovery key removed, the identity wiped).
    func removeRecoveryWrap(of identity: String) throws(EngineError) {
        guard hasRecoveryWrap(of: identity), let handle = recoveryHandle(of: identity) else { return }
        try updateFile { $0.recovery.removeAll { $0.handle == handle } }
    }

    /// Opens sealed state with a recovery key (one Argon2id per recovery wrap until one opens).
    /// Throws `wrongPassphrase` when none does.
    func open(withRecoveryKey recoveryKey: SecretBytes) throws(EngineError) {
        guard let file = inner.withLock({ $0.file }), inner.withLock({ $0.held }) == nil else { return }
        guard !file.recovery.isEmpty else {
            throw .machineKeyUnavailable((sealedReason ?? "the state directory is sealed") + ", and no recovery key was made that opens it: its identities are lost")
        }
        for wrap in file.recovery {
            let secret: SecretBytes
            do {
                let kek = try Self.recoveryKEK(recoveryKey, wrap.parameters)
                secret = try Array(wrap.wrapped).withBytes { (w) throws(CryptoError) in
                    try Self.context(file.id, "recovery", wrap.handle).withBytes { (aad) throws(CryptoError) in try KeyWrap.unwrap(w, with: kek, context: aad) }
                }
            } catch {
                continue
            }
            let held = try Self.held(secret)
            guard held.id == file.id else { continue }
            inner.withLock { $0.held = held; $0.reason = nil }
            return
        }
        throw .wrongPassphrase("recovery key (it opens none of the sealed state's recovery wraps)")
    }

    // MARK: Helpers

    private func updateFile(_ change: (inout KeyFile) -> Void) throws(EngineError) {
        guard var file = inner.withLock({ $0.file }) else { return }
        change(&file)
        try files.write(file, to: Self.keyFile)
        inner.withLock { $0.file = file }
    }

    private static func held(_ secret: SecretBytes) throws(EngineError) -> Held {
        do {
            let id = try HKDF.derive(.sha256, key: secret, salt: [], info: idInfo, count: 8).withUnsafeBytes { hexString($0) }
            return Held(id: id, secret: secret, aead: try AESGCMKey(secret))
        } catch {
            throw .crypto(error)
        }
    }

    private static func machineWrap(_ held: Held, machineKey: (id: String, key: SecretBytes)) throws(EngineError) -> Data {
        do {
            let kek = try machineKEK(machineKey.key)
            return Data(try context(held.id, "machine", machineKey.id).withBytes { (aad) throws(CryptoError) in try KeyWrap.wrap(held.secret, with: kek, context: aad) })
        } catch {
            throw .crypto(error)
        }
    }

    private static func machineKEK(_ machineKey: SecretBytes) throws(CryptoError) -> AESGCMKey {
        try AESGCMKey(try HKDF.derive(.sha256, key: machineKey, salt: [], info: machineInfo, count: 32))
    }

    private static func recoveryKEK(_ recoveryKey: SecretBytes, _ parameters: Argon2Parameters) throws(CryptoError) -> AESGCMKey {
        let stretched = try Argon2id.derive(passphrase: recoveryKey, parameters: parameters)
        return try AESGCMKey(try HKDF.derive(.sha256, key: stretched, salt: [], info: recoveryInfo, count: 32))
    }

    static func context(_ stateKeyID: String, _ kind: String, _ name: String) -> [UInt8] {
        Array("custody/v1/state-key|\(kind)|\(name)|\(stateKeyID)".utf8)
    }

    static func fileContext(_ stateKeyID: String, _ name: String) -> [UInt8] {
        Array("custody/v1/state|\(stateKeyID)|\(name)".utf8)
    }

    private static func encode<T: Encodable>(_ value: T, name: String) throws(EngineError) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        do { return Array(try encoder.encode(value)) } catch { throw .corruptState(file: name, reason: "cannot encode: \(error)") }
    }
}
