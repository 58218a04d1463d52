import CFuse3
import CustodyCore
import CustodyFormat
import CustodySystem
import Glibc
import Synchronization

/// A handle whose data crosses identities (allowed when it was opened): every read and write of
/// it reaches the daemon (`direct_io`) and checks the grant again once a policy or the settings
/// changed, so a policy that now refuses fails the handle's next request, like a lock.
final class TransferGrant: Sendable {
    let owner: String?
    let caller: String?
    let party: TransferParty
    let reads: Bool
    let writes: Bool
    /// Every request of the handle reaches the daemon (`direct_io`). Not for exempt programs
    /// (an administrator's backup agent or indexer), which keep the page cache and shared
    /// mappings; FUSE before libfuse 3.16 cannot map `direct_io` files shared.
    let bypassesCache: Bool
    /// The policy generation the answer below was made in, and the answer.
    private let checked: Mutex<(generation: UInt64, readAllowed: Bool, writeAllowed: Bool)>

    init(owner: String?, caller: String?, party: TransferParty, reads: Bool, writes: Bool, bypassesCache: Bool, generation: UInt64) {
        self.bypassesCache = bypassesCache
        self.owner = owner
        self.caller = caller
        self.party = party
        self.reads = reads
        self.writes = writes
        self.checked = Mutex((generation, true, true))
    }

    /// Whether the handle may still read (`write == false`) or write.
    func permits(write: Bool, engine: Engine) -> Bool {
        let generation = engine.currentPolicyGeneration
        let known = checked.withLock { $0 }
        if known.generation == generation { return write ? known.writeAllowed : known.readAllowed }
        let readAllowed = !reads || engine.transferDecision(from: owner, to: caller, by: party).allowed
        let writeAllowed = !writes || engine.transferDecision(from: caller, to: owner, by: party).allowed
        checked.withLock { $0 = (generation, readAllowed, writeAllowed) }
        return write ? writeAllowed : readAllowed
    }
}

/// The identity boundary in the mount: opening a file moves data between the caller's effective
/// identity and the file's owner (reading: owner → caller; writing: caller → owner), and the
/// engine's transfer rules decide it before any byte is served. See docs/identity.md.
extension MountFileSystem {
    /// Decides an open of `inode` with `flags` by the caller of `req`. Refused: reported and
    /// EACCES. Allowed within one identity: nil. Allowed across identities: a grant for the handle.
    func checkTransfer(_ req: fuse_req_t, _ inode: Inode, flags: Int32) throws(Errno) -> TransferGrant? {
        guard let engine, inode.isRegularFile else { return nil }
        let owner = protection(of: inode).owner?.display
        guard engine.transfersNeedChecking(owner: owner), let context = fuse_req_ctx(req)?.pointee else { return nil }
        let caller = engine.resolve(thread: context.pid, uid: context.uid).identity
        let party = TransferParty.process(context.pid, uid: context.uid)
        let access = flags & O_ACCMODE
        let reads = access != O_WRONLY, writes = access != O_RDONLY
        var crossing = false, onlyExempt = true
        if reads {
            let decision = engine.transferDecision(from: owner, to: caller, by: party)
            guard decision.allowed else { throw refuse(decision, from: owner, to: caller, party, "read", inode) }
            crossing = crossing || decision.crossesIdentities
            if decision.crossesIdentities, !decision.exempt { onlyExempt = false }
        }
        if writes {
            let decision = engine.transferDecision(from: caller, to: owner, by: party)
            guard decision.allowed else { throw refuse(decision, from: caller, to: owner, party, "write", inode) }
            crossing = crossing || decision.crossesIdentities
            if decision.crossesIdentities, !decision.exempt { onlyExempt = false }
        }
        guard crossing else { return nil }
        return TransferGrant(owner: owner, caller: caller, party: party, reads: reads, writes: writes,
                             bypassesCache: !onlyExempt, generation: engine.currentPolicyGeneration)
    }

