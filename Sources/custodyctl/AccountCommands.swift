import ArgumentParser
import CustodyClient
import FoundationEssentials
import Glibc

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the daemon's version, mounts and each account's lock state.")
    @OptionGroup var global: Global

    func run() throws {
        let response = try request(global, Endpoint.status)
        let status = try decode(CustodyStatus.self, response)
        show(response, global) {
            var lines = ["custodyd \(status.version)"]
            lines.append(status.mounts.isEmpty ? "mounts: none" : "mounts:")
            lines += status.mounts.map { "  \($0.mountPoint)  (backing \($0.backing))" }
            lines.append(status.accounts.isEmpty ? "accounts: none" : "accounts:")
            lines += status.accounts.map(describe)
            if let key = status.machineKey { lines += describe(key) }
            if let guardStatus = status.guard { lines.append(describe(guardStatus)) }
            if let problems = status.stateProblems, !problems.isEmpty {
                lines.append("state problems:")
                lines += problems.map { "  \($0.message)" }
            }
            return lines.joined(separator: "\n")
        }
    }
}

/// The guard in one line: what keeps holders of managed data to their save-to locations.
func describe(_ guardStatus: CustodyGuardStatus) -> String {
    switch guardStatus.level {
    case "fanotify":
        return "guard: on (fanotify) for \(guardStatus.fileSystems.count) file system\(guardStatus.fileSystems.count == 1 ? "" : "s"); "
            + "\(guardStatus.holders) process\(guardStatus.holders == 1 ? "" : "es") hold\(guardStatus.holders == 1 ? "s" : "") managed data; "
            + "\(guardStatus.refusals) refused"
    default:
        return "guard: \(guardStatus.level)" + (guardStatus.reason.map { " (\($0))" } ?? "") + ": only the mounts and custodyctl run keep data to its locations"
    }
}

func describe(_ account: CustodyAccount) -> String {
    var parts = ["  \(account.upn)", "id \(account.id)"]
    if let policy = account.policy {
        parts.append("managed, \(policy.protectionLevel ?? "complete")" + (policy.fileEncryptionRequired == false ? ", not encrypted" : ""))
    } else {
        parts.append("registered (unmanaged)")
    }
    if let lock = account.lock { parts.append(lock) }
    if let reason = account.unavailable { parts.append("(\(reason))") }
    if let failures = account.failedUnlockAttempts, failures > 0 {
        let wait = account.retryAfterSeconds ?? 0
        parts.append("\(failures) wrong passphrase\(failures == 1 ? "" : "s")" + (wait > 0 ? ", next attempt in \(Int(wait.rounded(.up))) s" : ""))
    }
    if let uid = account.uid { parts.append("uid \(uid)") }
    if account.hasLoginProtector == true { parts.append("login unlocks") }
    if account.hasRecoveryKey == true { parts.append("recovery key") }
    if account.reprotectPending == true { parts.append("re-protection pending") }
    return parts.joined(separator: "  ")
}

/// Reads a passphrase: from a file, from standard input, or prompted on the terminal without echo.
struct PassphraseOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Read the passphrase from this file (first line).", valueName: "file"))
    var passphraseFile: String?

    @Flag(help: "Read the passphrase from standard input (first line).")
    var passphraseStdin = false

    /// A passphrase from `file` (its first line), else asked for on the terminal.
    static func read(file: String?, prompt: String) throws -> String {
        var options = PassphraseOptions()
        options.passphraseFile = file
        return try options.read(prompt: prompt, required: true) ?? ""
    }

    func read(prompt: String, required: Bool) throws -> String? {
        if let passphraseFile {
            guard let file = fopen(passphraseFile, "r") else {
                printError("cannot read \(passphraseFile): \(String(cString: strerror(errno)))")
                throw ExitCode(Exit.failed)
            }
            defer { fclose(file) }
            return readLine(from: file)
        }
        if passphraseStdin, let input = fdopen(dup(0), "r") { defer { fclose(input) }; return readLine(from: input) }
        guard required else { return nil }
        return try promptWithoutEcho(prompt)
    }

    private func readLine(from file: UnsafeMutablePointer<FILE>) -> String {
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        let count = getline(&line, &capacity, file)
        guard count > 0, let line else { return "" }
        var text = String(cString: line)
        while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
        return text
    }

    private func promptWithoutEcho(_ prompt: String) throws -> String {
        let tty = open("/dev/tty", O_RDWR | O_CLOEXEC)
        guard tty >= 0 else {
            printError("no terminal to ask for the passphrase; use --passphrase-file or --passphrase-stdin")
            throw ExitCode(Exit.failed)
        }
        defer { close(tty) }
        _ = prompt.withCString { write(tty, $0, strlen($0)) }
        var saved = termios()
        tcgetattr(tty, &saved)
        var quiet = saved
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(tty, TCSAFLUSH, &quiet)
        defer {
            tcsetattr(tty, TCSAFLUSH, &saved)
            _ = write(tty, "\n", 1)
        }
        var bytes: [UInt8] = []
        var byte: UInt8 = 0
        while Glibc.read(tty, &byte, 1) == 1, byte != 10, byte != 13 { bytes.append(byte) }
        return String(decoding: bytes, as: UTF8.self)
    }
}

