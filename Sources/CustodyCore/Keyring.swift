import CustodyCrypto
import CustodyFormat

/// One identity's keys as the engine holds them: its stored keybag (the wrapped class keys and
/// every protector: passphrase, login password, recovery key, TPM gates), the class keys
/// unwrapped now, its lock state and its unlock attempts. The engine keeps one per enrolled
/// identity (`Engine.State.keys`); locking, unlocking, protectors and recovery change it under
/// the engine's lock (`Locking.swift`, `LoginProtectors.swift`, `Recovery.swift`,
/// `UnlockAttempts.swift`), and `Keybags` (`Keybag.swift`) does the wrapping.
struct Keyring {
    enum Lock: Equatable { case locked, unlocked, locking(until: Double) }

    var stored: StoredKeybag
    /// The keybag's machine secret (unwrapped with the machine key at start): every wrap derives from it.
    var machineSecret: SecretBytes
    /// Every generation of class keys, unwrapped as far as the lock state allows: the keybag's
    /// `classes` first (the one its protectors wrap), then its later `generations` in order.
    /// Each opens the files it encrypted; new files get `current`'s.
    var generations: [GenerationKeys]
    /// The generation new files get (`StoredKeybag.currentGeneration`).
    var current: Int
    var lock: Lock = .locked
    /// Wrong passphrases (or login passwords) in a row, and when the next attempt may be made.
    var failures = 0
    var retryAt: Double = 0

    /// Class D of the generation new files get: from the start (it needs only the machine secret).
    var classD: ClassKeyEntry { generations[current].d }
    var classBPublic: (id: [UInt8], publicKey: [UInt8]) { generations[current].bPublic }
    /// Class A and the class B private key: only while unlocked (or in the grace period).
    var classA: ClassKeyEntry? { generations[current].a }
    var classBPrivate: SecretBytes? { generations[current].bPrivate }
    /// Class C: from the first unlock until the daemon stops.
    var classC: ClassKeyEntry? { generations[current].c }
    /// The key of the identity's new names (`NameCipher`), derived from class C: held as long as it is.
    var nameKey: NameKey? { generations[current].nameKey }
    /// The class D key the protectors' keybag holds (`classes`): what a recovery protector wraps.
    var rootClassD: ClassKeyEntry { generations[0].d }

    /// The keyring of a stored keybag at start: every generation's class D unwrapped with the
    /// machine secret, their class B public keys; locked.
    static func load(_ stored: StoredKeybag, machineSecret: SecretBytes, file: String) throws(EngineError) -> Keyring {
        guard let b = stored[.completeUnlessOpen], let publicKey = b.publicKey, publicKey.count == 32 else {
            throw .corruptState(file: file, reason: "class B public key is missing")
        }
        let d = try Keybags.unlockMachineClass(stored, machineSecret: machineSecret, file: file)
        var generations = [GenerationKeys(d: d, bPublic: (Array(b.id), Array(publicKey)))]
        for generation in stored.generations ?? [] {
            let (id, secret) = try Keybags.unwrapGeneration(generation, .none, root: d.key.secret, in: stored, file: file)
            guard let later = generation.classes[String(ProtectionClass.completeUnlessOpen.letter)], let laterPublic = later.publicKey,
                  laterPublic.count == 32 else {
                throw .corruptState(file: file, reason: "a generation's class B public key is missing")
            }
            do {
                generations.append(GenerationKeys(d: ClassKeyEntry(id: id, key: try AESGCMKey(secret)), bPublic: (Array(later.id), Array(laterPublic))))
            } catch {
                throw .crypto(error)
            }
        }
        let current = stored.currentGeneration ?? 0
        guard generations.indices.contains(current) else {
            throw .corruptState(file: file, reason: "its current generation \(current) is not one of its \(generations.count)")
        }
        return Keyring(stored: stored, machineSecret: machineSecret, generations: generations, current: current)
    }

