import CustodyCore
import CustodyFormat
import CustodySystem
import Glibc
import Synchronization

/// What the mount knows of a directory's tweak (`DirectoryTweak`).
enum DirectoryTweakState {
    case unknown
    /// The directory had none when the mount had made `made` tweaks (`MountFileSystem.tweaksMade`):
    /// true for as long as that count is the same (another node of the same directory, such as
    /// one the kernel looks up again after forgetting it, may have made one since).
    case none(made: UInt64)
    case known([UInt8])
}

/// The encrypted forms a directory computed last (`Inode.encryptedForms`): the few names just
/// looked up and found missing, for the creation that follows (LOOKUP, then CREATE, MKDIR,
/// SYMLINK or a rename's target), so that a name is encrypted once. A short ring, searched in
/// order: what it holds is a handful of names, and a directory that is listed or removed finds
/// its names by `Inode.nameHint` instead.
struct KnownForms {
    static let capacity = 8
    private var ring: [ResolvedName] = []
    private var next = 0

    func forms(of shown: FileName) -> [ResolvedName] {
        ring.filter { $0.shown == shown }
    }

    func form(of shown: FileName, key: NameKey) -> ResolvedName? {
        ring.first { $0.key === key && $0.shown == shown }
    }

    /// Keeps `form`, replacing one of the same name and key tag (a key made again by a later
    /// unlock), else the oldest.
    mutating func keep(_ form: ResolvedName) {
        guard let tag = form.key?.tag else { return }
        if let same = ring.firstIndex(where: { $0.shown == form.shown && $0.key?.tag == tag }) {
            ring[same] = form
        } else if ring.count < Self.capacity {
            ring.append(form)
        } else {
            ring[next] = form
            next = (next + 1) % Self.capacity
        }
    }
}

/// What a directory the mount made knows of its names (`Inode.madeNames`): the names, as the
/// kernel knows them, of every entry that may be stored encrypted in it since it was made empty.
/// A request that stores a name encrypted adds it first; nothing else puts an encrypted name in
/// a directory without changing a name's form (`MountFileSystem.formChanges`), and what a control
/// request copies in is named plain. So a name outside the set can only be stored plain, and the
/// LOOKUP that comes before every CREATE looks for the plain name alone and encrypts nothing.
/// Kept while no name changed form otherwise, and up to `limit` names.
struct MadeDirectoryNames {
    static let limit = 65_536
    /// `formChanges` when it was made: the set holds while that stands.
    let generation: UInt64
    var names: Set<FileName> = []
}

/// A name a request gave, and the entry it is in the backing directory.
struct ResolvedName {
    /// As the kernel knows it.
    let shown: FileName
    /// As the backing directory holds it.
    let stored: FileName
    /// The full encrypted form of a long stored name, kept on the entry (`NameCipher`).
    let longForm: String?
    /// The key the stored name is encrypted with; nil for a plain one (or one whose key is not held).
    let key: NameKey?

    static func plain(_ name: FileName) -> ResolvedName { ResolvedName(shown: name, stored: name, longForm: nil, key: nil) }

    var isEncrypted: Bool { key != nil }

    func entryName(in parent: UInt64) -> EntryName {
        EntryName(parent: parent, name: shown, stored: stored == shown ? nil : stored)
    }
}

/// The one place names are translated between the mount and the backing store.
///
/// The name of an entry a managed identity owns (its files, and the directories, symlinks and
/// other objects its processes make) is stored encrypted under that identity's name key, within
/// the directory's tweak (`NameCipher`, `DirectoryTweak`); a symlink's target too. Every other
/// name is stored as it is, so one directory may hold both. A name from a request is found by the
/// stored name of the node the kernel knows by it, else in the forms `findEntry` tries (each held
/// key's only in a directory that has a tweak); a listing shows
/// each stored name decrypted when its key is held, and as stored (`~c3…`, a no-key name) when
/// not. Such a no-key name can be looked up, listed, removed and opened (its content stays as
/// protected as its class says); it cannot be renamed, and no new name may start with `~c3`.
extension MountFileSystem {

    // MARK: Keys and tweaks

    /// The name keys held now, refreshed when the engine's change.
    func heldNameKeys() -> NameKeySet {
        guard let engine else { return .empty }
        let generation = engine.nameKeyGeneration
        let cached = nameKeyCache.withLock { $0 }
        if cached.generation == generation { return cached }
        let fresh = engine.nameKeys()
        nameKeyCache.withLock { $0 = fresh }
        return fresh
    }

