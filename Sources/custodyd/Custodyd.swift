import ArgumentParser
import CustodyControl
import CustodyCore
import CustodyFormat
import CustodyFUSE
import CustodySystem
import Glibc

@main
struct Custodyd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "custodyd",
        abstract: "Mount a protected working directory over FUSE.",
        discussion: """
            Serves BACKING at MOUNTPOINT and stays in the foreground until the mount point is \
            unmounted (fusermount3 -u MOUNTPOINT) or the daemon gets SIGTERM or SIGINT.
            """,
        version: CustodyVersion.string)

    @Argument(help: "The directory that holds the files (the backing store).")
    var backing: String

    @Argument(help: "An empty directory where the protected view appears.")
    var mountPoint: String

    @Option(help: ArgumentHelp("Directory for keys and state.", valueName: "dir"))
    var state: String?

    @Option(help: ArgumentHelp("Control socket path (default /run/custody/control.sock for root).", valueName: "path"))
    var socket: String?

    @Option(help: ArgumentHelp("Permissions of the control socket (octal).", valueName: "mode"))
    var socketMode: String = "0660"

    @Option(help: ArgumentHelp("Group of the control socket (default custody-admin when it exists).", valueName: "group"))
    var socketGroup: String?

    @Option(help: ArgumentHelp("Members of this group are administrators (default custody-admin when it exists).", valueName: "group"))
    var adminGroup: String?

    @Flag(help: "Let other users use the mount (turns on kernel permission checks).")
    var allowOther = false

    @Flag(help: "Mount even when the mount point is not empty.")
    var allowNonempty = false

    @Option(help: ArgumentHelp("Seconds the kernel caches names and attributes.", valueName: "seconds"))
    var cacheTimeout: Double = 1.0

    @Flag(help: "Send every write to the daemon at once instead of batching in the page cache.")
    var noWritebackCache = false

    @Option(help: ArgumentHelp("Most FUSE request threads.", valueName: "n"))
    var threads: Int = 8

    @Flag(help: "Print every FUSE request.")
    var debug = false

    @Flag(help: "Allow more than one managed (enrolled) account (MultiIdentity).")
    var multiIdentity = false

    @Option(help: ArgumentHelp("Seconds between a lock and class A keys being dropped.", valueName: "seconds"))
    var lockGracePeriod: Double = 10

    @Option(help: ArgumentHelp("Caps every policy's protection level (MaxFileProtectionLevel).", valueName: "level"))
    var maxProtectionLevel: String = "complete"

    @Option(help: ArgumentHelp("Default identity for callers of a uid with no binding (repeatable).", valueName: "uid=identity"))
    var defaultIdentity: [String] = []

    func validate() throws {
        guard cacheTimeout >= 0, cacheTimeout.isFinite else {
            throw ValidationError("--cache-timeout must be a number of seconds, 0 or more")
        }
        guard (1...256).contains(threads) else {
            throw ValidationError("--threads must be between 1 and 256")
        }
        guard ProtectionClass(name: maxProtectionLevel) != nil else {
            throw ValidationError("--max-protection-level: unknown level \(maxProtectionLevel) (complete, completeUnlessOpen, untilFirstAuth, none)")
        }
        guard lockGracePeriod >= 0, lockGracePeriod.isFinite else {
            throw ValidationError("--lock-grace-period must be a number of seconds, 0 or more")
        }
        _ = try parsedDefaultIdentities()
        guard let mode = mode_t(socketMode, radix: 8), mode <= 0o777 else {
            throw ValidationError("--socket-mode must be octal permissions such as 0660, not \(socketMode)")
        }
        _ = mode
        for (option, name) in [("--socket-group", socketGroup), ("--admin-group", adminGroup)] {
            if let name, Self.groupID(name) == nil { throw ValidationError("\(option): no group named \(name)") }
        }
    }

    static let defaultAdminGroup = "custody-admin"

    static func groupID(_ name: String) -> gid_t? {
        if let number = gid_t(name) { return number }
        guard let entry = getgrnam(name) else { return nil }
        return entry.pointee.gr_gid
    }

    static func defaultSocketPath() -> String {
        if geteuid() == 0 {
            mkdir("/run/custody", 0o755)
            return "/run/custody/control.sock"
        }
        let runtime = getenv("XDG_RUNTIME_DIR").map { String(cString: $0) } ?? "/tmp"
        return runtime + "/custody.sock"
    }

    func parsedDefaultIdentities() throws -> [UInt32: String] {
        var result: [UInt32: String] = [:]
        for entry in defaultIdentity {
            let parts = entry.split(separator: "=", maxSplits: 1)
            guard parts.count == 2, let uid = UInt32(parts[0]), !parts[1].isEmpty else {
                throw ValidationError("--default-identity takes uid=identity, not \(entry)")
            }
            result[uid] = String(parts[1])
        }
        return result
    }

    func settings() throws -> Settings {
        var settings = Settings()
        settings.multiIdentity = multiIdentity
        settings.lockGracePeriod = lockGracePeriod
        settings.maxFileProtectionLevel = ProtectionClass(name: maxProtectionLevel) ?? .complete
        settings.defaultIdentities = try parsedDefaultIdentities()
        return settings
    }

    func run() throws {
        var options = MountOptions()
        options.allowOther = allowOther
        options.allowNonEmpty = allowNonempty
        options.entryTimeout = cacheTimeout
        options.attributeTimeout = cacheTimeout
        options.negativeTimeout = cacheTimeout
        options.writebackCache = !noWritebackCache
        options.maxThreads = threads
        options.debug = debug

        Syscall.raiseDescriptorLimit()
        do {
            let stateDirectory = state ?? StateDirectory.defaultPath()
            try StateDirectory.prepare(stateDirectory)
            let engine = try Engine(stateDirectory: stateDirectory, settings: try settings())
            engine.startDeadlineTimer()
            defer { engine.stopDeadlineTimer() }
            let socketPath = socket ?? Self.defaultSocketPath()
            let fallbackGroup = Self.groupID(Self.defaultAdminGroup)
            let server = try ControlServer(path: socketPath, engine: engine, mode: mode_t(socketMode, radix: 8) ?? 0o660,
                                           group: socketGroup.flatMap(Self.groupID) ?? fallbackGroup,
                                           adminGroup: adminGroup.flatMap(Self.groupID) ?? fallbackGroup)
            server.start()
            defer { server.stop() }
            Log.info("control socket \(socketPath)")
            let mount = try FUSEMount(backing: backing, mountPoint: mountPoint, options: options, engine: engine)
            try mount.run {
                Log.info("serving \(mount.backing) at \(mount.mountPoint) (pid \(getpid()), state \(stateDirectory))")
            }
            Log.info("unmounted \(mount.mountPoint)")
        } catch let error as MountError {
            Log.error(error.description)
            throw ExitCode(1)
        } catch let error as StateDirectoryError {
            Log.error(error.description)
            throw ExitCode(1)
        } catch let error as EngineError {
            Log.error(error.description)
            throw ExitCode(1)
        } catch let error as ControlError {
            Log.error(error.description)
            throw ExitCode(1)
        }
    }
}