    /// Takes the unwrapped class keys of an unlock (those of `classes`), and unwraps every later
    /// generation's with them: unlocked, attempts forgotten. A later generation that does not
    /// unwrap keeps its class D only (its files fail to open as locked ones do).
    mutating func install(_ unlocked: ClassKeys) {
        generations[0].install(a: unlocked.complete, bPrivate: unlocked.completeUnlessOpenPrivate, c: unlocked.untilFirstAuthentication)
        for (index, generation) in (stored.generations ?? []).enumerated() where generations.indices.contains(index + 1) {
            func unwrap(_ slot: ProtectionClass, _ root: SecretBytes?) -> (id: [UInt8], secret: SecretBytes)? {
                guard let root else { return nil }
                return try? Keybags.unwrapGeneration(generation, slot, root: root, in: stored, file: stored.identity)
            }
            func entry(_ slot: ProtectionClass, _ root: ClassKeyEntry?) -> ClassKeyEntry? {
                unwrap(slot, root?.key.secret).flatMap { found in (try? AESGCMKey(found.secret)).map { ClassKeyEntry(id: found.id, key: $0) } }
            }
            generations[index + 1].install(a: entry(.complete, unlocked.complete),
                                           bPrivate: unwrap(.completeUnlessOpen, unlocked.completeUnlessOpenPrivate)?.secret,
                                           c: entry(.untilFirstAuthentication, unlocked.untilFirstAuthentication))
        }
        lock = .unlocked
        failures = 0
        retryAt = 0
    }

    /// Classes A and B (private) of every generation go: the identity is locked.
    mutating func dropCompleteClasses() {
        for index in generations.indices {
            generations[index].a = nil
            generations[index].bPrivate = nil
        }
    }

    /// The class keys the protectors wrap (those of `classes`), held now (all three only while unlocked).
    var unlockedClassKeys: ClassKeys {
        ClassKeys(complete: generations[0].a, completeUnlessOpenPrivate: generations[0].bPrivate, untilFirstAuthentication: generations[0].c)
    }

    /// The key of `protectionClass` whose ID is `id`, in whichever generation has it; nil when
    /// none does or the lock state withholds it.
    func key(_ protectionClass: ProtectionClass, id: [UInt8]) -> GenerationKeys? {
        generations.first { $0.id(of: protectionClass) == id }
    }

    /// The name keys of the generations new names do not get (held as their class C is).
    var earlierNameKeys: [NameKey] {
        generations.indices.filter { $0 != current }.compactMap { generations[$0].nameKey }
    }

    /// The name keys of every generation, the current one first.
    var nameKeys: [NameKey] { [nameKey].compactMap { $0 } + earlierNameKeys }

    /// Every generation's keys as they travel (`IdentityTransfer`), `classes` first; nil unless
    /// all are unlocked.
    var transferable: [TransferredClassKeys]? {
        var all: [TransferredClassKeys] = []
        for generation in generations {
            guard let a = generation.a, let c = generation.c, let b = generation.bPrivate else { return nil }
            all.append(TransferredClassKeys(symmetric: [.complete: (a.id, a.key.secret), .untilFirstAuthentication: (c.id, c.key.secret),
                                                        .none: (generation.d.id, generation.d.key.secret)],
                                            classB: (generation.bPublic.id, b)))
        }
        return all
    }
}

/// One generation of an identity's class keys, as far as the lock state has them unwrapped.
struct GenerationKeys {
    var d: ClassKeyEntry
    var bPublic: (id: [UInt8], publicKey: [UInt8])
    var a: ClassKeyEntry?
    var bPrivate: SecretBytes?
    var c: ClassKeyEntry?
    /// Derived from `c` when it first appears.
    var nameKey: NameKey?

    mutating func install(a: ClassKeyEntry?, bPrivate: SecretBytes?, c: ClassKeyEntry?) {
        self.a = a
        self.bPrivate = bPrivate
        self.c = c
        if let c, nameKey == nil { nameKey = try? NameKey(deriving: c.key.secret) }
    }

    /// The ID of this generation's key of `protectionClass`.
    func id(of protectionClass: ProtectionClass) -> [UInt8]? {
        switch protectionClass {
        case .none: return d.id
        case .completeUnlessOpen: return bPublic.id
        case .untilFirstAuthentication: return c?.id
        case .complete: return a?.id
        }
    }
}

/// A class key unwrapped, with the ID its files' headers name.
struct ClassKeyEntry {
    let id: [UInt8]
    let key: AESGCMKey
}

/// Classes A, B (private) and C unwrapped in memory: what an unlock yields and a rewrap needs.
struct ClassKeys {
    var complete: ClassKeyEntry?
    var completeUnlessOpenPrivate: SecretBytes?
    var untilFirstAuthentication: ClassKeyEntry?

    var isComplete: Bool { complete != nil && completeUnlessOpenPrivate != nil && untilFirstAuthentication != nil }
}

extension StoredKeybag {
    /// The wrapped key of a class (the file keeps Apple's letters, A–D, as its keys).
    subscript(_ protectionClass: ProtectionClass) -> WrappedKey? {
        get { classes[String(protectionClass.letter)] }
        set { classes[String(protectionClass.letter)] = newValue }
    }
}