    /// The key a new entry owned by `owner` is named with (nil: a plain name). Refused while the
    /// owner is a managed identity whose key is not held.
    func nameKey(forNewEntryOf owner: String?) throws(Errno) -> NameKey? {
        guard options.encryptNames, let engine, let owner else { return nil }
        return try nameKey(for: engine.newFileOwner(owner))
    }

    /// As above, for an owner the engine has described.
    func nameKey(for owner: NewFileOwner) throws(Errno) -> NameKey? {
        guard options.encryptNames else { return nil }
        switch owner.nameKey {
        case .plain: return nil
        case .key(let key): return key
        case .unavailable(let identity):
            log("a name for \(identity) refused: its keys are not unlocked since the daemon started")
            throw Errno.accessDenied
        }
    }

    /// A path that reaches the directory for the attribute calls.
    func attributePath(of directory: Inode) -> String {
        directory === root && rootDirectory >= 0 ? Syscall.procPath(rootDirectory) : directory.procPath
    }

    /// The directory's tweak; nil when it has none (no encrypted name is in it). `readable` is a
    /// descriptor of the directory open for reading, when the caller has one (read by it rather
    /// than by path). A tweak, once read, is the directory's for good; that it has none is known
    /// until this mount makes one, and on a shared store not at all (another daemon may make it).
    func tweak(of directory: Inode, readable: Int32 = -1) throws(Errno) -> [UInt8]? {
        let made = tweaksMade.load(ordering: .acquiring)
        switch directory.tweak.withLock({ $0 }) {
        case .none(let then) where then == made && !options.sharedStore: return nil
        case .known(let tweak): return tweak
        case .none, .unknown: break
        }
        let read = try asErrno { () throws(FormatError) in
            readable >= 0 ? try DirectoryTweak.read(fd: readable, names: storeAttributes) : try DirectoryTweak.read(attributePath(of: directory), names: storeAttributes)
        }
        directory.tweak.withLock { state in
            if case .known = state { return }
            state = read.map { .known($0) } ?? .none(made: made)
        }
        return read
    }

    /// The directory's tweak, made now if it has none.
    func ensureTweak(of directory: Inode) throws(Errno) -> [UInt8] {
        if let known = try tweak(of: directory) { return known }
        let path = attributePath(of: directory)
        let made = try asErrno { () throws(FormatError) in try DirectoryTweak.ensure(path, names: storeAttributes) }
        directory.tweak.withLock { $0 = .known(made) }
        tweaksMade.add(1, ordering: .releasing)
        return made
    }

    /// Makes the tweak of the directory `stored` in `directory`, just made (as the daemon: the
    /// caller may not be able to read it). No node knows the directory yet, so none holds that
    /// it has no tweak (`tweaksMade` stays).
    func makeTweak(ofNew stored: FileName, in directory: Inode) throws(Errno) -> [UInt8] {
        try asErrno { () throws(FormatError) in try DirectoryTweak.make(in: directory.fd, named: stored.cString, names: storeAttributes) }
    }

    // MARK: Names of directories the mount made

    /// What a directory the mount is making starts knowing of its names; nothing on a shared
    /// store, where another daemon may store encrypted names in it.
    func madeDirectoryNames() -> MadeDirectoryNames? {
        options.sharedStore ? nil : MadeDirectoryNames(generation: formChanges.load(ordering: .acquiring))
    }

    /// Whether `shown` may be stored encrypted in `directory`: false only when the directory was
    /// made by the mount and knows it is not.
    func mayBeEncrypted(_ shown: FileName, in directory: Inode) -> Bool {
        let generation = formChanges.load(ordering: .acquiring)
        return directory.madeNames.withLock { made in
            guard let known = made else { return true }
            guard known.generation == generation else {
                made = nil
                return true
            }
            return known.names.contains(shown)
        }
    }

    /// Before an entry named `resolved` is stored in `directory`: an encrypted one joins what the
    /// directory knows.
    func storing(_ resolved: ResolvedName, in directory: Inode) {
        guard resolved.isEncrypted else { return }
        directory.madeNames.withLock { made in
            guard let count = made?.names.count else { return }
            if count >= MadeDirectoryNames.limit { made = nil } else { made?.names.insert(resolved.shown) }
        }
    }

