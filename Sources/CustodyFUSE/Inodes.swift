import CustodySystem
import Glibc
import Synchronization

/// A file system object the kernel knows by a node ID: an O_PATH descriptor on the backing
/// object, kept open for as long as the kernel holds lookups on it (or a request still uses it).
final class Inode: @unchecked Sendable {
    /// O_PATH descriptor of the backing object; closed when the last reference goes.
    let fd: Int32
    let device: UInt64
    let number: UInt64
    /// File type bits (`S_IFMT`) of the backing object; they cannot change for a given inode.
    let fileType: mode_t
    /// Owner and encryption, probed once; the shared decrypted content while handles are open.
    let protectionState = Mutex(InodeProtection())
    /// The table's epoch when a request last used it (for the pruner's choice).
    let lastUsed = Atomic<UInt64>(0)
    /// The owner's uid, as last read: space for the file is allocated as its owner
    /// (`AllocationCredentials`).
    let ownerUID = Atomic<UInt32>(0)
    /// A directory's tweak for encrypted names (`EncryptedNames.swift`), once read.
    let tweak = Mutex<DirectoryTweakState>(.unknown)
    /// Encrypted forms of names the directory computed last (`KnownForms`).
    let encryptedForms = Mutex(KnownForms())
    /// The key tag a directory's names were last found, listed or made in (nil: plain): the form
    /// a lookup of a name it does not know tries first (`EncryptedNames.swift`).
    let nameHint = Mutex<String?>(nil)
    /// For a directory the mount made: the names whose entries may be stored encrypted in it
    /// (`MadeDirectoryNames`); nil for every other node.
    let madeNames = Mutex<MadeDirectoryNames?>(nil)

    init(fd: Int32, device: UInt64, number: UInt64, fileType: mode_t) {
        self.fd = fd
        self.device = device
        self.number = number
        self.fileType = fileType
    }

    /// A node around `fd` for the object with `attributes` (its type from them).
    convenience init(fd: Int32, attributes: stat) {
        self.init(fd: fd, device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino), fileType: attributes.st_mode & S_IFMT)
    }

    deinit { Syscall.close(fd) }

    var isDirectory: Bool { fileType == S_IFDIR }
    var isSymlink: Bool { fileType == S_IFLNK }
    var isRegularFile: Bool { fileType == S_IFREG }

    /// `/proc/self/fd/N`, to reach the object with calls that have no descriptor form.
    var procPath: String { Syscall.procPath(fd) }
}

/// The node IDs handed to the kernel and their lookup counts.
///
/// Node IDs are never reused within a mount (a counter), so a stale ID from the kernel can never
/// reach another file. The same backing object (device, inode number) always maps to the same
/// node ID while the kernel knows it, which is what hard links need. An inode number is not an
/// object, though: the file system gives a freed number to the next file at once (ext4 does), and
/// the kernel's FORGET of the old node may still be on its way. So an object removed through the
/// mount is detached from its number (`detach`), and a number that comes back as another file
/// type is another object; either way it gets a node ID of its own.
final class InodeTable: @unchecked Sendable {
    private struct Key: Hashable {
        var device: UInt64
        var number: UInt64
    }

    private struct Entry {
        var inode: Inode
        var lookups: UInt64
        /// The directory and name it was last looked up by, to ask the kernel to drop it.
        var name: EntryName?
    }

    /// A node known by an encrypted name: the directory and the name the kernel knows it by in
    /// `byShownName`, with its stored name.
    private struct Indexed {
        var id: UInt64
        var parent: UInt64
        var shown: FileName
        var stored: FileName
    }

    /// The key of a directory's node ID and a name in it in `byShownName`: one number, so that
    /// the neighbours a removal moves in a large table are hashed again without reading a name.
    private static func indexKey(_ parent: UInt64, _ name: FileName) -> Int {
        var hasher = Hasher()
        hasher.combine(parent)
        name.withBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }

    private struct State {
        var byID: [UInt64: Entry] = [:]
        var byKey: [Key: UInt64] = [:]
        /// Nodes known by an encrypted name, with that stored name, by the name the kernel knows:
        /// a removal or a rename of an entry a listing showed finds its stored name here rather
        /// than encrypting again (one look in one table: each is a cache miss on a large tree).
        /// Keyed by `indexKey`: two names with one key (a hash collision) keep the later one,
        /// and the other is found as if it were not indexed.
        var byShownName: [Int: Indexed] = [:]
        var nextID: UInt64 = 2

        /// Indexes `id` under its name, if that is an encrypted one (dropping the name it had,
        /// unless the new one takes its place).
        mutating func index(_ id: UInt64, name: EntryName?, replacing old: EntryName?) {
            if let old, old.stored != nil, name?.stored == nil || old.parent != name?.parent || old.name != name?.name { unindex(id, old) }
            if let name, let stored = name.stored {
                byShownName[InodeTable.indexKey(name.parent, name.name)] = Indexed(id: id, parent: name.parent, shown: name.name, stored: stored)
            }
        }