struct Enroll: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Register an account and enroll it with a policy (admin).",
        discussion: "Without any policy option, an account deregistered with its keys kept gets back the policy it had (else the default policy); its files are brought to the policy in the background.")
    @OptionGroup var global: Global
    @Argument(help: "The account's object ID.") var id: String
    @Argument(help: "The account's UPN (user@domain).") var upn: String
    @Option(help: ArgumentHelp("complete, completeUnlessOpen, untilFirstAuth or none (or NSFileProtection* names).", valueName: "level"))
    var level: String?
    @Flag(help: "Files of this account are stored plain (isFileEncryptionRequired off).") var noEncryption = false
    @Flag(help: "Other identities may receive its files (canShareWithOtherIdentities).") var share = false
    @Flag(help: "Refuse files of unmanaged identities (canReceiveSharedFile for them).") var refuseUnmanaged = false
    @Flag(help: "Exports must be encrypted copies (shouldFileProviderEncryptFiles).") var fileProviderEncryption = false
    @Option(help: ArgumentHelp("Which other identities may read its data: all, managed or none (default none; --share is all).", valueName: "scope"))
    var send: String?
    @Option(help: ArgumentHelp("From which other identities it accepts data: all, managed or none (default all).", valueName: "scope"))
    var receive: String?
    @Option(help: ArgumentHelp("Locations its data may be saved to, comma-separated (default every location).", valueName: "names")) var saveTo: String?
    @Option(help: ArgumentHelp("Locations data may be opened from into it, comma-separated (default every location).", valueName: "names")) var openFrom: String?
    @Option(help: ArgumentHelp("The local user (uid) whose processes act as this account.", valueName: "uid")) var uid: UInt32?
    @Option(help: ArgumentHelp("The local user, by name, whose processes act as this account.", valueName: "name")) var user: String?
    @Flag(help: "Register only (unmanaged: no policy, no keys).") var registerOnly = false
    @Flag(help: "Protect the account's keys with a passphrase (asked for, or see --passphrase-file).") var passphrase = false
    @OptionGroup var passphraseOptions: PassphraseOptions

    func run() throws {
        var body = EnrollRequest(id: id, upn: upn, enroll: !registerOnly, uid: uid, user: user)
        if !registerOnly {
            // Without a policy option, the daemon restores the policy the account had when it
            // was deregistered with its keys kept (else the default).
            let given = level != nil || noEncryption || share || refuseUnmanaged || fileProviderEncryption || send != nil || receive != nil
                || saveTo != nil || openFrom != nil
            var policy = CustodyPolicy(fileEncryptionRequired: !noEncryption, protectionLevel: level, fileProviderEncryptionRequired: fileProviderEncryption,
                                       canShareWithOtherIdentities: share, canReceiveFromUnmanaged: !refuseUnmanaged)
            policy.sendToOtherIdentities = send
            policy.receiveFromOtherIdentities = receive
            policy.saveToLocations = saveTo.flatMap(locationList)
            policy.openFromLocations = openFrom.flatMap(locationList)
            if given { body.policy = policy }
            let wanted = passphrase || passphraseOptions.passphraseFile != nil || passphraseOptions.passphraseStdin
            if wanted, let secret = try passphraseOptions.read(prompt: "Passphrase for \(upn): ", required: true) {
                body.passphrase = secret
            }
        }
        let response = try request(global, Endpoint.enroll, body: body)
        let account = try decode(CustodyAccount.self, response)
        show(response, global) { (account.enrolled ? "enrolled" : "registered") + describe(account).dropFirst(1) }
    }
}

