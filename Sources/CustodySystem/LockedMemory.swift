import CLinux
import Glibc
import Synchronization

/// Buffers that hold plaintext are kept out of core dumps (`MADV_DONTDUMP`) and, while there is
/// room, locked in memory (out of swap). Locking takes at most half of `RLIMIT_MEMLOCK`: the
/// rest stays for the keys (libsodium's secure memory), which matter more.
public enum LockedMemory {
    private static let budget: Int = {
        let limit = clinux_memlock_limit()
        return limit < 0 ? Int.max / 2 : Int(limit / 2)
    }()
    private static let used = Atomic<Int>(0)

    /// Protects a mapped, page-aligned region; true when it was locked too (then call `released`
    /// with its size when it is unmapped).
    public static func protect(_ address: UnsafeMutableRawPointer, _ count: Int) -> Bool {
        let (after, _) = used.add(count, ordering: .relaxed)
        guard after <= budget else {
            used.subtract(count, ordering: .relaxed)
            _ = clinux_protect_memory(address, count, 0)
            return false
        }
        if clinux_protect_memory(address, count, 1) == 1 { return true }
        used.subtract(count, ordering: .relaxed)
        return false
    }

    /// A locked region of `count` bytes was unmapped (which unlocks it).
    public static func released(_ count: Int) {
        used.subtract(count, ordering: .relaxed)
    }

    /// Bytes locked so far through `protect`.
    public static var lockedBytes: Int { used.load(ordering: .relaxed) }
}
