import CLinux
import ArgumentParser
import CustodyClient
import CustodySystem
import FoundationEssentials
import Glibc

struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a command as an identity: binds this process to it, then executes the command.",
        discussion: """
            Everything the command starts inherits the identity, so the files it creates in a mount are owned by it.
            When the identity's policy does not let its data be saved to LocalDrive, the command and everything it \
            starts can create and write files only in the locations the policy allows (its protected mounts and \
            configured directories), /dev/null and the like, and a private temporary directory in the first mount \
            ($TMPDIR); the kernel enforces it (Landlock). Without Landlock a warning is printed and the command runs \
            unconfined.
            Example: custodyctl run --identity alice@contoso.com -- cp report.pdf ~/Work/
            """)
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("The identity to run as.", valueName: "identity")) var identity: String
    @Argument(parsing: .captureForPassthrough, help: "The command and its arguments (after --).") var command: [String] = []

    func run() throws {
        let arguments = command.first == "--" ? Array(command.dropFirst()) : command
        guard let program = arguments.first else { throw ValidationError("give a command to run after --") }
        _ = try request(global, Endpoint.bind, body: BindRequest(pid: getpid(), identity: identity))
        try confine()
        let cArguments = arguments.map { strdup($0) } + [nil]
        execvp(program, cArguments)
        printError("cannot run \(program): \(String(cString: strerror(errno)))")
        throw ExitCode(127)
    }

    /// Devices a program writes to whatever it does. Not /dev/shm: a tmpfs anyone can list, where
    /// the identity's data would lie in plaintext; the command's scratch space is $TMPDIR, in the mount.
    static let devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/pts", "/dev/ptmx"]

    /// Applies the identity's save-to locations (see the discussion above).
    func confine() throws {
        let response = try perform { () throws(CustodyClientError) in
            try global.client.send(Endpoint.locations.method, Endpoint.locations.path(query: [("account", identity)]), body: nil)
        }
        // An identity that no account names (an unmanaged one, bound as given) has no policy.
        if response.status == 404 { return }
        try perform { () throws(CustodyClientError) in try ControlClient.check(response) }
        let locations = try decode(LocationList.self, response).locations
        guard locations.contains(where: { $0.name == "LocalDrive" && $0.saveToAllowed == false }) else { return }
        var writable = locations.filter { $0.saveToAllowed == true && $0.name != "LocalDrive" && !$0.neverMatches }.flatMap(\.paths)
        if let mount = locations.first(where: { $0.name == "AccountDocument" && $0.saveToAllowed == true })?.paths.first {
            let temporary = mount + "/.tmp-\(getuid())"
            if mkdir(temporary, 0o700) == 0 || errno == EEXIST {
                setenv("TMPDIR", temporary, 1)
                writable.append(temporary)
            }
        }
        writable += Self.devices
        let paths = writable.map { strdup($0) }
        defer { paths.forEach { free($0) } }
        let result = paths.map { UnsafePointer($0) }.withUnsafeBufferPointer { buffer in
            clinux_landlock_restrict_writes(buffer.baseAddress, Int32(buffer.count))
        }
        if result < 0 {
            printError("warning: \(identity)'s policy keeps its data from LocalDrive, but this kernel cannot confine the command "
                       + "(no Landlock: \(String(cString: strerror(errno)))); it runs unconfined")
        }
    }
}

struct Bind: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Bind a process (and its descendants) or one thread to an identity.")
    @OptionGroup var global: Global
    @Argument(help: "The process ID (or thread ID with --thread).") var pid: Int32
    @Argument(help: "The identity.") var identity: String
    @Flag(help: "Bind only this thread (TID), not the process.") var thread = false

    func run() throws {
        let response = try request(global, Endpoint.bind, body: thread ? BindRequest(tid: pid, identity: identity) : BindRequest(pid: pid, identity: identity))
        let resolved = try decode(ProcessIdentity.self, response)
        show(response, global) { "\(thread ? "thread" : "process") \(resolved.pid) acts as \(resolved.identity ?? "no identity")" }
    }
}

struct Unbind: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Remove a process's identity binding.")
    @OptionGroup var global: Global
    @Argument(help: "The process ID.") var pid: Int32

    func run() throws {
        let response = try request(global, Endpoint.unbind, String(pid))
        show(response, global) { "process \(pid) unbound" }
    }
}

