import CustodyCrypto
import CustodySystem
import FoundationEssentials
import Glibc
import Synchronization

/// Where a machine key is kept: a 0600 file in the state directory, or sealed to the machine's
/// TPM 2.0 (then it exists in the clear only in secure memory).
public enum MachineKeyStore: String, Codable, Sendable, CaseIterable { case file, tpm2 }

/// The configured choice (`machine-key`): `auto` seals new keys to the TPM when there is one.
public enum MachineKeyMode: String, Codable, Sendable, CaseIterable { case auto, file, tpm2 }

/// Why a machine key cannot be had; the reason is for people (it names the cause and the way out).
public struct MachineKeyProblem: Error, Equatable, Sendable {
    public var reason: String
    public init(_ reason: String) { self.reason = reason }
}

/// Seals machine keys to hardware. The engine knows no TPM: the daemon gives it one of these.
public protocol MachineKeySealer: Sendable {
    /// For messages and the status: "TPM 2.0 (device:/dev/tpmrm0)".
    var description: String { get }
    /// Seals `key`, bound to `pcrs`; what it returns is kept in the state directory.
    func seal(_ key: SecretBytes, pcrs: [Int]) throws(MachineKeyProblem) -> Data
    func unseal(_ sealed: Data, pcrs: [Int]) throws(MachineKeyProblem) -> SecretBytes
    /// A gate for a passphrase: an object that opens only with `authorization`, where every
    /// wrong one counts against the hardware's dictionary-attack lockout. Nil when the hardware
    /// has none.
    func makeGate(authorization: SecretBytes) -> Data?
    /// Tries a gate with `authorization`.
    func openGate(_ gate: Data, authorization: SecretBytes) -> GateAnswer
    /// The dictionary-attack counter, for the status.
    var dictionaryAttack: DictionaryAttackState? { get }
}

extension MachineKeySealer {
    public func makeGate(authorization: SecretBytes) -> Data? { nil }
    public func openGate(_ gate: Data, authorization: SecretBytes) -> GateAnswer { .unusable("no gates here") }
    public var dictionaryAttack: DictionaryAttackState? { nil }
}

/// What a passphrase gate said.
public enum GateAnswer: Equatable, Sendable {
    case open
    /// A wrong secret; the hardware counted it.
    case wrong
    /// The hardware refuses every attempt for now (its dictionary-attack lockout).
    case lockedOut(retryAfterSeconds: Double)
    /// The gate cannot be used (another TPM, no TPM): it is ignored and made again.
    case unusable(String)
}

/// The TPM's dictionary-attack counter: failures counted, the lockout threshold, and the
/// seconds after which one failure is forgotten.
public struct DictionaryAttackState: Codable, Equatable, Sendable {
    public var failures: Int
    public var maxTries: Int
    public var intervalSeconds: Int
    public init(failures: Int, maxTries: Int, intervalSeconds: Int) {
        self.failures = failures
        self.maxTries = maxTries
        self.intervalSeconds = intervalSeconds
    }
}

/// The machine keys of a state directory. Normally one; during a migration (or after a key was
/// lost and replaced) also the older ones that keybags still name, until nothing names them.
///
/// Files: `machine-keys/ID.key` (file store: 32 bytes, 0600), `machine-keys/ID.json` (TPM store:
/// the sealed object), `machine-key.json` (which one new keybags use), and `machine.key` (the
/// single key of state directories made before the others existed; keybags that name no key
/// use it).
final class MachineKeys: @unchecked Sendable {
    struct Entry {
        var id: String
        var store: MachineKeyStore
        /// The state-relative file it lives in.
        var file: String
        var pcrs: [Int]
        var key: SecretBytes?
        var problem: String?
    }

    struct SealedFile: Codable {
        var version = 1
        var id: String
        var store = MachineKeyStore.tpm2
        var pcrs: [Int]
        var sealed: Data
    }

    struct Pointer: Codable {
        var version = 1
        var current: String
    }

    static let legacyFile = "machine.key"
    static let directory = "machine-keys"
    static let pointerFile = "machine-key.json"
    static let idInfo = Array("custody/v1/machine-key-id".utf8)

    let files: StateFiles
    let sealer: MachineKeySealer?
    private let state: Mutex<(entries: [String: Entry], current: String?)>

