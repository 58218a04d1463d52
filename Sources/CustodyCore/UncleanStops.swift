import CustodySystem
import FoundationEssentials
import Glibc

/// Runs of the daemon that did not end cleanly (killed, crashed, the machine lost power), so that
/// what such a stop leaves is told apart from tampering.
///
/// A write the daemon had not finished when it stopped can leave the block it was writing torn
/// (a `pwrite` cut short by SIGKILL ends at a page boundary, which falls inside a stored block),
/// and a file whose later ranges were written back before earlier ones can end early or hold a
/// hole where the earlier range never arrived. Both fail authentication exactly as tampering
/// would. So `running.json` is written at start and removed at a clean stop; found at start, the
/// run it names did not stop cleanly, and its time span is kept (`unclean-stops.json`, the last
/// `kept`). A file that fails authentication and was last changed (its ctime, which only the
/// kernel sets) during such a span is reported as a torn write (`EngineEvent.Kind.tornWrite`),
/// not as tampering; the administrator can cut it back to its last authentic block
/// (`repairFile`). An attacker who can change a file's ctime (root, or the clock) can make a
/// tampered file of that span read as torn: it is still reported, and still refused.
public struct UncleanStop: Codable, Equatable, Sendable {
    /// When the run started, and when the next start found it had not stopped cleanly (wall-clock seconds).
    public var started: Double
    public var foundAt: Double
}

extension Engine {
    static let runningFile = "running.json"
    static let uncleanStopsFile = "unclean-stops.json"
    static let keptUncleanStops = 16

    struct RunningFile: Codable {
        var started: Double
        var pid: Int32
    }

    struct UncleanStopsFile: Codable {
        var version = 1
        var stops: [UncleanStop] = []
    }

    /// Notes this run's start, and the previous run when it did not stop cleanly (at `Engine.init`).
    static func noteRunStart(_ files: StateFiles, problems: inout [StateProblem]) -> [UncleanStop] {
        let now = wallClockSeconds()
        var kept = readOrSetAside(UncleanStopsFile.self, from: uncleanStopsFile, files: files,
                                  what: "earlier unclean stops are forgotten", problems: &problems) ?? UncleanStopsFile()
        if access(files.path(runningFile), F_OK) == 0 {
            // A run that did not stop cleanly; its start from the file, or the file's own time.
            let started = (try? files.read(RunningFile.self, from: runningFile))?.started
                ?? (try? Syscall.lstat(files.path(runningFile))).map { Double($0.st_mtim.tv_sec) } ?? 0
            kept.stops.append(UncleanStop(started: started, foundAt: now))
            kept.stops = Array(kept.stops.suffix(keptUncleanStops))
            try? files.write(kept, to: uncleanStopsFile)
        }
        try? files.write(RunningFile(started: now, pid: getpid()), to: runningFile)
        return kept.stops
    }

    /// The daemon stops cleanly: the next start will not take this run for an unclean one.
    public func markCleanStop() {
        _ = unlink(files.path(Self.runningFile))
    }

    /// The runs that did not stop cleanly, oldest first.
    public var uncleanStops: [UncleanStop] { state.withLock { $0.uncleanStops } }

    /// The unclean stop during whose run a file last changed at `changed` (wall-clock seconds), if any.
    public func uncleanStop(covering changed: Double) -> UncleanStop? {
        state.withLock { $0.uncleanStops.last { $0.started <= changed && changed <= $0.foundAt } }
    }
}