    /// After the entry `resolved` left `directory` (before the answer, so that the kernel's next
    /// request about the name comes after).
    func nameRemoved(_ resolved: ResolvedName, from directory: Inode) {
        guard resolved.isEncrypted else { return }
        directory.madeNames.withLock { made in _ = made?.names.remove(resolved.shown) }
    }

    // MARK: Names from requests

    /// Whether a C name starts with `NameCipher.prefix` (`~c3`).
    static func isReservedName(_ name: UnsafePointer<CChar>) -> Bool {
        name[0] == 0x7E && name[1] == 0x63 && name[2] == 0x33
    }

    /// The entry `name` names in `directory`, found by `probe` (which throws ENOENT when a stored
    /// name is not there): by the stored name of a node the kernel knows by it (`parentID`, the
    /// directory's node ID, given), else in a form the directory knows, else in the form its names
    /// were last found in (`Inode.nameHint`), then plain, then in each other held key's form. In
    /// a directory the mount made, a name it never stored encrypted is looked for in plain only
    /// (`MadeDirectoryNames`).
    func findEntry<T>(_ name: UnsafePointer<CChar>, in directory: Inode, parentID: UInt64? = nil,
                      probe: (UnsafePointer<CChar>) throws(Errno) -> T) throws(Errno) -> (ResolvedName, T) {
        let shown = FileName(cString: name)
        guard engine != nil else { return (.plain(shown), try probe(name)) }
        if Self.isReservedName(name) {
            // A stored name: reachable so only while it cannot be shown decrypted.
            if let text = shown.text, decryptedName(text, in: directory, longForm: nil) != nil { throw Errno.noSuchFile }
            return (.plain(shown), try probe(name))
        }
        // In a directory the mount made, a name it never stored encrypted can only be plain.
        if !mayBeEncrypted(shown, in: directory) { return (.plain(shown), try probe(name)) }
        // A name exists in one form only, so the first form found is the entry; trying the likely
        // one first spares a look at the others (and a negative entry for each in the backing file
        // system's cache, which each removal of the directory walks).
        let keys = heldNameKeys()
        // Listed, then removed or renamed (rm -r, a file manager): the node the listing made
        // knows its stored name, and no name is encrypted again.
        if let parentID, let stored = inodes.storedName(in: parentID, shown: shown),
           let key = stored.withBytes({ bytes in NameCipher.parts(of: bytes).flatMap { keys.key(tagged: $0.tag) } }) {
            do {
                return (ResolvedName(shown: shown, stored: stored, longForm: nil, key: key), try probe(stored.cString))
            } catch where error == .noSuchFile {}
        }
        let known = knownForms(of: shown, in: directory, keys: keys)
        for resolved in known {
            do {
                return (resolved, try probe(resolved.stored.cString))
            } catch where error == .noSuchFile {}
        }
        var computed: [ResolvedName] = []
        func attempt(_ key: NameKey, tweak: [UInt8]) throws(Errno) -> (ResolvedName, T)? {
            guard !known.contains(where: { $0.key === key }), let resolved = try? encrypted(shown, tweak: tweak, key: key) else { return nil }
            computed.append(resolved)
            do {
                let found = try probe(resolved.stored.cString)
                noteNameForm(key.tag, in: directory)
                return (resolved, found)
            } catch where error == .noSuchFile {
                return nil
            }
        }
        var hinted: NameKey?
        var tweak: [UInt8]?
        if let tag = directory.nameHint.withLock({ $0 }), let key = keys.byTag[tag], let directoryTweak = try self.tweak(of: directory) {
            (hinted, tweak) = (key, directoryTweak)
            if let found = try attempt(key, tweak: directoryTweak) { return found }
        }
        do {
            let found = try probe(name)
            if hinted != nil { noteNameForm(nil, in: directory) }
            return (.plain(shown), found)
        } catch where error == .noSuchFile {}
        if tweak == nil { tweak = try self.tweak(of: directory) }
        guard let tweak else { throw Errno.noSuchFile }
        for key in keys.all where key !== hinted {
            if let found = try attempt(key, tweak: tweak) { return found }
        }
        // Not there: what was computed serves the creation that usually follows.
        for form in computed { remember(form, in: directory) }
        throw Errno.noSuchFile
    }

    /// Notes the form (a key tag; nil: plain) a name of `directory` was found or listed in.
    func noteNameForm(_ tag: String?, in directory: Inode) {
        directory.nameHint.withLock { if $0 != tag { $0 = tag } }
    }