struct Accounts: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List registered accounts, or show one.")
    @OptionGroup var global: Global
    @Argument(help: "One account (ID or UPN).") var identity: String?

    func run() throws {
        if let identity {
            let response = try request(global, Endpoint.account, identity)
            let account = try decode(CustodyAccount.self, response)
            show(response, global) { describe(account).trimmingPrefix("  ") }
        } else {
            let response = try request(global, Endpoint.accounts)
            let accounts = try decode([CustodyAccount].self, response)
            show(response, global) { accounts.isEmpty ? "no accounts" : accounts.map(describe).joined(separator: "\n") }
        }
    }
}

extension String {
    func trimmingPrefix(_ prefix: String) -> String { hasPrefix(prefix) ? String(dropFirst(prefix.count)) : self }
}

struct Deregister: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Deregister an account (admin).",
        discussion: "Without --wipe its keys stay sealed and its files encrypted: enrolling the same account again restores access (docs/wipe.md).")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String
    @Flag(help: "Wipe it: destroy its keys and delete its files first (same as `custodyctl wipe`).") var wipe = false
    @Flag(help: "With --wipe: do not ask for confirmation on a terminal.") var yes = false

    func run() throws {
        if wipe {
            if !yes { try confirmWipe(global, identity) }
            try runWipe(global: global, identity: identity, noWait: false, deregisterRoute: true)
            return
        }
        let response = try request(global, Endpoint.deregister, identity)
        show(response, global) { "deregistered \(identity) (keys kept sealed)" }
    }
}

struct PolicyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "policy",
        abstract: "Show an account's policy, or change it (admin; existing files are re-protected in the background).")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String
    @Option(help: ArgumentHelp("New protection level.", valueName: "level")) var level: String?
    @Option(help: ArgumentHelp("Encrypt its files (true/false).", valueName: "bool")) var encryption: Bool?
    @Option(help: ArgumentHelp("Let other identities receive its files (true/false).", valueName: "bool")) var share: Bool?
    @Option(help: ArgumentHelp("Accept files of unmanaged identities (true/false).", valueName: "bool")) var receiveUnmanaged: Bool?
    @Option(help: ArgumentHelp("Exports must be encrypted copies (true/false).", valueName: "bool")) var fileProviderEncryption: Bool?
    @Option(help: ArgumentHelp("Which other identities may read its data: all, managed or none.", valueName: "scope")) var send: String?
    @Option(help: ArgumentHelp("From which other identities it accepts data: all, managed or none.", valueName: "scope")) var receive: String?
    @Option(help: ArgumentHelp("Locations its data may be saved to, comma-separated (all: every location).", valueName: "names")) var saveTo: String?
    @Option(help: ArgumentHelp("Locations data may be opened from into it, comma-separated (all: every location).", valueName: "names")) var openFrom: String?
    @Option(help: ArgumentHelp("A screen lock of every session of its user locks it (true/false).", valueName: "bool")) var lockOnSessionLock: Bool?
    @Option(help: ArgumentHelp("A suspend locks it (true/false).", valueName: "bool")) var lockOnSuspend: Bool?
    @Option(help: ArgumentHelp("Its user's last logout locks it (true/false).", valueName: "bool")) var lockOnLogout: Bool?
    @Flag(help: "Wait until the account's existing files are re-protected (a progress bar on a terminal).") var wait = false

    func run() throws {
        let current = try request(global, Endpoint.policy, identity)
        var policy = try decode(CustodyPolicy.self, current)
        let changing = level != nil || encryption != nil || share != nil || receiveUnmanaged != nil || fileProviderEncryption != nil
            || send != nil || receive != nil || saveTo != nil || openFrom != nil
            || lockOnSessionLock != nil || lockOnSuspend != nil || lockOnLogout != nil
        guard changing else {
            show(current, global) { describePolicy(policy) }
            return
        }
        if let level { policy.protectionLevel = level }
        if let encryption { policy.fileEncryptionRequired = encryption }
        if let share {
            policy.canShareWithOtherIdentities = share
            policy.sendToOtherIdentities = share ? "all" : "none"
        }
        if let receiveUnmanaged {
            policy.canReceiveFromUnmanaged = receiveUnmanaged
            policy.receiveFromOtherIdentities = receiveUnmanaged ? "all" : "managed"
        }
        if let fileProviderEncryption { policy.fileProviderEncryptionRequired = fileProviderEncryption }
        if let send { policy.sendToOtherIdentities = send }
        if let receive { policy.receiveFromOtherIdentities = receive }
        if let saveTo { policy.saveToLocations = locationList(saveTo) }
        if let openFrom { policy.openFromLocations = locationList(openFrom) }
        if let lockOnSessionLock { policy.lockOnSessionLock = lockOnSessionLock }
        if let lockOnSuspend { policy.lockOnSuspend = lockOnSuspend }
        if let lockOnLogout { policy.lockOnLogout = lockOnLogout }
        // The scopes say it all; the older booleans would only repeat them.
        policy.canShareWithOtherIdentities = nil
        policy.canReceiveFromUnmanaged = nil
        let before = wait ? try lastEventSequence(global) : 0
        let response = try request(global, Endpoint.setPolicy, identity, body: policy)
        let account = try decode(CustodyAccount.self, response)
        show(response, global) { "policy of \(account.upn) set\n" + (account.policy.map(describePolicy) ?? "") }
        if wait { try waitForReprotection(of: account.upn, after: before) }
    }

    /// Follows the event stream until the account's re-protection has finished (or the policy
    /// did not change), drawing its progress.
    func waitForReprotection(of upn: String, after sequence: UInt64) throws {
        let terminal = isatty(2) == 1 && !global.json
        var frame = 0
        var outcome = ""
        try perform { () throws(CustodyClientError) in
            try global.client.stream(Endpoint.events.path(query: [("after", String(sequence))])) { line in
                guard let event = try? JSONDecoder().decode(CustodyEvent.self, from: Data(line.utf8)), event.identity == upn else { return true }
                let done = Double(event.details["done"] ?? "") ?? 0
                let total = Double(event.details["total"] ?? "") ?? 0
                switch event.kind {
                case "reprotectProgress":
                    if terminal { drawBar((total > 0 ? done / total : nil, "\(Int(done))/\(Int(total)) files re-protected"), frame: frame) }
                    frame += 1
                    return true
                case "reprotectFinished", "policyUnchanged":
                    if terminal, event.kind == "reprotectFinished" {
                        drawBar((1, "\(Int(done))/\(Int(total)) files re-protected"), frame: frame, final: true)
                        _ = write(2, "\n", 1)
                    }
                    outcome = event.message
                    return false
                default:
                    return true
                }
            }
        }
        if !global.json, !outcome.isEmpty { print(outcome) }
    }
}