    /// Loads every machine key of the state directory. One that cannot be had (no TPM, another
    /// TPM, changed PCRs) is kept with its problem; what depends on it fails with that reason.
    init(files: StateFiles, sealer: MachineKeySealer?) throws(EngineError) {
        self.files = files
        self.sealer = sealer
        try files.makeDirectory(Self.directory)
        var entries: [String: Entry] = [:]
        if let bytes = try files.readBytes(Self.legacyFile) {
            let key = try Self.fileKey(bytes, path: files.path(Self.legacyFile))
            let id = try Self.fingerprint(key)
            entries[id] = Entry(id: id, store: .file, file: Self.legacyFile, pcrs: [], key: key)
        }
        for name in files.list(Self.directory).sorted() where !name.contains(".tmp-") {
            let relative = Self.directory + "/" + name
            if name.hasSuffix(".key"), let bytes = try files.readBytes(relative) {
                let key = try Self.fileKey(bytes, path: files.path(relative))
                let id = try Self.fingerprint(key)
                guard name == id + ".key" else { throw .corruptState(file: files.path(relative), reason: "holds machine key \(id), not \(name)") }
                entries[id] = Entry(id: id, store: .file, file: relative, pcrs: [], key: key)
            } else if name.hasSuffix(".json"), let sealed = try files.read(SealedFile.self, from: relative) {
                var entry = Entry(id: sealed.id, store: sealed.store, file: relative, pcrs: sealed.pcrs)
                if let sealer {
                    do throws(MachineKeyProblem) {
                        let key = try sealer.unseal(sealed.sealed, pcrs: sealed.pcrs)
                        if (try? Self.fingerprint(key)) == sealed.id { entry.key = key } else { entry.problem = "\(sealer) unsealed a different key than machine key \(sealed.id)" }
                    } catch {
                        entry.problem = error.reason
                    }
                } else {
                    entry.problem = "machine key \(sealed.id) is sealed to a TPM, and no TPM is configured (machine-key = \"file\", or no TPM at the configured TCTI)"
                }
                entries[sealed.id] = entry
            }
        }
        var current = try files.read(Pointer.self, from: Self.pointerFile)?.current
        if current == nil, entries.count == 1 { current = entries.keys.first }
        if let id = current, entries[id] == nil {
            throw .corruptState(file: files.path(Self.pointerFile), reason: "names machine key \(id), which is not in \(files.path(Self.directory))")
        }
        state = Mutex((entries, current))
    }