    /// A read of a managed identity's file whose policy lists save-to locations makes the reading
    /// process a holder of that identity's data (the guard keeps it to those locations); refused
    /// when the process already has a file open for writing where the identity may not save.
    func checkHolding(_ req: fuse_req_t, _ inode: Inode, flags: Int32) throws(Errno) {
        guard let engine, inode.isRegularFile, flags & O_ACCMODE != O_WRONLY, flags & O_TRUNC == 0,
              let holders = engine.dataHolders, let account = engine.savingRestricted(owner: protection(of: inode).owner?.display),
              let context = fuse_req_ctx(req)?.pointee else { return }
        if engine.exemptFromHolding(.process(context.pid, uid: context.uid), account: account) { return }
        if let reason = holders.admit(thread: context.pid, holding: account) {
            log("refused: read of \(mountRelativePath(of: inode)) by pid \(context.pid): \(reason)")
            throw Errno.accessDenied
        }
    }

    /// A write into a managed identity's file (an open for writing, a create) whose policy lists
    /// open-from locations makes the writing process a receiver: the guard lets it read data only
    /// from those locations while it writes. Refused when it reads a file from elsewhere now.
    func checkReceiving(_ req: fuse_req_t, owner: String?, flags: Int32) throws(Errno) {
        guard let engine, flags & O_ACCMODE != O_RDONLY || flags & (O_TRUNC | O_CREAT) != 0, let holders = engine.dataHolders,
              let account = engine.openingRestricted(owner: owner), let context = fuse_req_ctx(req)?.pointee else { return }
        if engine.exemptFromHolding(.process(context.pid, uid: context.uid), account: account) { return }
        if let reason = holders.admit(thread: context.pid, writingInto: account) {
            log("refused: a write into \(account.upn)'s file by pid \(context.pid): \(reason)")
            throw Errno.accessDenied
        }
    }

    /// A file created by a caller with no identity in a directory with an owner becomes the
    /// directory owner's: that owner receives the caller's data.
    func checkCreateTransfer(_ req: fuse_req_t, caller: ResolvedIdentity, newOwner: String?, in directory: Inode) throws(Errno) {
        guard let engine, caller.identity == nil, let newOwner, engine.transfersNeedChecking(owner: nil),
              let context = fuse_req_ctx(req)?.pointee else { return }
        let party = TransferParty.process(context.pid, uid: context.uid)
        let decision = engine.transferDecision(from: nil, to: newOwner, by: party)
        guard decision.allowed else { throw refuse(decision, from: nil, to: newOwner, party, "create", directory) }
    }

    /// Whether an open handle may still move data (see `TransferGrant`); EACCES when not.
    func checkGrant(_ file: OpenFile, write: Bool) throws(Errno) {
        guard let grant = file.grant, let engine else { return }
        if !grant.permits(write: write, engine: engine) {
            if let inode = file.inode {
                let decision = write ? engine.transferDecision(from: grant.caller, to: grant.owner, by: grant.party)
                    : engine.transferDecision(from: grant.owner, to: grant.caller, by: grant.party)
                _ = refuse(decision, from: write ? grant.caller : grant.owner, to: write ? grant.owner : grant.caller,
                           grant.party, write ? "write" : "read", inode)
            }
            throw Errno.accessDenied
        }
    }

    private func refuse(_ decision: TransferDecision, from source: String?, to target: String?, _ party: TransferParty,
                        _ operation: String, _ inode: Inode) -> Errno {
        let path = mountRelativePath(of: inode)
        engine?.reportBlockedTransfer(decision, source: source, target: target, party: party, operation: operation, path: path)
        log("refused: \(operation) of \(path) by pid \(party.pid): \(decision.reason)")
        return Errno.accessDenied
    }

    /// Where `inode` is, relative to the mount's root ("" when unknown).
    func mountRelativePath(of inode: Inode) -> String {
        guard let root = try? inodes.inode(UInt64(FUSE_ROOT_ID)),
              let base = try? Syscall.readlink(root.procPath), let full = try? Syscall.readlink(inode.procPath) else { return "" }
        guard full.hasBytePrefix(base) else { return "" }
        return shownPath(ofStored: String(full.droppingBytes(base.utf8.count).drop { $0 == "/" }), below: base)
    }
}
