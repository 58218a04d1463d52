import ArgumentParser
import CustodyClient
import CustodyCrypto
import CustodySystem
import FoundationEssentials
import Glibc

// Recovery keys: created and escrowed through the daemon; the administrator's side (a key pair,
// opening an escrow) works offline, with no daemon.

struct RecoveryKeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recovery-key",
        abstract: "Recovery keys: a printable key that unlocks an account and resets its passphrase, and its escrow.",
        subcommands: [Create.self, Export.self, Remove.self, KeyPair.self, Unseal.self])

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Make a new recovery key for an account (it must be unlocked) and print it once.")
        @OptionGroup var global: Global
        @Argument(help: "The account (ID or UPN).") var identity: String
        @Option(help: ArgumentHelp("Also seal it to this administrator's public key file and write the escrow here.", valueName: "file")) var escrowTo: String?
        @Option(help: ArgumentHelp("Where the escrow goes (with --escrow-to).", valueName: "file")) var escrowOut: String?

        func run() throws {
            try createRecoveryKey(global, identity, publicKeyFile: escrowTo, escrowOut: escrowOut, show: true)
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Escrow an account's recovery key to an administrator: a new key, sealed to --to, never shown in clear (the old key stops working).")
        @OptionGroup var global: Global
        @Argument(help: "The account (ID or UPN).") var identity: String
        @Option(help: ArgumentHelp("The administrator's public key file (recovery-key keypair).", valueName: "file")) var to: String
        @Option(help: ArgumentHelp("Where the escrow goes (default: standard output).", valueName: "file")) var out: String?

        func run() throws {
            try createRecoveryKey(global, identity, publicKeyFile: to, escrowOut: out, show: false)
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove an account's recovery key.")
        @OptionGroup var global: Global
        @Argument(help: "The account (ID or UPN).") var identity: String

        func run() throws {
            let response = try request(global, Endpoint.removeRecoveryKey, identity)
            show(response, global) { "\(identity): no recovery key any more" }
        }
    }

    struct KeyPair: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "keypair",
            abstract: "Make an administrator's escrow key pair: PREFIX.pub (public, base64) and PREFIX.key (secret, mode 0600).")
        /// Accepted like every command's, though this one needs no daemon.
        @OptionGroup var global: Global
        @Argument(help: "The files' prefix.") var prefix: String

        func run() throws {
            let (publicKey, secretKey) = try SealedBox.keyPair()
            let secret = secretKey.withUnsafeBytes { Data($0).base64EncodedString() }
            try writeText(prefix + ".key", secret + "\n", mode: 0o600)
            try writeText(prefix + ".pub", Data(publicKey).base64EncodedString() + "\n", mode: 0o644)
            print("wrote \(prefix).pub and \(prefix).key")
        }
    }

    struct Unseal: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Open an escrowed recovery key with the administrator's secret key (offline) and print it.")
        /// Accepted like every command's, though this one needs no daemon.
        @OptionGroup var global: Global
        @Argument(help: "The escrow file.") var escrow: String
        @Option(help: ArgumentHelp("The administrator's secret key file (recovery-key keypair).", valueName: "file")) var key: String

        func run() throws {
            guard let text = readTextFile(escrow), let blob = try? JSONDecoder().decode(RecoveryEscrow.self, from: Data(text.utf8)),
                  blob.format == "custody-recovery-escrow" else {
                printError("\(escrow) is not a Custody recovery escrow")
                throw ExitCode(Exit.failed)
            }
            guard let secretText = readTextFile(key), let secret = Data(base64Encoded: secretText.trimmingWhitespace()),
                  let publicKey = Data(base64Encoded: blob.publicKey), let sealed = Data(base64Encoded: blob.sealed) else {
                printError("cannot read the key \(key) or the escrow's fields")
                throw ExitCode(Exit.failed)
            }
            do {
                let secretKey = try Array(secret).withBytes { (b) throws(CryptoError) in try SecretBytes(copying: b) }
                let opened = try SealedBox.open(Array(sealed), publicKey: Array(publicKey), secretKey: secretKey)
                let content = try opened.withUnsafeBytes { try JSONDecoder().decode(Content.self, from: Data($0)) }
                guard content.accountID == blob.accountID, content.upn == blob.upn else {
                    printError("the escrow was altered: its sealed account (\(content.upn)) is not the one it names (\(blob.upn))")
                    throw ExitCode(Exit.failed)
                }
                print(content.recoveryKey)
            } catch let error as CryptoError {
                printError("cannot open the escrow with this key: \(error) (another administrator's key, or the escrow was altered)")
                throw ExitCode(Exit.failed)
            }
        }

        struct Content: Decodable { var accountID: String; var upn: String; var recoveryKey: String }
    }
}

