import CustodySystem
import Foundation
import Glibc
import XCTest

/// Tests with several daemons, each with a state directory (and so machine and host keys) of
/// its own, standing for several hosts; alice is every daemon's default identity for uid 0.
/// Every daemon is stopped (its exit status asserted) and removed in `tearDown`, and so is every
/// scratch directory a test names.
class HostsTestCase: XCTestCase {
    static let alice = "alice@contoso.com"
    /// The arguments every host starts with (subclasses add theirs with `hostArguments`).
    static let baseArguments = ["--multi-identity", "--default-identity", "0=\(alice)", "--lock-grace-period", "0"]
    var hostArguments: [String] { Self.baseArguments }
    var daemons: [MountedDaemon] = []
    var scratch: [String] = []

    override func setUpWithError() throws {
        try MountedDaemon.requireFUSE()
    }

    override func tearDown() {
        for daemon in daemons { daemon.destroy() }
        daemons = []
        for path in scratch { _ = try? runCommand(["rm", "-rf", path]) }
        scratch = []
    }

    /// A new host (`prepare` as `MountedDaemon`'s).
    func host(prepare: ((String) throws -> Void)? = nil) throws -> MountedDaemon {
        let daemon = try MountedDaemon(extraArguments: hostArguments, prepare: prepare)
        daemons.append(daemon)
        return daemon
    }

    /// A new host serving `other`'s backing directory (as two hosts serve one NFS export): its
    /// own backing path is a link to it.
    func host(sharingStoreOf other: MountedDaemon) throws -> MountedDaemon {
        try host { state in
            let backing = URL(fileURLWithPath: state).deletingLastPathComponent().appendingPathComponent("backing").path
            guard rmdir(backing) == 0, symlink(other.backing, backing) == 0 else { throw Errno.current }
        }
    }

    /// A scratch directory, removed in `tearDown`.
    func scratchDirectory(_ prefix: String) throws -> String {
        let path = try makeTemporaryDirectory(prefix)
        scratch.append(path)
        return path
    }
}