    // MARK: Encrypted forms

    /// The encrypted forms of `shown` this directory knows, with keys still held. A form is a
    /// function of the directory's tweak (which never changes), the key and the name, so a
    /// known one is never wrong; whether it exists is for the caller to look.
    private func knownForms(of shown: FileName, in directory: Inode, keys: NameKeySet) -> [ResolvedName] {
        directory.encryptedForms.withLock { $0.forms(of: shown) }.filter { form in form.key.map { keys.byTag[$0.tag] === $0 } ?? false }
    }

    private func remember(_ form: ResolvedName, in directory: Inode) {
        directory.encryptedForms.withLock { $0.keep(form) }
    }
    /// The entry `name` names in `directory` (ENOENT when none).
    func existingEntry(_ name: UnsafePointer<CChar>, in directory: Inode, parentID: UInt64? = nil) throws(Errno) -> (ResolvedName, stat) {
        try findEntry(name, in: directory, parentID: parentID) { (stored) throws(Errno) in
            try Syscall.fstatat(directory.fd, stored, AT_SYMLINK_NOFOLLOW)
        }
    }

    /// `shown` encrypted with `key` for `directory` (its tweak made if it has none): the form its
    /// LOOKUP computed, else computed now (and not kept: the entry it names is about to exist).
    func encryptedName(_ shown: FileName, in directory: Inode, key: NameKey) throws(Errno) -> ResolvedName {
        noteNameForm(key.tag, in: directory)
        if let known = directory.encryptedForms.withLock({ $0.form(of: shown, key: key) }) { return known }
        return try encrypted(shown, tweak: try ensureTweak(of: directory), key: key)
    }

    /// `shown` encrypted with `key` for `directory`, whose tweak is `tweak`.
    private func encrypted(_ shown: FileName, tweak: [UInt8], key: NameKey, in directory: Inode) throws(Errno) -> ResolvedName {
        if let known = directory.encryptedForms.withLock({ $0.form(of: shown, key: key) }) { return known }
        let resolved = try encrypted(shown, tweak: tweak, key: key)
        remember(resolved, in: directory)
        return resolved
    }

    /// `shown` encrypted with `key` for the directory with `tweak`.
    private func encrypted(_ shown: FileName, tweak: [UInt8], key: NameKey) throws(Errno) -> ResolvedName {
        do throws(FormatError) {
            let (entry, full) = try shown.withBytes { (bytes) throws(FormatError) in
                try tweak.withBytes { (tweakBytes) throws(FormatError) in try NameCipher.entryName(of: bytes, tweak: tweakBytes, key: key) }
            }
            return ResolvedName(shown: shown, stored: entry, longForm: full, key: key)
        } catch {
            throw Errno.invalidArgument
        }
    }

    /// The stored name a new entry called `name` gets in `directory`, encrypted with `key` (nil:
    /// plain). Refused: a name starting with `~c3` (EINVAL), one that exists in another form
    /// (EEXIST; one in this form is the caller's to meet).
    func newEntryName(_ name: UnsafePointer<CChar>, in directory: Inode, key: NameKey?) throws(Errno) -> ResolvedName {
        let (wanted, other) = try newEntryName(name, in: directory, key: key, keepingOtherForm: false)
        return other ?? wanted
    }

    /// As above; with `keepingOtherForm`, an entry that exists in another form is not refused but
    /// returned as `other` (the caller opens it by that name, then renames it into `wanted`).
    func newEntryName(_ name: UnsafePointer<CChar>, in directory: Inode, key: NameKey?,
                      keepingOtherForm: Bool) throws(Errno) -> (wanted: ResolvedName, other: ResolvedName?) {
        let resolved = try storedForm(of: name, in: directory, key: key)
        guard engine != nil else { return (resolved, nil) }
        if let other = try otherForm(of: resolved, in: directory) {
            guard keepingOtherForm else { throw Errno.exists }
            return (resolved, other)
        }
        return (resolved, nil)
    }

    /// The form `name` is stored in, in `directory`, with `key` (nil: plain); EINVAL for a name
    /// that would read as a stored one. Whether it exists is not looked at.
    func storedForm(of name: UnsafePointer<CChar>, in directory: Inode, key: NameKey?) throws(Errno) -> ResolvedName {
        let shown = FileName(cString: name)
        guard engine != nil else { return .plain(shown) }
        if Self.isReservedName(name) { throw Errno.invalidArgument }
        guard let key else { return .plain(shown) }
        return try encryptedName(shown, in: directory, key: key)
    }