struct Recover: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Unlock an account with its recovery key (asked for, or --recovery-key-file) and optionally set a new passphrase.",
        discussion: "While the state directory is sealed (no machine key opens it: a cleared TPM, changed PCRs, another machine), the recovery key opens it first and every account is known again; after custodyctl machine-key reset the identity is rebuilt on the new machine key.")
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String
    @Option(help: ArgumentHelp("Read the recovery key from this file.", valueName: "file")) var recoveryKeyFile: String?
    @Option(help: ArgumentHelp("Set this new passphrase (read from the file's first line).", valueName: "file")) var newPassphraseFile: String?
    @Flag(help: "Ask for a new passphrase.") var newPassphrase = false
    @Flag(help: "Leave the account without a passphrase.") var removePassphrase = false

    func run() throws {
        let key = try PassphraseOptions.read(file: recoveryKeyFile, prompt: "Recovery key for \(identity): ")
        var body = RecoverRequest(recoveryKey: key, removePassphrase: removePassphrase ? true : nil)
        if newPassphraseFile != nil || newPassphrase {
            body.newPassphrase = try PassphraseOptions.read(file: newPassphraseFile, prompt: "New passphrase for \(identity): ")
        }
        let response = try request(global, Endpoint.recover, identity, body: body)
        let account = try decode(CustodyAccount.self, response)
        show(response, global) { "\(account.upn): unlocked with its recovery key" + (body.newPassphrase != nil ? "; new passphrase set" : "") }
    }
}

/// Creates a recovery key through the daemon; prints it (`show`), writes the escrow.
func createRecoveryKey(_ global: Global, _ identity: String, publicKeyFile: String?, escrowOut: String?, show shown: Bool) throws {
    var body = RecoveryKeyRequest(show: shown)
    if let publicKeyFile {
        guard let text = readTextFile(publicKeyFile) else {
            printError("cannot read \(publicKeyFile)")
            throw ExitCode(Exit.failed)
        }
        body.escrowPublicKey = text.trimmingWhitespace()
    }
    let response = try request(global, Endpoint.createRecoveryKey, identity, body: body)
    let answer = try decode(RecoveryKeyCreated.self, response)
    var escrowText: String?
    if let escrow = answer.escrow {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        if let data = try? encoder.encode(escrow) { escrowText = String(decoding: data, as: UTF8.self) + "\n" }
    }
    if let escrowOut, let escrowText { try writeText(escrowOut, escrowText, mode: 0o600) }
    if global.json { print(response.text); return }
    if let key = answer.recoveryKey { print("recovery key of \(answer.identity) (write it down; it is not shown again):\n\(key)") }
    if let escrowText, escrowOut == nil { print(escrowText, terminator: "") }
    if let escrowOut { print("escrow of \(answer.identity)'s recovery key written to \(escrowOut)") }
}

/// An escrowed recovery key as the daemon answers it and as its file holds it
/// (`EscrowedRecoveryKey` on the daemon's side; docs/openapi.yaml, RecoveryEscrow).

func writeText(_ path: String, _ text: String, mode: mode_t) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
    guard fd >= 0 else {
        printError("cannot write \(path): \(String(cString: strerror(errno)))")
        throw ExitCode(Exit.failed)
    }
    defer { close(fd) }
    fchmod(fd, mode)
    var bytes = Array(text.utf8)
    defer { for index in bytes.indices { bytes[index] = 0 } }
    guard write(fd, &bytes, bytes.count) == bytes.count else {
        printError("cannot write \(path): \(String(cString: strerror(errno)))")
        throw ExitCode(Exit.failed)
    }
}