struct IdentityCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "identity",
        abstract: "A process's identity; an identity's keys carried to another host (export, import), this host's key for it, and new keys (rotate).",
        discussion: """
            To move an identity from host A to host B: on B, custodyctl identity host-key --output b.pub; copy b.pub to A;             on A, custodyctl identity export alice@contoso.com --to b.pub --output alice.export; copy alice.export to B;             on B, custodyctl identity import alice.export. The export opens on B only, and the keys are never in clear             outside the two daemons. Files alice's identity encrypted on either host then open on both.             After a host is lost: custodyctl identity rotate alice@contoso.com on a host that has her, then export and import             to each of her other hosts as above (an import adds the new keys to the ones a host has).
            """,
        subcommands: [Show.self, HostKey.self, Export.self, Import.self, Rotate.self], defaultSubcommand: Show.self)

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "show", abstract: "Show the effective identity of a process (default: this shell's parent).")
        @OptionGroup var global: Global
        @Argument(help: "The process ID.") var pid: Int32?

        func run() throws {
            let pid = self.pid ?? getppid()
            let response = try request(global, Endpoint.processIdentity, String(pid))
            let resolved = try decode(ProcessIdentity.self, response)
            show(response, global) { "process \(resolved.pid): \(resolved.identity ?? "no identity") (\(resolved.source))" }
        }
    }

    struct HostKey: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "host-key",
            abstract: "Print this host's key for receiving identities (public; derived from the machine key, so it changes when that is migrated or reset).")
        @OptionGroup var global: Global
        @Option(help: ArgumentHelp("Write the key to this file (what export --to reads) instead of printing it.", valueName: "file")) var output: String?

        func run() throws {
            let response = try request(global, Endpoint.hostKey)
            let key = try decode(CustodyHostKey.self, response)
            if let output {
                try writeText(output, key.publicKey + "\n", mode: 0o644)
                show(response, global) { "host key \(key.fingerprint) written to \(output)" }
            } else {
                show(response, global) { "\(key.publicKey)\nfingerprint \(key.fingerprint)" }
            }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Seal an identity's keys to another host (admin; the identity must be unlocked here).")
        @OptionGroup var global: Global
        @Argument(help: "The account (object ID or UPN).") var account: String
        @Option(help: ArgumentHelp("The receiving host's key file (its identity host-key --output).", valueName: "file")) var to: String
        @Option(help: ArgumentHelp("Write the export here (mode 0600) instead of standard output.", valueName: "file")) var output: String?

        func run() throws {
            guard let text = readTextFile(to), let key = Data(base64Encoded: text.trimmingWhitespace()), key.count == 32 else {
                printError("\(to) holds no host key (32 bytes in base64, as custodyctl identity host-key --output writes)")
                throw ExitCode(Exit.failed)
            }
            let response = try request(global, Endpoint.exportIdentity, account, body: ExportIdentityRequest(hostKey: key.base64EncodedString()))
            let export = try decode(CustodyIdentityExport.self, response)
            guard let output else {
                print(String(decoding: response.body, as: UTF8.self))
                return
            }
            try writeText(output, String(decoding: response.body, as: UTF8.self) + "\n", mode: 0o600)
            show(response, global) { "the keys of \(export.upn) sealed to host \(export.toFingerprint), written to \(output)" }
        }
    }

    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Enroll an identity here with the keys an export carries (admin; the export must be sealed to this host).",
            discussion: "The identity gets this host's own protectors: --passphrase (or none), then a login protector and a recovery key as for any identity. Its policy is the one the export carries unless the account is enrolled here with another later.")
        @OptionGroup var global: Global
        @Argument(help: "The export file (identity export --output).") var file: String
        @Option(help: ArgumentHelp("The local user (uid) whose processes act as this account.", valueName: "uid")) var uid: UInt32?
        @Option(help: ArgumentHelp("The local user, by name, whose processes act as this account.", valueName: "name")) var user: String?
        @Flag(help: "Protect the identity's keys here with a passphrase (asked for, or see --passphrase-file).") var passphrase = false
        @OptionGroup var passphraseOptions: PassphraseOptions

        func run() throws {
            guard let text = readTextFile(file), let export = try? JSONDecoder().decode(CustodyIdentityExport.self, from: Data(text.utf8)) else {
                printError("\(file) is not a Custody identity export")
                throw ExitCode(Exit.failed)
            }
            var body = ImportIdentityRequest(export: export, uid: uid, user: user)
            if passphrase || passphraseOptions.passphraseFile != nil || passphraseOptions.passphraseStdin,
               let secret = try passphraseOptions.read(prompt: "Passphrase for \(export.upn) on this host: ", required: true) {
                body.passphrase = secret
            }
            let response = try request(global, Endpoint.importIdentity, body: body)
            let account = try decode(CustodyAccount.self, response)
            let generations = account.keyGenerations.map { ", \($0) generation\($0 == 1 ? "" : "s") of keys" } ?? ""
            let what = response.status == 201 ? "imported" : "enrolled here already\(generations)"
            show(response, global) { what + describe(account).dropFirst(1) + "  (keys from host \(export.from))" }
        }
    }

    struct Rotate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Give an identity new keys for everything it writes from now on (admin; the identity must be unlocked here).",
            discussion: "Its files, names and owner records are brought to the new keys in the background (reprotectPending until then); the earlier keys stay in its keybag to open what is not brought over yet and copies made before. Export and import it to its other hosts afterwards: a host that lacks the new keys (a lost one) opens nothing written with them.")
        @OptionGroup var global: Global
        @Argument(help: "The account (object ID or UPN).") var account: String

        func run() throws {
            let response = try request(global, Endpoint.rotateKeys, account)
            let rotated = try decode(CustodyAccount.self, response)
            show(response, global) { "new keys for \(rotated.upn) (generation \(rotated.keyGenerations ?? 1)); its files are being brought to them" }
        }
    }
}