/// "all" (every location) or a comma-separated list of names.
func locationList(_ text: String) -> [String]? {
    text.lowercased() == "all" ? nil : text.split(separator: ",").map { String($0).trimmingWhitespace() }.filter { !$0.isEmpty }
}

func describePolicy(_ policy: CustodyPolicy) -> String {
    var lines = [
        "protection level: \(policy.protectionLevel ?? "complete")",
        "file encryption required: \(policy.fileEncryptionRequired ?? true)",
        "file-provider encryption required: \(policy.fileProviderEncryptionRequired ?? false)",
        "other identities may receive its files: \(policy.canShareWithOtherIdentities ?? false)",
        "accepts files of unmanaged identities: \(policy.canReceiveFromUnmanaged ?? true)",
        "sends its data to other identities: \(policy.sendToOtherIdentities ?? "none")",
        "receives data from other identities: \(policy.receiveFromOtherIdentities ?? "all")",
        "save to: \(policy.saveToLocations.map { $0.isEmpty ? "nowhere" : $0.joined(separator: ", ") } ?? "every location")",
        "open from: \(policy.openFromLocations.map { $0.isEmpty ? "nowhere" : $0.joined(separator: ", ") } ?? "every location")",
    ]
    if let exempt = policy.transferExemptExecutables, !exempt.isEmpty { lines.append("exempt programs: " + exempt.joined(separator: ", ")) }
    if let exempt = policy.transferExemptUids, !exempt.isEmpty { lines.append("exempt uids: " + exempt.map(String.init).joined(separator: ", ")) }
    for (name, value) in [("screen lock", policy.lockOnSessionLock), ("suspend", policy.lockOnSuspend), ("logout", policy.lockOnLogout)] {
        if let value { lines.append("locks on \(name): \(value)") }
    }
    return lines.joined(separator: "\n")
}

struct Lock: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Lock an account (class A keys go after the grace period), or --all (admin).")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String?
    @Flag(help: "Lock every account.") var all = false

    func validate() throws {
        guard (identity == nil) == all else { throw ValidationError("give an account or --all") }
    }

    func run() throws {
        if all {
            let response = try request(global, Endpoint.lockAll)
            show(response, global) { "locking every account" }
            return
        }
        let response = try request(global, Endpoint.lock, identity ?? "")
        let state = try decode(LockState.self, response)
        show(response, global) { "\(state.identity): \(state.lock)" }
    }
}

