import ArgumentParser
import CustodyClient

/// `custodyctl machine-key`: where the machine key is kept, moving it, replacing a lost one.
struct MachineKeyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "machine-key",
        abstract: "The machine key that every keybag needs: sealed to the TPM 2.0, or a file (admin).",
        subcommands: [Show.self, Migrate.self, Reset.self], defaultSubcommand: Show.self)

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "status", abstract: "Show where the machine key is kept and what cannot be opened.")
        @OptionGroup var global: Global

        func run() throws {
            let response = try request(global, Endpoint.machineKey)
            let key = try decode(CustodyMachineKey.self, response)
            show(response, global) { describe(key).joined(separator: "\n") }
        }
    }

    struct Migrate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move to a fresh machine key in the TPM or in a file, rewrapping every keybag (no passphrase needed; safe to interrupt: the daemon finishes at its next start).")
        @OptionGroup var global: Global
        @Option(help: ArgumentHelp("tpm2 or file.", valueName: "store")) var to: String
        @Option(help: ArgumentHelp("A SHA-256 PCR to bind the sealed key to (repeatable; default: the configured tpm2-pcrs).", valueName: "pcr")) var pcr: [Int] = []

        func validate() throws {
            guard ["tpm2", "file"].contains(to) else { throw ValidationError("--to takes tpm2 or file") }
            if !pcr.isEmpty, to != "tpm2" { throw ValidationError("--pcr applies to --to tpm2 only") }
        }

        func run() throws {
            let response = try request(global, Endpoint.migrateMachineKey, body: MigrateRequest(to: to, pcrs: pcr.isEmpty ? nil : pcr))
            let key = try decode(CustodyMachineKey.self, response)
            show(response, global) { (["machine key moved"] + describe(key)).joined(separator: "\n") }
        }
    }

    struct Reset: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace a machine key that cannot be had (a cleared TPM, another machine's state) with a new one; then recover each identity with its recovery key (custodyctl recover).")
        @OptionGroup var global: Global

        func run() throws {
            let response = try request(global, Endpoint.resetMachineKey)
            let key = try decode(CustodyMachineKey.self, response)
            show(response, global) {
                (["new machine key"] + describe(key) + (key.stranded.isEmpty ? [] : ["next: custodyctl recover ACCOUNT --new-passphrase-file FILE, for each of them"])).joined(separator: "\n")
            }
        }
    }
}

func describe(_ key: CustodyMachineKey) -> [String] {
    var lines: [String] = []
    if let id = key.id {
        let place = key.store == "tpm2" ? "sealed to the \(key.tpm ?? "TPM")" + (key.pcrs.isEmpty ? "" : ", bound to PCR \(key.pcrs.map(String.init).joined(separator: ","))") : "a file in the state directory"
        lines.append("machine key: \(id), \(place)")
    } else {
        lines.append("machine key: none")
    }
    if let problem = key.problem { lines.append("  unavailable: \(problem)") }
    if let attack = key.dictionaryAttack {
        lines.append("  TPM dictionary-attack counter: \(attack.failures) of \(attack.maxTries) (one forgotten every \(attack.intervalSeconds) s)")
    }
    for other in key.keys where !other.current {
        lines.append("  also \(other.id) (\(other.store)), still named by keybags" + (other.available ? "" : ": unavailable, \(other.problem ?? "")"))
    }
    if let warning = key.warning { lines.append("  warning: \(warning)") }
    if !key.stranded.isEmpty { lines.append("  cannot be opened (recover with their recovery keys): \(key.stranded.joined(separator: ", "))") }
    return lines
}