    static func fileKey(_ bytes: [UInt8], path: String) throws(EngineError) -> SecretBytes {
        guard bytes.count == 32 else { throw .corruptState(file: path, reason: "\(bytes.count) bytes, a machine key has 32") }
        if let attributes = try? Syscall.lstat(path), attributes.st_mode & 0o077 != 0 {
            throw .corruptState(file: path, reason: "group or others can read it (mode \(String(attributes.st_mode & 0o777, radix: 8))); it must be 0600")
        }
        do { return try bytes.withBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) } } catch { throw .crypto(error) }
    }

    /// A machine key's ID: 8 bytes of HKDF of the key (names it without revealing it).
    static func fingerprint(_ key: SecretBytes) throws(EngineError) -> String {
        do {
            let derived = try HKDF.derive(.sha256, key: key, salt: [], info: idInfo, count: 8)
            return derived.withUnsafeBytes { hexString($0) }
        } catch {
            throw .crypto(error)
        }
    }

    /// The key new keybags use, or why there is none.
    var currentID: String? { state.withLock { $0.current } }

    /// How many machine keys the state directory holds (more than one only during a move, or
    /// while keybags still name a lost key).
    var count: Int { state.withLock { $0.entries.count } }

    /// The IDs of every machine key the state directory holds.
    func ids() -> [String] { state.withLock { $0.entries.keys.sorted() } }

    /// Where the current key is kept.
    var currentStore: MachineKeyStore? { state.withLock { state in state.current.flatMap { state.entries[$0]?.store } } }

    func current() throws(EngineError) -> (id: String, key: SecretBytes) {
        guard let id = currentID else { throw .machineKeyUnavailable("this state directory has no machine key") }
        return try key(id)
    }

    /// The key with `id` (nil: the key of keybags that name none, `machine.key`).
    func key(_ id: String?) throws(EngineError) -> (id: String, key: SecretBytes) {
        try state.withLock { (state) throws(EngineError) -> (id: String, key: SecretBytes) in
            let entry = id.flatMap { state.entries[$0] } ?? (id == nil ? state.entries.values.first { $0.file == Self.legacyFile } : nil)
            guard let entry else {
                throw .machineKeyUnavailable("machine key \(id ?? Self.legacyFile) is not in this state directory (it was copied without it, or the key was destroyed)")
            }
            guard let key = entry.key else { throw .machineKeyUnavailable(entry.problem ?? "machine key \(entry.id) cannot be had") }
            return (entry.id, key)
        }
    }

    /// Makes a new machine key in `store` (bound to `pcrs` in a TPM), writes it, and makes it
    /// the current one. Nothing is rewrapped here (see `Engine.finishMachineKeyMigration`).
    @discardableResult
    func create(_ store: MachineKeyStore, pcrs: [Int]) throws(EngineError) -> (id: String, key: SecretBytes) {
        let key: SecretBytes
        do { key = try SecretBytes.random(count: 32) } catch { throw .crypto(error) }
        let id = try Self.fingerprint(key)
        var entry = Entry(id: id, store: store, file: "", pcrs: store == .tpm2 ? pcrs.sorted() : [], key: key)
        switch store {
        case .file:
            entry.file = Self.directory + "/" + id + ".key"
            try files.writeBytes(key.withUnsafeBytes { Array($0) }, to: entry.file, mode: 0o600)
        case .tpm2:
            guard let sealer else { throw .machineKeyUnavailable("machine-key = \"tpm2\", and no TPM answers") }
            let sealed: Data
            do { sealed = try sealer.seal(key, pcrs: entry.pcrs) } catch { throw .machineKeyUnavailable(error.reason) }
            entry.file = Self.directory + "/" + id + ".json"
            try files.write(SealedFile(id: id, pcrs: entry.pcrs, sealed: sealed), to: entry.file)
        }
        try files.write(Pointer(current: id), to: Self.pointerFile)
        state.withLock { state in
            state.entries[id] = entry
            state.current = id
        }
        return (id, key)
    }

    /// Destroys every key other than the current one that no keybag names (`referenced`, with
    /// nil for keybags that name none).
    func dropUnreferenced(_ referenced: Set<String?>) throws(EngineError) {
        let drop = state.withLock { state in
            state.entries.values.filter { entry in
                entry.id != state.current && !referenced.contains(entry.id) && !(entry.file == Self.legacyFile && referenced.contains(nil))
            }
        }
        for entry in drop {
            try files.seal?.dropWrap(of: entry.id)
            try files.destroy(entry.file)
            _ = state.withLock { $0.entries.removeValue(forKey: entry.id) }
        }
    }

    /// What the status shows (without the TPM's counter: that is a round trip to the TPM, which
    /// `Engine.machineKeyStatus` makes outside any lock).
    var status: MachineKeyStatus {
        state.withLock { state in
            let current = state.current.flatMap { state.entries[$0] }
            return MachineKeyStatus(store: current?.store, id: current?.id, pcrs: current?.pcrs ?? [], tpm: sealer?.description,
                                    problem: current == nil ? "no machine key" : current?.problem,
                                    keys: state.entries.values.sorted { $0.id < $1.id }.map {
                                        .init(id: $0.id, store: $0.store, current: $0.id == state.current, available: $0.key != nil, problem: $0.problem)
                                    })
        }
    }
}

/// The machine key as the status shows it.
public struct MachineKeyStatus: Codable, Equatable, Sendable {
    public struct Key: Codable, Equatable, Sendable {
        public var id: String
        public var store: MachineKeyStore
        public var current: Bool
        public var available: Bool
        public var problem: String?
    }

    /// Where the current key is kept (nil: none).
    public var store: MachineKeyStore?
    public var id: String?
    public var pcrs: [Int]
    /// The TPM the daemon uses, when it has one.
    public var tpm: String?
    /// The TPM's dictionary-attack counter (wrong passphrases count there too).
    public var dictionaryAttack: DictionaryAttackState?
    /// Why the current key cannot be had.
    public var problem: String?
    /// Every key of the state directory (more than one only during a migration or after a loss).
    public var keys: [Key]
    /// A warning for the administrator (a key kept in a file).
    public var warning: String?
    /// Identities whose keys need a machine key that cannot be had (recover them with their recovery keys).
    public var stranded: [String] = []
}