        /// Calls `body` with `id`'s entry where it is; nil when there is no such node. Every
        /// request looks up its node: a copy of the entry would retain each name it holds, counts
        /// that every request thread shares.
        mutating func withEntry<T>(_ id: UInt64, _ body: (inout Entry) -> T) -> T? {
            guard let index = byID.index(forKey: id) else { return nil }
            return body(&byID.values[index])
        }

        mutating func unindex(_ id: UInt64, _ name: EntryName?) {
            guard let name, name.stored != nil else { return }
            let key = InodeTable.indexKey(name.parent, name.name)
            if byShownName[key]?.id == id { byShownName[key] = nil }
        }
    }

    static let rootID: UInt64 = 1
    private let state = Mutex(State())
    /// How many node IDs the kernel holds (kept beside the table, read without its lock).
    private let entries = Atomic<Int>(1)
    /// A coarse clock for recency, advanced by the pruner; requests only read it.
    private let epoch = Atomic<UInt64>(1)

    func advanceEpoch() { epoch.wrappingAdd(1, ordering: .relaxed) }

    private func touch(_ inode: Inode) {
        inode.lastUsed.store(epoch.load(ordering: .relaxed), ordering: .relaxed)
    }

    init(root: Inode) {
        state.withLock {
            $0.byID[Self.rootID] = Entry(inode: root, lookups: 1 << 62)
            $0.byKey[Key(device: root.device, number: root.number)] = Self.rootID
        }
    }

    /// The inode for a node ID the kernel sent.
    func inode(_ id: UInt64) throws(Errno) -> Inode {
        guard let inode = state.withLock({ $0.withEntry(id) { $0.inode } }) else { throw Errno.badFileDescriptor }
        touch(inode)
        return inode
    }

    /// Registers one kernel lookup (of `name`, when given) of the object that `fd` (an O_PATH
    /// descriptor) refers to and returns its node ID. Takes ownership of `fd`: it is kept, or
    /// closed if the object is known.
    /// `made`: what a directory just made (empty) starts knowing of its names, kept only when
    /// this call makes its node (a node another request made first may have been used already).
    func remember(fd: Int32, attributes st: stat, name: EntryName? = nil, made: MadeDirectoryNames? = nil) -> UInt64 {
        let key = Key(device: UInt64(st.st_dev), number: UInt64(st.st_ino))
        let (id, inode, duplicate) = state.withLock { state -> (UInt64, Inode, Bool) in
            if let id = state.byKey[key], let (inode, old) = state.withEntry(id, { entry -> (Inode, EntryName?)? in
                guard entry.inode.fileType == st.st_mode & S_IFMT else { return nil }
                entry.lookups += 1
                guard let name else { return (entry.inode, nil) }
                defer { entry.name = name }
                return (entry.inode, entry.name)
            }) ?? nil {
                if let name { state.index(id, name: name, replacing: old) }
                return (id, inode, true)
            }
            let id = state.nextID
            state.nextID += 1
            let inode = Inode(fd: fd, device: key.device, number: key.number, fileType: st.st_mode & S_IFMT)
            if let made, inode.isDirectory { inode.madeNames.withLock { $0 = made } }
            state.byID[id] = Entry(inode: inode, lookups: 1, name: name)
            state.byKey[key] = id
            state.index(id, name: name, replacing: nil)
            entries.wrappingAdd(1, ordering: .relaxed)
            return (id, inode, false)
        }
        touch(inode)
        if duplicate { Syscall.close(fd) }
        return id
    }