    /// Renames the entry `stored` in `directory` into the form `wanted` (not over another entry),
    /// keeps its long form, and tells the inode table.
    func moveIntoForm(_ stored: FileName, in directory: Inode, _ wanted: ResolvedName) throws(Errno) {
        guard stored != wanted.stored else { return }
        // What directories the mount made know of their names holds no more (before and after,
        // so that no lookup between takes the old knowledge for the new state).
        formChanges.add(1, ordering: .acquiringAndReleasing)
        defer { formChanges.add(1, ordering: .acquiringAndReleasing) }
        try Syscall.renameat2(directory.fd, stored.cString, directory.fd, wanted.stored.cString, Linux.RENAME_NOREPLACE)
        try? storeLongForm(of: wanted, in: directory)
        inodes.renamed(in: directory, from: stored, to: wanted.stored)
    }

    /// The entry that holds `resolved`'s name in another form than its own, if any: the plain
    /// one, or another held key's (each form computed once; its own is not looked at).
    private func otherForm(of resolved: ResolvedName, in directory: Inode) throws(Errno) -> ResolvedName? {
        func exists(_ stored: FileName) -> Bool { (try? Syscall.fstatat(directory.fd, stored.cString, AT_SYMLINK_NOFOLLOW)) != nil }
        if resolved.isEncrypted, exists(resolved.shown) { return .plain(resolved.shown) }
        guard let tweak = try tweak(of: directory) else { return nil }
        for key in heldNameKeys().all where key.tag != resolved.key?.tag {
            if let form = try? encrypted(resolved.shown, tweak: tweak, key: key, in: directory), exists(form.stored) { return form }
        }
        return nil
    }

    /// Keeps the long form of a long stored name on its entry, once the entry exists.
    func storeLongForm(of resolved: ResolvedName, in directory: Inode) throws(Errno) {
        guard let longForm = resolved.longForm else { return }
        let path = resolved.stored.appended(to: FileName(Syscall.procPath(directory.fd)))
        try Array(longForm.utf8).withBytes { (bytes) throws(Errno) in
            try Syscall.lsetxattr(path.cString, storeAttributes.longName, bytes.baseAddress, bytes.count, 0)
        }
    }

    // MARK: Owner changes

    /// Gives the entry `stored` in `directory` the name its new owner's key makes (plain for no
    /// owner or an unmanaged one), after an owner change; a symlink's target is sealed again too.
    /// Returns the stored name it has now. Leaves a name it cannot translate (a no-key name, a key
    /// not held) as it is.
    @discardableResult
    func renameForOwner(_ stored: FileName, in directory: Inode, owner: String?) -> FileName {
        guard engine != nil, options.encryptNames || stored.hasPrefix(NameCipher.prefix) else { return stored }
        let shown: FileName
        if stored.hasPrefix(NameCipher.prefix) {
            guard let decrypted = shownName(stored.cString, in: directory) else { return stored }
            shown = decrypted
        } else {
            shown = stored
        }
        let key: NameKey?
        do throws(Errno) {
            key = options.encryptNames ? try nameKey(forNewEntryOf: owner) : nil
        } catch {
            return stored
        }
        guard let wanted = key.map({ try? encryptedName(shown, in: directory, key: $0) }) ?? .plain(shown) else { return stored }
        if let attributes = try? Syscall.fstatat(directory.fd, stored.cString, AT_SYMLINK_NOFOLLOW), attributes.st_mode & S_IFMT == S_IFLNK {
            resealTarget(stored, in: directory, key: key)
        }
        do throws(Errno) {
            try moveIntoForm(stored, in: directory, wanted)
        } catch {
            log("the name of an entry whose owner changed stays as it was: \(error)")
            return stored
        }
        return wanted.stored
    }

