/// The extended attributes Custody keeps on a backing store: the owner record, the hole record,
/// a directory's tweak, the full form of a long stored name, the upgrade marker, and the marker
/// that says which namespace a store uses. They live in `trusted.` (only root reads or sets those,
/// so users cannot forge them from the backing store) wherever the store keeps it, and in `user.`
/// on stores that keep no other: NFS, whose protocol (RFC 8276) carries only `user.` attributes.
/// A store keeps to one namespace (`namespaceMarker`, on its root), and the mount hides this
/// namespace's names and refuses to set them, whichever it is.
public struct StoreAttributes: Equatable, Sendable {
    public enum Namespace: String, Sendable, CaseIterable {
        case trusted, user
    }

    public let namespace: Namespace
    /// Every name below starts with it.
    public let prefix: String
    public let owner: String
    public let holes: String
    public let directoryTweak: String
    public let longName: String
    public let upgraded: String
    /// On the backing root: the store's records are in this namespace.
    public let namespaceMarker: String

    public init(_ namespace: Namespace) {
        self.namespace = namespace
        prefix = namespace == .trusted ? "trusted.custody." : "user.custody.store."
        owner = prefix + "owner"
        holes = prefix + "holes"
        directoryTweak = prefix + "dirid"
        longName = prefix + "name"
        upgraded = prefix + "upgraded"
        namespaceMarker = prefix + "namespace"
    }

    public static let trusted = StoreAttributes(.trusted)
    public static let user = StoreAttributes(.user)
}
