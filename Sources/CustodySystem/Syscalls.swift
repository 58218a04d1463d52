import CLinux
import Glibc
import Synchronization

/// Thin, typed wrappers over the syscalls the file system front ends use. Each returns its
/// result or throws `Errno`; none allocates on success unless it returns a `String` or bytes.
public enum Syscall {
    // MARK: Descriptors

    @inlinable
    public static func openat(_ dir: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: mode_t = 0) throws(Errno) -> Int32 {
        try retryingOnInterrupt { Glibc.openat(dir, path, flags, mode) }
    }

    @inlinable
    public static func open(_ path: UnsafePointer<CChar>, _ flags: Int32, _ mode: mode_t = 0) throws(Errno) -> Int32 {
        try retryingOnInterrupt { Glibc.open(path, flags, mode) }
    }

    /// Closes `fd`. A close error is not actionable after the descriptor is gone, so it is ignored.
    @inlinable
    public static func close(_ fd: Int32) { _ = Glibc.close(fd) }

    @inlinable
    public static func dup(_ fd: Int32) throws(Errno) -> Int32 {
        try valueOrErrno(Glibc.dup(fd))
    }

    /// The `/proc/self/fd/N` path of a descriptor: how calls without an `f…` or `…at` form
    /// (xattrs, truncate, chmod of an O_PATH descriptor) reach the file it refers to.
    @inlinable
    public static func procPath(_ fd: Int32) -> String { "/proc/self/fd/\(fd)" }

    // MARK: Metadata

