/// Apple-style data protection classes, ordered from weakest to strongest.
public enum ProtectionClass: UInt8, Sendable, Codable, Comparable, CaseIterable, CustomStringConvertible {
    /// D: readable whenever the daemon runs; wrapped by the machine key only (so wipe is instant).
    case none = 0
    /// C: readable after the first unlock since the daemon started.
    case untilFirstAuthentication = 1
    /// B: files can be created while locked; open handles survive a lock.
    case completeUnlessOpen = 2
    /// A: readable and writable only while unlocked.
    case complete = 3

    public static func < (a: ProtectionClass, b: ProtectionClass) -> Bool { a.rawValue < b.rawValue }

    /// The short name used in config files, xattrs and the API.
    public var description: String {
        switch self {
        case .none: return "none"
        case .untilFirstAuthentication: return "untilFirstAuth"
        case .completeUnlessOpen: return "completeUnlessOpen"
        case .complete: return "complete"
        }
    }

    /// The letter of Apple's class names (A–D).
    public var letter: Character {
        switch self {
        case .complete: return "A"
        case .completeUnlessOpen: return "B"
        case .untilFirstAuthentication: return "C"
        case .none: return "D"
        }
    }

    /// Accepts Apple's constant names, the short forms, the class letters and the admin-console
    /// wording, case-insensitively.
    public init?(name: String) {
        let key = name.lowercased().filter { !$0.isWhitespace && $0 != "_" && $0 != "-" }
        switch key {
        case "nsfileprotectioncomplete", "complete", "a", "classa", "whendevicelocked", "whendeviceislocked":
            self = .complete
        case "nsfileprotectioncompleteunlessopen", "completeunlessopen", "b", "classb", "lockedexceptopenfiles",
             "whendevicelockedexceptopenfiles":
            self = .completeUnlessOpen
        case "nsfileprotectioncompleteuntilfirstuserauthentication", "completeuntilfirstuserauthentication",
             "untilfirstauth", "untilfirstauthentication", "c", "classc", "afterrestart", "afterdevicerestart":
            self = .untilFirstAuthentication
        case "nsfileprotectionnone", "none", "d", "classd", "usedevicesettings", "off":
            self = .none
        default:
            return nil
        }
    }
}
