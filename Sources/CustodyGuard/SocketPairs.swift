import CLinux
import CustodySystem
import Glibc

/// The processes it started that are at the other end of a process's socketpairs (Unix sockets
/// connected without an address, neither end bound: what a program makes for its own helpers, as
/// rsync does between the process that reads and the one that writes). They come to hold what the
/// process holds:
/// data read by one end is written by the other. Pipes are not followed (a program that captures
/// another's output would hold data it never asked for, a shell pipeline's reader is started
/// before the writer reads: docs/guard.md), nor sockets with an address (a service's: D-Bus, the
/// journal, a display server).
enum SocketPairs {
    static func peers(of pid: Int32) -> [Int32] {
        let own = socketInodes(of: pid)
        guard !own.isEmpty else { return [] }
        var buffer = [clinux_unix_socket](repeating: clinux_unix_socket(), count: 65536)
        let count = buffer.withUnsafeMutableBufferPointer { clinux_unix_sockets($0.baseAddress, Int32($0.count)) }
        guard count > 0 else { return [] }
        var sockets: [UInt64: (peer: UInt64, named: Bool)] = [:]
        for entry in buffer.prefix(Int(count)) { sockets[entry.inode] = (entry.peer, entry.named != 0) }
        var wanted: Set<UInt64> = []
        for inode in own {
            guard let socket = sockets[inode], !socket.named, socket.peer != 0, let peer = sockets[socket.peer], !peer.named else { continue }
            wanted.insert(socket.peer)
        }
        guard !wanted.isEmpty else { return [] }
        return (Syscall.numberedEntries("/proc") ?? []).filter { other in
            other != pid && other != getpid() && !socketInodes(of: other).isDisjoint(with: wanted) && descends(other, from: pid)
        }
    }

    /// Whether `process` was started by `ancestor` (directly or not). Only the process's own
    /// helpers count: a socket another program leaked into it leads to that program, which did
    /// not read anything.
    static func descends(_ process: Int32, from ancestor: Int32) -> Bool {
        var current = process
        for _ in 0..<64 {
            guard let stat = ProcessStat(current), stat.parent > 1 else { return false }
            if stat.parent == ancestor { return true }
            current = stat.parent
        }
        return false
    }

    /// The inodes of the sockets among `pid`'s descriptors ("socket:[N]").
    static func socketInodes(of pid: Int32) -> Set<UInt64> {
        var result: Set<UInt64> = []
        for fd in Syscall.numberedEntries("/proc/\(pid)/fd") ?? [] {
            guard let text = try? Syscall.readlink("/proc/\(pid)/fd/\(fd)"), text.hasPrefix("socket:["), text.hasSuffix("]"),
                  let inode = UInt64(text.dropFirst(8).dropLast()) else { continue }
            result.insert(inode)
        }
        return result
    }
}