    /// On a shared store another daemon removes objects this one knows, and the store may give
    /// a removed object's number to a new one (an NFS server does; a local file system keeps the
    /// number while this daemon's descriptor holds the old inode). The node known by the number
    /// of `attributes` is detached when its descriptor no longer reaches a linked object, so that
    /// `remember` makes a node of its own for the object found now.
    func detachIfGone(_ attributes: stat) {
        let key = Key(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino))
        let known = state.withLock { state -> (UInt64, Inode)? in
            guard let id = state.byKey[key], id != Self.rootID else { return nil }
            return state.withEntry(id) { (id, $0.inode) }
        }
        guard let (id, inode) = known else { return }
        if let now = try? Syscall.stat(of: inode.fd), now.st_nlink > 0 { return }
        detach(id)
    }

    /// The object behind `id` lost its last name: its inode number may now be another file's, which
    /// must not be served as this node (the kernel may still hold it). The node stays until the
    /// kernel forgets it.
    func detach(_ id: UInt64) {
        state.withLock { state in
            guard id != Self.rootID, let (key, name) = state.withEntry(id, { (Key(device: $0.inode.device, number: $0.inode.number), $0.name) }) else { return }
            if state.byKey[key] == id { state.byKey[key] = nil }
            state.unindex(id, name)
        }
    }

    /// The kernel forgot `count` lookups of `id`. At zero the node ID is retired; its descriptor
    /// closes once no request still holds the inode.
    func forget(_ id: UInt64, count: UInt64) {
        let retired: Inode? = state.withLock { state in
            guard id != Self.rootID, let retiring = state.withEntry(id, { entry -> Bool in
                guard entry.lookups > count else { return true }
                entry.lookups -= count
                return false
            }), retiring, let entry = state.byID.removeValue(forKey: id) else { return nil }
            entries.wrappingSubtract(1, ordering: .relaxed)
            let key = Key(device: entry.inode.device, number: entry.inode.number)
            if state.byKey[key] == id { state.byKey[key] = nil }
            state.unindex(id, entry.name)
            return entry.inode
        }
        _ = retired  // released outside the lock
    }

    /// Points node ID `id` at another backing object (a re-protected file replaced by rename):
    /// requests already holding the old inode finish on it; later ones get `replacement`.
    func replace(_ id: UInt64, with replacement: Inode) {
        state.withLock { state in
            guard var entry = state.byID[id] else { return }
            let oldKey = Key(device: entry.inode.device, number: entry.inode.number)
            if state.byKey[oldKey] == id { state.byKey[oldKey] = nil }
            entry.inode = replacement
            state.byID[id] = entry
            state.byKey[Key(device: replacement.device, number: replacement.number)] = id
        }
    }

    /// The directory and name `id` was last looked up by, if known.
    func name(of id: UInt64) -> EntryName? {
        state.withLock { $0.withEntry(id) { $0.name } ?? nil }
    }

    /// The entry `from` in `directory` is stored as `to` now (its owner changed): nodes last looked
    /// up by it keep the name the kernel knows and reach the backing entry by the new one.
    func renamed(in directory: Inode, from: FileName, to: FileName) {
        state.withLock { state in
            guard let parent = state.byKey[Key(device: directory.device, number: directory.number)] else { return }
            for (id, entry) in state.byID where entry.name?.parent == parent && entry.name?.storedName == from {
                state.byID[id]?.name?.stored = to == entry.name?.name ? nil : to
                state.index(id, name: state.byID[id]?.name, replacing: entry.name)
            }
        }
    }

    /// The stored name of the entry the kernel knows as `shown` in the directory `parent`, when
    /// a node was looked up or listed by it and it is an encrypted one. A hint: the entry may
    /// have gone or moved since, which the caller finds when it looks.
    func storedName(in parent: UInt64, shown: FileName) -> FileName? {
        let key = Self.indexKey(parent, shown)
        return state.withLock { state in
            guard let indexed = state.byShownName[key], indexed.parent == parent, indexed.shown == shown else { return nil }
            return indexed.stored
        }
    }

    /// The name the kernel knows the object (`device`, `number`) by in the directory `parent`,
    /// when its node was last looked up or listed there by the stored name `stored`: a listing
    /// of entries the kernel knows (rm -r after find, a second ls) shows that name again rather
    /// than decrypting it again.
    func shownName(ofObject device: UInt64, _ number: UInt64, in parent: UInt64, stored: UnsafePointer<CChar>) -> FileName? {
        state.withLock { state in
            guard let id = state.byKey[Key(device: device, number: number)] else { return nil }
            return state.withEntry(id) { entry -> FileName? in
                guard let name = entry.name, name.parent == parent, let known = name.stored,
                      known.cString.withUnsafeBufferPointer({ $0.baseAddress.map { strcmp($0, stored) == 0 } ?? false }) else { return nil }
                return name.name
            } ?? nil
        }
    }

    /// The names every node was last looked up by.
    func entryNames() -> [EntryName] {
        state.withLock { $0.byID.values.compactMap(\.name) }
    }

    /// The node the kernel knows for the object with `attributes`, and its ID, if it knows one.
    func known(_ attributes: stat) -> (id: UInt64, inode: Inode)? {
        guard let id = id(device: UInt64(attributes.st_dev), number: UInt64(attributes.st_ino)), let inode = try? inode(id) else { return nil }
        return (id, inode)
    }

    /// The node ID the kernel knows a backing object by, if any.
    func id(device: UInt64, number: UInt64) -> UInt64? {
        state.withLock { $0.byKey[Key(device: device, number: number)] }
    }

    /// Every known inode with its node ID (for invalidation at lock time).
    func snapshot() -> [(UInt64, Inode)] {
        state.withLock { $0.byID.map { ($0.key, $0.value.inode) } }
    }

    /// How many node IDs the kernel holds (for tests and status).
    var count: Int { entries.load(ordering: .relaxed) }

    /// The names of the `count` least recently used nodes (never the root), for asking the
    /// kernel to drop them.
    func leastRecentlyUsed(_ count: Int) -> [EntryName] {
        let named = state.withLock { state in state.byID.compactMap { id, entry in
            id == Self.rootID ? nil : entry.name.map { (entry.inode.lastUsed.load(ordering: .relaxed), $0) }
        } }
        return named.sorted { $0.0 < $1.0 }.prefix(max(0, count)).map(\.1)
    }
}

/// A directory's node ID and a name in it.
struct EntryName: Sendable {
    var parent: UInt64
    /// As the kernel knows it (what a program asked for, what a listing showed).
    var name: FileName
    /// As the backing directory holds it, when that differs (an encrypted name).
    var stored: FileName? = nil

    /// The name in the backing directory.
    var storedName: FileName { stored ?? name }
}

/// A name in a backing directory, as a request reached an object by it.
struct BackingEntry {
    var directory: Inode
    var name: FileName
}