struct Unlock: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unlock an account (with its passphrase when it has one), or --all without passphrases (admin).")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String?
    @Flag(help: "Unlock every account that needs no passphrase.") var all = false
    @OptionGroup var passphraseOptions: PassphraseOptions

    func validate() throws {
        guard (identity == nil) == all else { throw ValidationError("give an account or --all") }
    }

    func run() throws {
        if all {
            let response = try request(global, Endpoint.unlockAll)
            let answer = try decode(UnlockAllResult.self, response)
            show(response, global) { answer.stillLocked.isEmpty ? "unlocked" : "still locked (need a passphrase): " + answer.stillLocked.joined(separator: ", ") }
            return
        }
        let identity = self.identity ?? ""
        let account = try decode(CustodyAccount.self, try request(global, Endpoint.account, identity))
        let secret = try passphraseOptions.read(prompt: "Passphrase for \(account.upn): ", required: account.hasPassphrase == true)
        let response = try request(global, Endpoint.unlock, identity, body: UnlockRequest(passphrase: secret))
        let state = try decode(LockState.self, response)
        show(response, global) { "\(state.identity): \(state.lock)" }
    }
}

/// The sequence number of the newest event the daemon keeps (0 when none).
func lastEventSequence(_ global: Global) throws -> UInt64 {
    var last: UInt64 = 0
    try perform { () throws(CustodyClientError) in
        try global.client.stream(Endpoint.events.path(query: [("follow", "false")])) { line in
            if let event = try? JSONDecoder().decode(CustodyEvent.self, from: Data(line.utf8)) { last = event.sequence }
            return true
        }
    }
    return last
}

struct Passphrase: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Set, change or remove an account's passphrase (its owner or an administrator; the current one is needed).")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String
    @Option(help: ArgumentHelp("Read the current passphrase from this file (leave out when there is none).", valueName: "file"))
    var oldFile: String?
    @Option(help: ArgumentHelp("Read the new passphrase from this file.", valueName: "file")) var newFile: String?
    @Flag(help: "The account has a passphrase now: ask for it.") var hasPassphrase = false
    @Flag(help: "Remove the passphrase (the account then unlocks on authorization alone).") var remove = false

    func validate() throws {
        if remove, newFile != nil { throw ValidationError("give --new-file or --remove, not both") }
    }

    func run() throws {
        var body = PassphraseRequest()
        if oldFile != nil || hasPassphrase {
            body.old = try PassphraseOptions.read(file: oldFile, prompt: "Current passphrase for \(identity): ")
        }
        if !remove { body.new = try PassphraseOptions.read(file: newFile, prompt: "New passphrase for \(identity): ") }
        let response = try request(global, Endpoint.passphrase, identity, body: body)
        let account = try decode(CustodyAccount.self, response)
        show(response, global) { remove ? "passphrase of \(account.upn) removed" : "passphrase of \(account.upn) set" }
    }
}

struct Protector: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Let the owner's login password unlock an account too (a login protector), or stop it.",
        subcommands: [AddLogin.self, RemoveLogin.self])

    struct AddLogin: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "add-login",
            abstract: "Wrap the account's keys under its owner's login password (the account must be unlocked).",
            discussion: "The password is not checked against the system's here: the PAM module (pam_custody.so with add_protector) sets the protector up at login with a password PAM has checked.")
        @OptionGroup var global: Global
        @Argument(help: "The account (ID or UPN).") var identity: String
        @Option(help: ArgumentHelp("Read the login password from this file (first line).", valueName: "file")) var passwordFile: String?
        @Flag(help: "Read the login password from standard input (first line).") var passwordStdin = false

        func run() throws {
            var options = PassphraseOptions()
            options.passphraseFile = passwordFile
            options.passphraseStdin = passwordStdin
            let password = try options.read(prompt: "Login password of the owner of \(identity): ", required: true) ?? ""
            let response = try request(global, Endpoint.addLoginProtector, identity, body: ProtectorRequest(password: password))
            let account = try decode(CustodyAccount.self, response)
            show(response, global) { "\(account.upn): the login password unlocks it too" }
        }
    }

    struct RemoveLogin: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "remove-login", abstract: "Remove the account's login protector.")
        @OptionGroup var global: Global
        @Argument(help: "The account (ID or UPN).") var identity: String

        func run() throws {
            let response = try request(global, Endpoint.removeLoginProtector, identity)
            show(response, global) { "\(identity): the login password no longer unlocks it" }
        }
    }
}