    /// Seals a symlink's target with `key` (nil: stores it plain), replacing the link in one rename.
    private func resealTarget(_ stored: FileName, in directory: Inode, key: NameKey?) {
        guard let current = try? Syscall.readlinkat(directory.fd, stored.cString), let target = try? shownTarget(current) else { return }
        guard let wanted = try? target.withUnsafeBufferPointer({ (buffer) throws(Errno) -> [CChar] in
            guard let base = buffer.baseAddress else { throw Errno.invalidArgument }
            return try storedTarget(base, key: key)
        }), wanted != current else { return }
        let staging = FileName(Self.stagingPrefix + "link-" + String(UInt64.random(in: 0...UInt64.max), radix: 16))
        do throws(Errno) {
            try Syscall.symlinkat(wanted, directory.fd, staging.cString)
            if let attributes = try? Syscall.fstatat(directory.fd, stored.cString, AT_SYMLINK_NOFOLLOW) {
                try? Syscall.fchownat(directory.fd, staging.cString, attributes.st_uid, attributes.st_gid, AT_SYMLINK_NOFOLLOW)
            }
            try Syscall.renameat2(directory.fd, staging.cString, directory.fd, stored.cString, 0)
        } catch {
            _ = unlinkat(directory.fd, staging.cString, 0)
            log("a symlink's target whose owner changed stays as it was: \(error)")
        }
    }

    // MARK: Names for listings

    /// What a listing of one directory needs to show its names (the keys held, what its names
    /// are bound to), found once per READDIR rather than per name.
    struct NameListing {
        let keys: NameKeySet
        /// Nil when no name in the directory can open (no key held, no tweak).
        let associatedData: [UInt8]?
    }

    func nameListing(of directory: Inode, readable: Int32) -> NameListing? {
        guard engine != nil else { return nil }
        let keys = heldNameKeys()
        guard !keys.all.isEmpty, let tweak = try? tweak(of: directory, readable: readable) else { return NameListing(keys: keys, associatedData: nil) }
        return NameListing(keys: keys, associatedData: NameCipher.associatedData(tweak: tweak))
    }

    /// As `shownName(_:in:)`, with what `nameListing` found for the directory. `known`: for an
    /// entry of a READDIRPLUS, the directory's node ID and the entry's attributes: the name its
    /// node has when the kernel knows it by this stored name there is shown, and nothing decrypted.
    func shownName(_ stored: UnsafePointer<CChar>, in directory: Inode, listing: NameListing?,
                   known: (directoryID: UInt64, attributes: stat)? = nil) -> FileName? {
        guard let listing, Self.isReservedName(stored), let associatedData = listing.associatedData else { return nil }
        // Every name of a listing passes here: read in place, no string made of it.
        guard let (tag, separator, body) = NameCipher.parts(of: UnsafeRawBufferPointer(start: stored, count: strlen(stored))),
              separator != UInt8(ascii: ":"), let key = listing.keys.key(tagged: tag) else { return nil }
        if let (directoryID, attributes) = known,
           let name = inodes.shownName(ofObject: UInt64(attributes.st_dev), UInt64(attributes.st_ino), in: directoryID, stored: stored) {
            return name
        }
        if separator == UInt8(ascii: "-") { return decryptedName(String(cString: stored), in: directory, longForm: nil).map { FileName(bytes: $0) } }
        guard let plain = try? NameCipher.decryptShortName(body: body, associatedData: associatedData, key: key) else { return nil }
        // Listed, then looked up, removed or renamed by this name (rm -r, a file manager): tried
        // in this key's form first.
        noteNameForm(key.tag, in: directory)
        return plain
    }

    /// The name a listing shows for the stored name `stored` (a C string) in `directory`: nil
    /// when it is shown as stored (plain, or a no-key name).
    func shownName(_ stored: UnsafePointer<CChar>, in directory: Inode) -> FileName? {
        guard engine != nil, Self.isReservedName(stored) else { return nil }
        return decryptedName(String(cString: stored), in: directory, longForm: nil).map { FileName(bytes: $0) }
    }

    /// The plain name of a stored one, when its key is held and it opens in this directory.
    private func decryptedName(_ stored: String, in directory: Inode, longForm: String?) -> [UInt8]? {
        guard let tag = NameCipher.keyTag(of: stored), let key = heldNameKeys().byTag[tag],
              let tweak = try? tweak(of: directory) else { return nil }
        var longForm = longForm
        if longForm == nil, NameCipher.isLong(stored) { longForm = readLongForm(stored, in: directory) }
        return try? NameCipher.decrypt(stored, full: longForm, tweak: tweak, key: key)
    }

    private func readLongForm(_ stored: String, in directory: Inode) -> String? {
        Self.longForm { (bytes) throws(Errno) in try Syscall.getxattr(in: directory.fd, stored, storeAttributes.longName, bytes.baseAddress, bytes.count) }
    }

