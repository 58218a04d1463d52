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
    /// Class D: from the start (it needs only the machine secret).
    var classD: ClassKeyEntry
    var classBPublic: (id: [UInt8], publicKey: [UInt8])
    /// Class A and the class B private key: only while unlocked (or in the grace period).
    var classA: ClassKeyEntry?
    var classBPrivate: SecretBytes?
    /// Class C: from the first unlock until the daemon stops.
    var classC: ClassKeyEntry?
    /// The key of the identity's names (`NameCipher`), derived from class C: held as long as it is.
    var nameKey: NameKey?
    var lock: Lock = .locked
    /// Wrong passphrases (or login passwords) in a row, and when the next attempt may be made.
    var failures = 0
    var retryAt: Double = 0

    /// The keyring of a stored keybag at start: class D unwrapped with the machine secret, class
    /// B's public key; locked.
    static func load(_ stored: StoredKeybag, machineSecret: SecretBytes, file: String) throws(EngineError) -> Keyring {
        guard let b = stored[.completeUnlessOpen], let publicKey = b.publicKey, publicKey.count == 32 else {
            throw .corruptState(file: file, reason: "class B public key is missing")
        }
        let d = try Keybags.unlockMachineClass(stored, machineSecret: machineSecret, file: file)
        return Keyring(stored: stored, machineSecret: machineSecret, classD: d, classBPublic: (Array(b.id), Array(publicKey)))
    }

    /// Takes the unwrapped class keys of an unlock: unlocked, attempts forgotten.
    mutating func install(_ unlocked: ClassKeys) {
        classA = unlocked.complete
        classBPrivate = unlocked.completeUnlessOpenPrivate
        classC = unlocked.untilFirstAuthentication
        if let classC, nameKey == nil { nameKey = try? NameKey(deriving: classC.key.secret) }
        lock = .unlocked
        failures = 0
        retryAt = 0
    }

    /// The class keys held now (all three only while unlocked).
    var unlockedClassKeys: ClassKeys {
        ClassKeys(complete: classA, completeUnlessOpenPrivate: classBPrivate, untilFirstAuthentication: classC)
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
