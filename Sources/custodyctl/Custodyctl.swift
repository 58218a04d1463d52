import ArgumentParser
import CustodyClient
import CustodySystem
import FoundationEssentials
import Glibc

@main
struct Custodyctl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "custodyctl",
        abstract: "Control custodyd: accounts, locks, identities, file and data protection, wipe.",
        discussion: """
            Talks to custodyd over its control socket (--socket, else $CUSTODY_SOCKET, else \
            /run/custody/control.sock for root and $XDG_RUNTIME_DIR/custody.sock for others).
            Every command prints text, or JSON with --json.

            Exit codes: 0 success (or "yes"); 1 the daemon refused or the operation failed; \
            2 the answer is "no" (is-encrypted, can-receive, save-to-allowed, \
            open-from-allowed); 64 bad usage; 69 custodyd cannot \
            be reached; 77 not authorized.

            Shell completion: custodyctl --generate-completion-script bash|zsh|fish.
            """,
        version: "custodyctl \(CustodyVersion.string)",
        subcommands: [
            Status.self, Enroll.self, Accounts.self, Deregister.self, PolicyCommand.self,
            Lock.self, Unlock.self, Passphrase.self, Protector.self, RecoveryKeyCommand.self, Recover.self, MachineKeyCommand.self, Run.self, Bind.self, Unbind.self, IdentityCommand.self,
            Protect.self, Info.self, EncryptFile.self, DecryptFile.self, IsEncrypted.self, CanReceive.self, Repair.self,
            Locations.self, Locate.self, SaveToAllowed.self, OpenFromAllowed.self,
            ProtectData.self, UnprotectData.self, DataInfo.self,
            Files.self, Wipe.self, Jobs.self, Events.self, Diagnose.self, Agent.self,
        ])

    /// The options every command takes (`--socket`, `--json`) may come anywhere before `--`,
    /// also before the subcommand (`custodyctl --socket PATH status`) or between a command and
    /// its subcommand (`custodyctl protector --socket PATH add-login …`): they are moved to the
    /// end of the options, where the innermost subcommand reads them.
    static func main() {
        main(Self.movingGlobalOptions(Array(CommandLine.arguments.dropFirst())))
    }

    static func movingGlobalOptions(_ arguments: [String]) -> [String] {
        let end = arguments.firstIndex(of: "--") ?? arguments.endIndex
        var kept: [String] = [], global: [String] = []
        var index = arguments.startIndex
        while index < end {
            let argument = arguments[index]
            if argument == "--socket", index + 1 < end {
                global += [argument, arguments[index + 1]]
                index += 2
                continue
            }
            if argument.hasPrefix("--socket=") || argument == "--json" { global.append(argument) } else { kept.append(argument) }
            index += 1
        }
        guard !global.isEmpty, !kept.isEmpty else { return arguments }
        return kept + global + arguments[end...]
    }
}

/// Options every command takes.
struct Global: ParsableArguments {
    @Option(help: ArgumentHelp("The control socket.", valueName: "path"))
    var socket: String?

    @Flag(help: "Print the daemon's JSON answer instead of text.")
    var json = false

    var client: ControlClient { ControlClient(socketPath: socket) }
}

enum Exit {
    static let failed: Int32 = 1
    static let no: Int32 = 2
    static let unavailable: Int32 = 69
    static let notAuthorized: Int32 = 77
}

/// Runs a client call; errors are printed and become the documented exit codes.
func perform<T>(_ body: () throws(CustodyClientError) -> T) throws -> T {
    do throws(CustodyClientError) {
        return try body()
    } catch {
        printError(error.description)
        switch error {
        case .cannotConnect: throw ExitCode(Exit.unavailable)
        case .server(let status, _, _, _) where status == 403: throw ExitCode(Exit.notAuthorized)
        default: throw ExitCode(Exit.failed)
        }
    }
}

func printError(_ message: String) {
    var line = "custodyctl: " + message + "\n"
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

/// Prints the answer: raw JSON with --json, else `text`.
func show(_ response: ControlResponse, _ global: Global, _ text: () -> String) {
    if global.json {
        print(response.text)
    } else {
        let rendered = text()
        if !rendered.isEmpty { print(rendered) }
    }
}

/// Sends a request (with a body, one of CustodyAPI's request documents) and checks its status;
/// returns the answer.
func request(_ global: Global, _ method: String, _ path: String, body: (any Encodable)? = nil) throws -> ControlResponse {
    try perform { () throws(CustodyClientError) in
        let bytes = try body.map { (value) throws(CustodyClientError) in try ControlClient.encode(value) }
        let response = try global.client.send(method, path, body: bytes)
        try ControlClient.check(response)
        return response
    }
}

/// A request to `endpoint`, with its path parameter (an identity, a process or job ID) and query.
func request(_ global: Global, _ endpoint: Endpoint, _ parameter: String, query: [(String, String)] = [],
             body: (any Encodable)? = nil) throws -> ControlResponse {
    try request(global, endpoint.method, endpoint.path(parameter, query: query), body: body)
}

/// A request to an `endpoint` without a path parameter.
func request(_ global: Global, _ endpoint: Endpoint, query: [(String, String)] = [], body: (any Encodable)? = nil) throws -> ControlResponse {
    try request(global, endpoint.method, endpoint.path(query: query), body: body)
}

/// The answer of a finished job as the document `type` (a job's `result`).
func jobResult<T: Decodable>(_ type: T.Type, _ response: ControlResponse) throws -> T {
    let job = try decode(CustodyJob.self, response)
    return try perform { () throws(CustodyClientError) in
        guard let result = job.result(as: type) else { throw .badResponse("job \(job.id) has no \(type) as its answer") }
        return result
    }
}

func decode<T: Decodable>(_ type: T.Type, _ response: ControlResponse) throws -> T {
    try perform { () throws(CustodyClientError) in
        do { return try JSONDecoder().decode(T.self, from: Data(response.body)) } catch { throw .badResponse("\(error)") }
    }
}

/// Makes an absolute path from what the user typed (relative to the working directory).
func absolute(_ path: String) -> String {
    if path.isAbsolutePath { return path }
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    guard getcwd(&buffer, buffer.count) != nil else { return path }
    let cwd = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return (cwd == "/" ? "" : cwd) + "/" + path
}