    /// The long form `read` finds (it reads `StoreAttributes.longName` into a buffer); nil when none.
    static func longForm(_ read: (UnsafeMutableRawBufferPointer) throws(Errno) -> Int) -> String? {
        var buffer = [UInt8](repeating: 0, count: 512)
        let count = buffer.withUnsafeMutableBytes { bytes in (try? read(bytes)) ?? -1 }
        guard count > 0 else { return nil }
        return String(validating: buffer.prefix(count), as: UTF8.self)
    }

    /// The name a listing of the directory `fd` (whose tweak is `tweak`) shows for `stored`:
    /// decrypted where its key is held, as stored where it is not (for walks by descriptor).
    func listedName(_ stored: FileName, inDirectory fd: Int32, tweak: [UInt8]?) -> FileName {
        guard engine != nil, let tweak, let text = stored.text, text.hasBytePrefix(NameCipher.prefix),
              let tag = NameCipher.keyTag(of: text), let key = heldNameKeys().byTag[tag] else { return stored }
        let longForm = NameCipher.isLong(text)
            ? Self.longForm { (bytes) throws(Errno) in try Syscall.getxattr(in: fd, text, storeAttributes.longName, bytes.baseAddress, bytes.count) }
            : nil
        guard let plain = try? NameCipher.decrypt(text, full: longForm, tweak: tweak, key: key) else { return stored }
        return FileName(bytes: plain)
    }

    /// A path below the backing directory `base` as the mount shows it: each encrypted name
    /// decrypted where its key is held (for messages and events; by path, as they are rare).
    func shownPath(ofStored relative: String, below base: String) -> String {
        guard engine != nil, relative.utf8.contains(0x7E) else { return relative }
        var storedSoFar = base
        var shown: [String] = []
        for name in relative.split(separator: "/", omittingEmptySubsequences: true).map(String.init) {
            defer { storedSoFar += "/" + name }
            guard name.hasBytePrefix(NameCipher.prefix), let tag = NameCipher.keyTag(of: name), let key = heldNameKeys().byTag[tag],
                  let tweak = try? DirectoryTweak.read(storedSoFar, names: storeAttributes) else {
                shown.append(name)
                continue
            }
            let path = storedSoFar + "/" + name
            let longForm = NameCipher.isLong(name)
                ? Self.longForm { (bytes) throws(Errno) in try Syscall.lgetxattr(path, storeAttributes.longName, bytes.baseAddress, bytes.count) }
                : nil
            if let plain = try? NameCipher.decrypt(name, full: longForm, tweak: tweak, key: key) {
                shown.append(FileName(bytes: plain).description)
            } else {
                shown.append(name)
            }
        }
        return shown.joined(separator: "/")
    }

    // MARK: Symlink targets

    /// The target a symlink made with `target` stores: sealed with `key`, or as given.
    func storedTarget(_ target: UnsafePointer<CChar>, key: NameKey?) throws(Errno) -> [CChar] {
        guard let key else { return Array(UnsafeBufferPointer(start: target, count: strlen(target) + 1)) }
        let bytes = Array(UnsafeRawBufferPointer(start: target, count: strlen(target)))
        let sealed: String
        do throws(FormatError) { sealed = try NameCipher.sealTarget(bytes, key: key) } catch {
            throw Errno.nameTooLong
        }
        // What a symlink can hold on Linux: PATH_MAX with its NUL.
        guard sealed.utf8.count < Int(PATH_MAX) else { throw Errno.nameTooLong }
        return FileName(sealed).cString
    }

    /// The target a symlink shows, from what it stores: opened when its key is held, as stored
    /// when not (EIO when it is held but the target does not open: changed on the disk).
    func shownTarget(_ stored: [CChar]) throws(Errno) -> [CChar] {
        guard engine != nil, stored.count > 3, stored[0] == 0x7E, stored[1] == 0x63, stored[2] == 0x33 else { return stored }
        let text = String(decoding: stored.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let tag = NameCipher.keyTag(of: text), let key = heldNameKeys().byTag[tag] else { return stored }
        do throws(FormatError) {
            return FileName(bytes: try NameCipher.openTarget(text, key: key)).cString
        } catch {
            log("a symlink's target does not open with its key: changed on the disk")
            throw Errno.ioError
        }
    }
}
