import CustodySystem
import Glibc

/// A place data can be saved to or opened from, named as the SDK names them
/// (`IntuneMAMSaveLocation*`, `IntuneMAMOpenLocation*`), or as an administrator named a
/// directory in the settings (`Locations`).
public struct Location: Hashable, Sendable, CustomStringConvertible {
    /// The canonical name (`LocalStorage` is `LocalDrive`; `Camera` and `PhotoLibrary` are
    /// `CameraRoll`).
    public let name: String

    public static let accountDocument = Location(canonical: "AccountDocument")
    public static let localDrive = Location(canonical: "LocalDrive")
    public static let oneDriveForBusiness = Location(canonical: "OneDriveForBusiness")
    public static let sharePoint = Location(canonical: "SharePoint")
    public static let other = Location(canonical: "Other")
    public static let cameraRoll = Location(canonical: "CameraRoll")

    static let sdk: [Location] = [.accountDocument, .localDrive, .oneDriveForBusiness, .sharePoint, .other, .cameraRoll]
    static let aliases = ["localstorage": localDrive, "camera": cameraRoll, "photolibrary": cameraRoll]
    /// The names, for messages.
    public static var knownNames: String { sdk.map(\.name).joined(separator: ", ") + ", or an administrator's location" }

    private init(canonical: String) { self.name = canonical }

    /// An SDK name (any case, with its aliases) or an administrator's name: letters, digits,
    /// `.`, `_`, `-` and spaces, at most 64 bytes, starting with a letter or digit.
    public init?(name: String) {
        let key = name.lowercased()
        if let known = Self.sdk.first(where: { $0.name.lowercased() == key }) ?? Self.aliases[key] {
            self = known
            return
        }
        let bytes = Array(name.utf8)
        guard let first = bytes.first, bytes.count <= 64, Self.isNameByte(first), first != UInt8(ascii: " "),
              bytes.allSatisfy(Self.isNameByte) else { return nil }
        self.name = name
    }

    private static func isNameByte(_ byte: UInt8) -> Bool {
        (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
            || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: " ")
    }

    /// A Linux machine has no camera roll: no path is ever in it (the queries still answer).
    public var neverMatches: Bool { self == .cameraRoll }

    public var description: String { name }
}

/// Where a path is: its location and the directory that made it so.
public struct PathLocation: Codable, Equatable, Sendable {
    public var path: String
    public var location: String
    /// The configured directory, mount point or file system the path is under.
    public var under: String
}

/// One location with the directories it covers, and what a policy allows there.
public struct LocationSummary: Codable, Equatable, Sendable {
    public var name: String
    /// The directories it covers: configured paths, the mount points for `AccountDocument`,
    /// "/" for `LocalDrive` (every local file system not covered by another location).
    public var paths: [String]
    public var neverMatches: Bool
    public var saveToAllowed: Bool?
    public var openFromAllowed: Bool?
}

/// Locations and the SDK's two questions about them (`isSaveToAllowedForLocation`,
/// `isOpenFromAllowedForLocation`).
extension Engine {
    /// File system types whose data lives on another machine: `Other`, not `LocalDrive`.
    public static let remoteFileSystems: Set<String> = ["nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "afs", "9p",
                                                 "fuse.sshfs", "fuse.rclone", "fuse.davfs", "davfs", "fuse.s3fs", "fuse.gcsfuse"]

    /// The location of `path` (absolute; it need not exist): an administrator's location whose
    /// directory holds it (the deepest one), else `AccountDocument` inside a protected mount,
    /// else `Other` on a network file system, else `LocalDrive`.
    public func locate(_ path: String) throws(EngineError) -> PathLocation {
        guard path.isAbsolutePath else { throw .invalidPath(path, reason: "an absolute path is needed") }
        let normalized = Self.normalized(path)
        var best: (name: String, directory: String)?
        for (name, directories) in settings.locations {
            for directory in directories where normalized.isPath(inside: directory) {
                if directory.utf8.count > best?.directory.utf8.count ?? -1 { best = (name, directory) }
            }
        }
        if let best { return PathLocation(path: normalized, location: best.name, under: best.directory) }
        if let inMount = volume(containing: normalized) {
            return PathLocation(path: normalized, location: Location.accountDocument.name, under: inMount.volume.mountPoint)
        }
        let mounts = MountTable.entries()
        let holder = mounts.filter { normalized.isPath(inside: $0.mountPoint) }.max { $0.mountPoint.count < $1.mountPoint.count }
        if let holder, Self.remoteFileSystems.contains(holder.fileSystemType) {
            return PathLocation(path: normalized, location: Location.other.name, under: holder.mountPoint)
        }
        return PathLocation(path: normalized, location: Location.localDrive.name, under: holder?.mountPoint ?? "/")
    }

    /// isSaveToAllowedForLocation: may data of `identity` be saved to `location`? Unmanaged
    /// identities and policies without a list: yes.
    public func isSaveToAllowed(_ location: Location, for identity: String?) -> Bool {
        guard let identity, let policy = (try? account(identity))?.policy, let allowed = policy.saveToLocations else { return true }
        return allowed.contains(location.name)
    }

    /// isOpenFromAllowedForLocation: may data from `location` be opened into `identity`?
    public func isOpenFromAllowed(_ location: Location, for identity: String?) -> Bool {
        guard let identity, let policy = (try? account(identity))?.policy, let allowed = policy.openFromLocations else { return true }
        return allowed.contains(location.name)
    }

    /// Every location with its directories; with `answering`, what the policy of `identity`
    /// (nil: no identity) allows in each.
    public func locationSummaries(answering: Bool = false, for identity: String? = nil) -> [LocationSummary] {
        let settings = self.settings
        var names = Location.sdk.map(\.name)
        for name in settings.locations.keys.sorted() where !names.contains(name) { names.append(name) }
        return names.compactMap { name -> LocationSummary? in
            guard let location = Location(name: name) else { return nil }
            var paths = settings.locations[name] ?? []
            if location == .accountDocument { paths += volumes.map(\.mountPoint) }
            if location == .localDrive { paths.append("/") }
            return LocationSummary(name: name, paths: paths, neverMatches: location.neverMatches,
                                   saveToAllowed: answering ? isSaveToAllowed(location, for: identity) : nil,
                                   openFromAllowed: answering ? isOpenFromAllowed(location, for: identity) : nil)
        }
    }

    /// An SDK location, or one named in the settings.
    public func isKnown(_ location: Location) -> Bool {
        Location.sdk.contains(location) || settings.locations[location.name] != nil
    }

    /// Checks a policy's location names against the SDK's and the configured ones.
    func checkLocations(_ policy: Policy) throws(EngineError) {
        for name in (policy.saveToLocations ?? []) + (policy.openFromLocations ?? []) {
            guard let location = Location(name: name) else { throw .invalidPolicy("unknown location \(name)") }
            if !isKnown(location) {
                throw .invalidPolicy("unknown location \(name) (\(Location.knownNames) configured in Locations)")
            }
        }
    }

    /// `path` without `.`, `..`, repeated and trailing slashes (lexically: symbolic links are
    /// the caller's to resolve). Split at slash bytes: a slash followed by a combining mark is
    /// still a slash.
    public static func normalized(_ path: String) -> String {
        var parts: [String] = []
        for part in path.pathComponents {
            if part.bytesEqual(".") { continue }
            if part.bytesEqual("..") { _ = parts.popLast(); continue }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }
}