    @inlinable
    public static func fstatat(_ dir: Int32, _ path: UnsafePointer<CChar>, _ flags: Int32) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno(Glibc.fstatat(dir, path, &st, flags))
        return st
    }

    /// Attributes of what an (O_PATH) descriptor refers to, without following a symlink.
    @inlinable
    public static func stat(of fd: Int32) throws(Errno) -> stat {
        try fstatat(fd, "", Linux.AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
    }

    @inlinable
    public static func fstat(_ fd: Int32) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno(Glibc.fstat(fd, &st))
        return st
    }

    /// The file system's type (`statfs`'s magic number) of the file `fd` refers to.
    public static func fileSystemType(_ fd: Int32) throws(Errno) -> Int {
        let type = clinux_filesystem_type(fd)
        guard type >= 0 else { throw Errno.current }
        return type
    }

    @inlinable
    public static func lstat(_ path: UnsafePointer<CChar>) throws(Errno) -> stat {
        var st = Glibc.stat()
        _ = try valueOrErrno(Glibc.lstat(path, &st))
        return st
    }

    @inlinable
    public static func fchmod(_ fd: Int32, _ mode: mode_t) throws(Errno) {
        _ = try valueOrErrno(Glibc.fchmod(fd, mode))
    }

    @inlinable
    public static func chmod(_ path: UnsafePointer<CChar>, _ mode: mode_t) throws(Errno) {
        _ = try valueOrErrno(Glibc.chmod(path, mode))
    }

    /// Sets the mode of what `fd` (an O_PATH descriptor included) refers to, in one call where the
    /// kernel has `fchmodat2` (Linux 6.6); elsewhere by its /proc path, a walk of /proc per call.
    public static func chmod(of fd: Int32, _ mode: mode_t) throws(Errno) {
        if !noFchmodat2.load(ordering: .relaxed) {
            if clinux_fchmod_path(fd, UInt32(mode)) == 0 { return }
            let error = Errno.current
            if error == .notImplemented {
                noFchmodat2.store(true, ordering: .relaxed)
            } else if error != .notPermitted {
                // EPERM may be a system call filter's answer as well as the file's: the path says.
                throw error
            }
        }
        try chmod(procPath(fd), mode)
    }

    /// Set once `fchmodat2` turned out to be missing.
    static let noFchmodat2 = Atomic<Bool>(false)

    @inlinable
    public static func fchownat(_ dir: Int32, _ path: UnsafePointer<CChar>, _ uid: uid_t, _ gid: gid_t, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(Glibc.fchownat(dir, path, uid, gid, flags))
    }

    @inlinable
    public static func ftruncate(_ fd: Int32, _ size: Int64) throws(Errno) {
        _ = try retryingOnInterrupt { Glibc.ftruncate(fd, off_t(size)) }
    }

    @inlinable
    public static func truncate(_ path: UnsafePointer<CChar>, _ size: Int64) throws(Errno) {
        _ = try retryingOnInterrupt { Glibc.truncate(path, off_t(size)) }
    }

    @inlinable
    public static func futimens(_ fd: Int32, _ times: [timespec]) throws(Errno) {
        _ = try valueOrErrno(Glibc.futimens(fd, times))
    }

    @inlinable
    public static func utimensat(_ dir: Int32, _ path: UnsafePointer<CChar>, _ times: [timespec], _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(Glibc.utimensat(dir, path, times, flags))
    }

    /// Sets the times of what `fd` (an O_PATH descriptor included) refers to: `utimensat` with
    /// `AT_EMPTY_PATH` (Linux 5.8), else by its /proc path.
    public static func utimens(of fd: Int32, _ times: [timespec]) throws(Errno) {
        if Glibc.utimensat(fd, "", times, Linux.AT_EMPTY_PATH) == 0 { return }
        let error = Errno.current
        // EINVAL: a kernel without AT_EMPTY_PATH here (or times it refuses either way).
        guard error == .invalidArgument || error == .notImplemented || error == .notPermitted else { throw error }
        try utimensat(AT_FDCWD, procPath(fd), times, 0)
    }

    @inlinable
    public static func fstatvfs(_ fd: Int32) throws(Errno) -> statvfs {
        var st = statvfs()
        _ = try valueOrErrno(Glibc.fstatvfs(fd, &st))
        return st
    }

    @inlinable
    public static func faccessat(_ dir: Int32, _ path: UnsafePointer<CChar>, _ mode: Int32, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(Glibc.faccessat(dir, path, mode, flags))
    }

    // MARK: Names

    @inlinable
    public static func mkdirat(_ dir: Int32, _ name: UnsafePointer<CChar>, _ mode: mode_t) throws(Errno) {
        _ = try valueOrErrno(Glibc.mkdirat(dir, name, mode))
    }

    @inlinable
    public static func mknodat(_ dir: Int32, _ name: UnsafePointer<CChar>, _ mode: mode_t, _ device: dev_t) throws(Errno) {
        _ = try valueOrErrno(Glibc.mknodat(dir, name, mode, device))
    }

    @inlinable
    public static func symlinkat(_ target: UnsafePointer<CChar>, _ dir: Int32, _ name: UnsafePointer<CChar>) throws(Errno) {
        _ = try valueOrErrno(Glibc.symlinkat(target, dir, name))
    }

    /// The target of a symlink (a path: bytes that are not UTF-8 are replaced).
    public static func readlink(_ path: String) throws(Errno) -> String {
        let target = try readlinkat(AT_FDCWD, path)
        return String(decoding: target.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The target of a symlink, byte for byte (to reach what it names).
    public static func readlinkName(_ path: String) throws(Errno) -> FileName {
        let target = try readlinkat(AT_FDCWD, path)
        return FileName(bytes: target.lazy.map { UInt8(bitPattern: $0) })
    }

    /// The target of a symlink, as raw bytes followed by a NUL.
    public static func readlinkat(_ dir: Int32, _ path: UnsafePointer<CChar>) throws(Errno) -> [CChar] {
        var capacity = 256
        while true {
            var buffer = [CChar](repeating: 0, count: capacity + 1)
            let count = try valueOrErrno(Glibc.readlinkat(dir, path, &buffer, capacity))
            if count < capacity {
                buffer[count] = 0
                return Array(buffer[0...count])
            }
            capacity *= 4
            if capacity > 1 << 20 { throw Errno.nameTooLong }
        }
    }

    @inlinable
    public static func linkat(_ fromDir: Int32, _ from: UnsafePointer<CChar>, _ toDir: Int32, _ to: UnsafePointer<CChar>, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(Glibc.linkat(fromDir, from, toDir, to, flags))
    }

    @inlinable
    public static func unlinkat(_ dir: Int32, _ name: UnsafePointer<CChar>, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(Glibc.unlinkat(dir, name, flags))
    }

    @inlinable
    public static func renameat2(_ fromDir: Int32, _ from: UnsafePointer<CChar>, _ toDir: Int32, _ to: UnsafePointer<CChar>, _ flags: UInt32) throws(Errno) {
        _ = try valueOrErrno(clinux_renameat2(fromDir, from, toDir, to, flags))
    }

    // MARK: Data

    @inlinable
    public static func pread(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) throws(Errno) -> Int {
        try retryingOnInterrupt { Glibc.pread(fd, buffer, count, off_t(offset)) }
    }

    @inlinable
    public static func pwrite(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) throws(Errno) -> Int {
        try retryingOnInterrupt { Glibc.pwrite(fd, buffer, count, off_t(offset)) }
    }

    /// Reads up to `count` bytes, looping over short reads until `count` or the end of the file;
    /// returns how many were read.
    public static func preadAll(_ fd: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int, _ offset: Int64) throws(Errno) -> Int {
        var done = 0
        while done < count {
            let n = try pread(fd, buffer + done, count - done, offset + Int64(done))
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// Writes all of `count` bytes, looping over short writes.
    public static func pwriteAll(_ fd: Int32, _ buffer: UnsafeRawPointer, _ count: Int, _ offset: Int64) throws(Errno) {
        var done = 0
        while done < count {
            let n = try pwrite(fd, buffer + done, count - done, offset + Int64(done))
            if n == 0 { throw Errno.ioError }
            done += n
        }
    }

    @inlinable
    public static func fsync(_ fd: Int32) throws(Errno) {
        _ = try retryingOnInterrupt { Glibc.fsync(fd) }
    }

    @inlinable
    public static func fdatasync(_ fd: Int32) throws(Errno) {
        _ = try retryingOnInterrupt { Glibc.fdatasync(fd) }
    }

    @inlinable
    public static func fallocate(_ fd: Int32, _ mode: Int32, _ offset: Int64, _ length: Int64) throws(Errno) {
        _ = try retryingOnInterrupt { clinux_fallocate(fd, mode, offset, length) }
    }

    @inlinable
    public static func lseek(_ fd: Int32, _ offset: Int64, _ whence: Int32) throws(Errno) -> Int64 {
        Int64(try valueOrErrno(Glibc.lseek(fd, off_t(offset), whence)))
    }

    @inlinable
    public static func copyFileRange(_ input: Int32, _ inputOffset: inout Int64, _ output: Int32, _ outputOffset: inout Int64, _ length: Int, _ flags: UInt32) throws(Errno) -> Int {
        try retryingOnInterrupt { clinux_copy_file_range(input, &inputOffset, output, &outputOffset, length, flags) }
    }

    // MARK: Extended attributes (by path: they do not work on O_PATH descriptors)

    @inlinable
    public static func getxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int {
        try valueOrErrno(clinux_getxattr(path, name, buffer, size))
    }

    /// Attribute `name` of `path` in the directory `directory` (a final symlink not followed), in
    /// one call where the kernel has `getxattrat` (Linux 6.13); elsewhere through
    /// `/proc/self/fd/N/path` (`lgetxattr`), which walks /proc on every call.
    public static func getxattr(in directory: Int32, _ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>,
                                _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int {
        if !noGetxattrat.load(ordering: .relaxed) {
            let count = clinux_getxattrat(directory, path, name, buffer, size)
            if count >= 0 { return count }
            let error = Errno.current
            // Not there (an older kernel), or refused by a system call filter: use the path.
            guard error == .notImplemented || error == .notPermitted else { throw error }
            noGetxattrat.store(true, ordering: .relaxed)
        }
        return try lgetxattr(FileName(cString: path).appended(to: FileName(procPath(directory))).cString, name, buffer, size)
    }

    /// Set once `getxattrat` turned out to be missing.
    static let noGetxattrat = Atomic<Bool>(false)

    /// Sets attribute `name` of the entry `path` in `directory` (a final symlink not followed) in
    /// one call, where the kernel has `setxattrat` (Linux 6.13): a lookup of one name, where the
    /// alternatives open the entry first or walk /proc. False where the kernel lacks it, or where
    /// it is refused (EPERM: a system call filter, or no permission, which the other way then
    /// reports): the caller then sets it another way.
    public static func setxattr(in directory: Int32, _ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>,
                                _ value: UnsafeRawPointer?, _ size: Int, _ flags: Int32) throws(Errno) -> Bool {
        guard !noSetxattrat.load(ordering: .relaxed) else { return false }
        guard clinux_setxattrat(directory, path, name, value, size, flags) < 0 else { return true }
        let error = Errno.current
        guard error == .notImplemented || error == .notPermitted else { throw error }
        if error == .notImplemented { noSetxattrat.store(true, ordering: .relaxed) }
        return false
    }

    /// Set once `setxattrat` turned out to be missing.
    static let noSetxattrat = Atomic<Bool>(false)

    /// Attribute `name` of the entry `path` in `directory`, provided that entry is still the object
    /// `device`/`number`: `getxattrat`, then an `fstatat` confirming the name still leads there,
    /// two lookups of one name each, where `getxattr` on /proc/self/fd/N walks /proc (5 µs, 10–20
    /// under load here). nil where the kernel lacks `getxattrat`, or the name is gone or names
    /// another object now: the caller then asks by the object's /proc path.
    public static func getxattr(in directory: Int32, _ path: UnsafePointer<CChar>, ifStill device: UInt64, _ number: UInt64,
                                _ name: UnsafePointer<CChar>, _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int? {
        guard !noGetxattrat.load(ordering: .relaxed) else { return nil }
        let count = clinux_getxattrat(directory, path, name, buffer, size)
        let error = count < 0 ? Errno.current : nil
        if error == .notImplemented || error == .notPermitted {
            if error == .notImplemented { noGetxattrat.store(true, ordering: .relaxed) }
            return nil
        }
        // Confirmed after the read: an answer (or "no such attribute") about another object is
        // never returned.
        guard let st = try? fstatat(directory, path, AT_SYMLINK_NOFOLLOW),
              UInt64(st.st_dev) == device, UInt64(st.st_ino) == number else { return nil }
        if let error { throw error }
        return count
    }

    public static func lgetxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int {
        try valueOrErrno(clinux_lgetxattr(path, name, buffer, size))
    }

    @inlinable
    public static func setxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer?, _ size: Int, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(clinux_setxattr(path, name, value, size, flags))
    }

    /// `setxattr` on `path` itself, a final symlink not followed.
    public static func lsetxattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer?, _ size: Int, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(clinux_lsetxattr(path, name, value, size, flags))
    }

    @inlinable
    public static func listxattr(_ path: UnsafePointer<CChar>, _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int) throws(Errno) -> Int {
        try valueOrErrno(clinux_listxattr(path, buffer, size))
    }

    /// The names of the extended attributes of `path` (`listxattr`, read into a buffer of the size
    /// it asks for; names as UTF-8, lossily).
    public static func attributeNames(_ path: String) throws(Errno) -> [String] {
        let size = try listxattr(path, nil, 0)
        guard size > 0 else { return [] }
        var raw = [CChar](repeating: 0, count: size)
        let count = try raw.withMutableBytes { (buffer) throws(Errno) in
            try listxattr(path, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), size)
        }
        return raw[0..<min(count, size)].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
    }

    @inlinable
    public static func removexattr(_ path: UnsafePointer<CChar>, _ name: UnsafePointer<CChar>) throws(Errno) {
        _ = try valueOrErrno(clinux_removexattr(path, name))
    }

    /// Starts writing the file's dirty pages to disk and returns without waiting (a later fsync
    /// then finds most of the work done).
    @inlinable
    public static func startWriteback(_ fd: Int32) {
        _ = clinux_start_writeback(fd)
    }

    /// Starts reading `length` bytes at `offset` into the page cache and returns without waiting
    /// (one disk request for what several small reads would fetch one by one).
    @inlinable
    public static func willNeed(_ fd: Int32, offset: Int64, length: Int64) {
        _ = clinux_will_need(fd, offset, length)
    }

    /// On an open descriptor (not `O_PATH`), without a path lookup.
    @inlinable
    public static func fsetxattr(_ fd: Int32, _ name: UnsafePointer<CChar>, _ value: UnsafeRawPointer?, _ size: Int, _ flags: Int32) throws(Errno) {
        _ = try valueOrErrno(clinux_fsetxattr(fd, name, value, size, flags))
    }

    /// On an open descriptor (not `O_PATH`), without a path lookup.
    @inlinable
    public static func fgetxattr(_ fd: Int32, _ name: UnsafePointer<CChar>, _ buffer: UnsafeMutableRawPointer?, _ size: Int) throws(Errno) -> Int {
        try valueOrErrno(clinux_fgetxattr(fd, name, buffer, size))
    }

    /// On an open descriptor (not `O_PATH`), without a path lookup.
    @inlinable
    public static func fremovexattr(_ fd: Int32, _ name: UnsafePointer<CChar>) throws(Errno) {
        _ = try valueOrErrno(clinux_fremovexattr(fd, name))
    }
}

extension Syscall {
    /// The names in the directory `directory` (a descriptor, O_PATH allowed), without `.` and `..`.
    public static func directoryNames(in directory: Int32) throws(Errno) -> [FileName] {
        let fd = try openat(directory, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard let stream = fdopendir(fd) else {
            let error = Errno.current
            close(fd)
            throw error
        }
        defer { closedir(stream) }
        var names: [FileName] = []
        while let entry = readdir(stream) {
            let name = withUnsafePointer(to: entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: MemoryLayout.size(ofValue: entry.pointee.d_name)) { FileName(cString: $0) }
            }
            if !name.isDotOrDotDot { names.append(name) }
        }
        return names
    }

    /// Opens the object `components` names below the directory `root`, one name at a time and
    /// following no symbolic link (the last one opened with `flags`), so that a tree changed
    /// meanwhile cannot lead outside `root`.
    public static func openBeneath(_ root: Int32, _ components: [FileName], _ flags: Int32) throws(Errno) -> Int32 {
        guard let last = components.last, !components.contains(where: { $0.isDotOrDotDot || $0.isEmpty }) else { throw Errno.invalidArgument }
        var directory = root
        defer { if directory != root { close(directory) } }
        for name in components.dropLast() {
            let next = try openat(directory, name.cString, Linux.O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            if directory != root { close(directory) }
            directory = next
        }
        return try openat(directory, last.cString, flags | O_NOFOLLOW)
    }

    /// The names in the directory at `path`, without `.` and `..`.
    public static func directoryNames(atPath path: String) throws(Errno) -> [FileName] {
        let fd = try open(path, Linux.O_PATH | O_DIRECTORY | O_CLOEXEC)
        defer { close(fd) }
        return try directoryNames(in: fd)
    }
}

extension Syscall {
    /// Puts the anonymous (`O_TMPFILE`) file `staging` in place of `name` in `directory`,
    /// crash-safely: it is linked under a temporary name (`prefix` and random letters), renamed
    /// over `name`, and the directory is synced. The caller has synced `staging` itself.
    public static func publishTemporary(_ staging: Int32, in directory: Int32, as name: UnsafePointer<CChar>, prefix: String) throws(Errno) {
        let temporary = prefix + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        try linkat(AT_FDCWD, procPath(staging), directory, temporary, AT_SYMLINK_FOLLOW)
        try publishNamed(temporary, in: directory, as: name)
    }

    /// A new file to be published over a name in `directory`: anonymous (`O_TMPFILE`, gone if the
    /// process dies) where the file system has them, else, as in a FUSE mount, created under a
    /// temporary name (`prefix` and random letters), returned with it.
    public static func createStaging(in directory: Int32, mode: mode_t, prefix: String) throws(Errno) -> (fd: Int32, name: String?) {
        do {
            return (try openat(directory, ".", Linux.O_TMPFILE | O_RDWR | O_CLOEXEC, mode), nil)
        } catch where error == .notSupported || error == .isDirectory {
            let name = prefix + String(UInt64.random(in: 0...UInt64.max), radix: 36)
            return (try openat(directory, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, mode), name)
        }
    }

    /// Publishes a file from `createStaging` over `name` (see `publishTemporary`).
    public static func publishStaging(_ staging: (fd: Int32, name: String?), in directory: Int32, as name: UnsafePointer<CChar>, prefix: String) throws(Errno) {
        if let temporary = staging.name {
            try publishNamed(temporary, in: directory, as: name)
        } else {
            try publishTemporary(staging.fd, in: directory, as: name, prefix: prefix)
        }
    }

    /// Removes a named staging file that was not published (an anonymous one just goes away).
    public static func discardStaging(_ staging: (fd: Int32, name: String?), in directory: Int32) {
        if let temporary = staging.name { _ = Glibc.unlinkat(directory, temporary, 0) }
    }

    private static func publishNamed(_ temporary: String, in directory: Int32, as name: UnsafePointer<CChar>) throws(Errno) {
        do {
            try renameat2(directory, temporary, directory, name, 0)
        } catch {
            _ = Glibc.unlinkat(directory, temporary, 0)
            throw error
        }
        try fsync(directory)
    }

    /// Splits a path into its directory (`.` when it has none) and last name, at its last slash
    /// byte (a slash followed by a combining mark is still a slash).
    public static func split(_ path: String) -> (directory: String, name: String) {
        let bytes = path.utf8
        guard let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return (".", path) }
        let directory = slash == bytes.startIndex ? "/" : String(decoding: bytes[..<slash], as: UTF8.self)
        return (directory, String(decoding: bytes[bytes.index(after: slash)...], as: UTF8.self))
    }

    /// `split` for a path as the kernel gave it (bytes, such as a link's target).
    public static func split(_ path: FileName) -> (directory: FileName, name: FileName) {
        let bytes = path.bytes
        guard let slash = bytes.lastIndex(of: UInt8(ascii: "/")) else { return (FileName("."), path) }
        return (slash == 0 ? FileName("/") : FileName(bytes: bytes[..<slash]), FileName(bytes: bytes[(slash + 1)...]))
    }
}

extension Syscall {
    /// Raises the open-descriptor limit as far as allowed: the mount keeps one `O_PATH`
    /// descriptor per inode the kernel knows, so a large tree needs many. Root may go up to
    /// `fs.nr_open`; others to their hard limit. Returns the new soft limit.
    @discardableResult
    public static func raiseDescriptorLimit() -> UInt64 {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        let systemMaximum = readTextFile("/proc/sys/fs/nr_open").flatMap { UInt64($0.trimmingWhitespace()) } ?? 0
        if systemMaximum > limit.rlim_max {
            var wanted = rlimit(rlim_cur: rlim_t(systemMaximum), rlim_max: rlim_t(systemMaximum))
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &wanted) == 0 { return systemMaximum }
        }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        return UInt64(limit.rlim_cur)
    }

    /// Gives the heap's free memory back to the kernel: called once a burst of requests is over,
    /// so that buffers freed during the burst do not stay resident while the daemon is idle.
    public static func releaseFreeMemory() {
        _ = clinux_release_free_memory()
    }
}
