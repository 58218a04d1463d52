import CustodySystem
import Glibc

/// Whether a running process is one of the programs exempt from the transfer rules
/// (`TransferExemptExecutables`, a policy's `transferExemptExecutables`). See docs/identity.md,
/// "What an exemption trusts".
///
/// A process is that program when the kernel says so, in the daemon's view, not when the process
/// says so: it runs in the daemon's mount and user namespaces (a path means the same file there),
/// its executable (`/proc/PID/exe`, opened by the daemon) is the very file the configured path
/// leads to now, under that path (not a copy, a hard link or a bind mount), and that path is one
/// only root can make lead elsewhere (`RootControlledPath`); nobody traces it, and every file
/// mapped executable into it (the dynamic loader, each library) is one only root can change, so
/// no library was preloaded into it (`LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`).
public enum ExemptPrograms {
    /// What a process is, against the configured programs.
    public enum Match: Equatable, Sendable {
        /// It is that program (its real path).
        case exempt(String)
        /// It claims to be one (by its path or its file) but is not trusted as it: why.
        case impostor(String)
        /// No configured program.
        case none
    }

    /// Matches a process's program against the configured paths (resolved now, so that an
    /// upgrade that replaces the file moves the exemption with it).
    public static func match(_ program: RunningProgram, among paths: [String],
                             resolve: (String) -> Result<RootControlledPath.Resolved, RootControlledPath.ResolutionFailure> = RootControlledPath.resolve) -> Match {
        for configured in paths {
            let target: RootControlledPath.Resolved
            switch resolve(configured) {
            case .success(let resolved):
                target = resolved
            case .failure(let failure):
                // A program exempted by a path that others can redirect is never exempt.
                if program.path == configured { return .impostor("\(configured) is not exempt: \(failure)") }
                continue
            }
            let samePath = program.path == target.path, sameFile = program.file == target.file
            guard samePath || sameFile else { continue }
            if !program.sharesNamespaces {
                return .impostor("process runs \(program.path) in a mount or user namespace of its own, where that path may name another file")
            }
            if !sameFile { return .impostor("\(program.path) is not the file \(configured) leads to now (\(program.file), not \(target.file))") }
            if !samePath { return .impostor("process runs \(target.path) under another name (\(program.path))") }
            if program.tracer != 0 { return .impostor("\(target.path) is traced by process \(program.tracer)") }
            guard let mappings = program.executableMappings else {
                return .impostor("the code mapped into \(target.path) cannot be read")
            }
            if let foreign = mappings.first(where: { !$0.onlyRootCanChange }) {
                return .impostor("\(target.path) runs code from a file uid \(foreign.owner) or others may change (\(foreign.file)), such as a preloaded library")
            }
            return .exempt(target.path)
        }
        return .none
    }

    /// Why configured exempt programs will never be exempt, for the log: a path that does not lead
    /// to a program only root controls, or a script (a process running it runs its interpreter,
    /// which is not taken for the script).
    public static func problems(_ paths: [String]) -> [String] {
        var problems: [String] = []
        for path in paths {
            switch RootControlledPath.resolve(path) {
            case .failure(let failure):
                problems.append("exempt program \(path) is never exempt: \(failure)")
            case .success(let resolved):
                let fd = open(resolved.path, O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else { continue }
                defer { close(fd) }
                var start: (UInt8, UInt8) = (0, 0)
                if read(fd, &start, 2) == 2, start == (0x23, 0x21) {
                    problems.append("exempt program \(path) is a script: a process that runs it runs its interpreter, which is never taken for it; exempt a compiled program, or the agent's user by uid")
                }
            }
        }
        return problems
    }
}
