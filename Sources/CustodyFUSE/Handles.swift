import CustodySystem
import Glibc
import Synchronization

/// An open regular file, held by the kernel as `fh`: a descriptor on the backing file (plain
/// files), or the inode's shared decrypted content (encrypted files).
final class OpenFile: @unchecked Sendable {
    /// The backing descriptor of a plain file; -1 for an encrypted one.
    let fd: Int32
    let inode: Inode?
    /// The shared content of an encrypted file. A lock revokes it; the handle then takes a fresh
    /// one (after unlock), so that long-running programs carry on.
    private let contentBox: Mutex<ProtectedContent?>
    /// Set when the handle's data crosses identities (see `TransferGrant`).
    let grant: TransferGrant?

    /// A plain file's handle, counted on its inode.
    init(fd: Int32, inode: Inode, grant: TransferGrant? = nil) {
        self.fd = fd
        self.inode = inode
        self.grant = grant
        self.contentBox = Mutex(nil)
        inode.protectionState.withLock {
            $0.openHandles += 1
            $0.plainHandle = self
        }
    }

    /// An encrypted file's handle, counted on its inode.
    init(content: ProtectedContent, inode: Inode, grant: TransferGrant? = nil) {
        self.fd = -1
        self.inode = inode
        self.grant = grant
        self.contentBox = Mutex(content)
        inode.protectionState.withLock { $0.openHandles += 1 }
    }

    deinit { if fd >= 0 { Syscall.close(fd) } }

    var content: ProtectedContent? { contentBox.withLock { $0 } }

    /// Puts `new` in place of `old`; false when another request replaced it first.
    func replaceContent(_ old: ProtectedContent, with new: ProtectedContent) -> Bool {
        contentBox.withLock { current in
            guard current === old else { return false }
            current = new
            return true
        }
    }

    /// The descriptor to sync, flush or stat: the content's for an encrypted file.
    var backingFD: Int32 { content?.fd ?? fd }
}

/// An open directory being listed: a `DIR*` stream and the offset the kernel last asked for.
final class OpenDirectory: @unchecked Sendable {
    struct Stream: ~Copyable, @unchecked Sendable {
        /// The `DIR*`, only ever used under the mutex.
        let dir: OpaquePointer
        /// The offset the stream is at, in telldir() units; 0 is the start.
        var offset: Int64 = 0
    }

    let stream: Mutex<Stream>
    /// A descriptor for fsyncdir (the stream's own descriptor must not be used concurrently).
    let fd: Int32

    init(dir: OpaquePointer) {
        self.fd = Glibc.dirfd(dir)
        self.stream = Mutex(Stream(dir: dir))
    }

    deinit {
        stream.withLock { _ = closedir($0.dir) }
    }
}

/// Turns handle objects into the 64-bit `fh` the kernel stores, and back.
enum HandleBox {
    static func store<T: AnyObject>(_ object: T) -> UInt64 {
        UInt64(UInt(bitPattern: Unmanaged.passRetained(object).toOpaque()))
    }

    /// The object behind `fh`, still owned by the kernel's handle; nil for an empty handle.
    static func borrow<T: AnyObject>(_ fh: UInt64, as type: T.Type) -> T? {
        guard let pointer = UnsafeRawPointer(bitPattern: UInt(fh)) else { return nil }
        return Unmanaged<T>.fromOpaque(pointer).takeUnretainedValue()
    }

    /// Ends the kernel's ownership of the object behind `fh`.
    @discardableResult
    static func release<T: AnyObject>(_ fh: UInt64, as type: T.Type) -> T? {
        guard let pointer = UnsafeRawPointer(bitPattern: UInt(fh)) else { return nil }
        return Unmanaged<T>.fromOpaque(pointer).takeRetainedValue()
    }
}
