import ArgumentParser
import CustodyClient
import FoundationEssentials
import Glibc

/// Waits for a job, drawing a progress bar on the terminal (stderr) while it runs. `render`
/// turns the counters into a fraction done (nil when unknown) and a line of text.
func follow(_ job: CustodyJob, _ global: Global, _ render: ([String: UInt64]) -> (Double?, String)) throws -> CustodyJob {
    let terminal = isatty(2) == 1 && !global.json
    var current = job
    var frame = 0
    while current.state == "running" {
        if terminal { drawBar(render(current.progress), frame: frame) }
        frame += 1
        usleep(100_000)
        current = try decode(CustodyJob.self, try request(global, Endpoint.job, String(job.id)))
    }
    if terminal {
        drawBar(render(current.progress), frame: frame, final: current.state == "succeeded")
        _ = write(2, "\n", 1)
    }
    if let error = current.error {
        printError("\(error.message) (\(error.code) \(error.name))")
        throw ExitCode(error.code == 401 ? Exit.notAuthorized : Exit.failed)
    }
    return current
}

func drawBar(_ state: (Double?, String), frame: Int, final: Bool = false) {
    let width = 30
    let bar: String
    if let fraction = final ? 1.0 : state.0 {
        let filled = max(0, min(width, Int((fraction * Double(width)).rounded(.down))))
        bar = "[" + String(repeating: "#", count: filled) + String(repeating: " ", count: width - filled) + "] \(Int(min(1, fraction) * 100))%"
    } else {
        let position = frame % width
        bar = "[" + String(repeating: " ", count: position) + "<=>" + String(repeating: " ", count: max(0, width - position - 3)) + "]"
    }
    var line = "\r\u{1B}[K" + bar + " " + state.1
    line.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

func format3(_ value: Double) -> String {
    let scaled = Int((value * 1000).rounded())
    let fraction = String(scaled % 1000)
    return "\(scaled / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
}

struct Jobs: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the daemon's jobs (wipes, recursive protects), or show one; --wait waits for it.")
    @OptionGroup var global: Global
    @Argument(help: "A job ID.") var id: Int?
    @Flag(help: "Wait until the job has finished.") var wait = false

    func run() throws {
        guard let id else {
            let response = try request(global, Endpoint.jobs)
            let jobs = try decode([CustodyJob].self, response)
            show(response, global) { jobs.isEmpty ? "no jobs" : jobs.map(describe).joined(separator: "\n") }
            return
        }
        var response = try request(global, Endpoint.job, String(id))
        var job = try decode(CustodyJob.self, response)
        if wait, job.state == "running" {
            job = try follow(job, global) { progress in (nil, progress.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")) }
            response = try request(global, Endpoint.job, String(id))
        }
        show(response, global) { describe(job) }
        if job.state == "failed" { throw ExitCode(Exit.failed) }
    }

    func describe(_ job: CustodyJob) -> String {
        var text = "job \(job.id): \(job.kind) \(job.target) \(job.state)"
        if !job.progress.isEmpty { text += " (" + job.progress.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ") + ")" }
        if let error = job.error { text += ": \(error.message) (\(error.code) \(error.name))" }
        return text
    }
}

struct Events: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the daemon's events as they happen (kept ones first); --no-follow stops after those.")
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("Only events after this sequence number.", valueName: "n")) var after: UInt64 = 0
    @Flag(help: "Only events from now on (none of the kept ones).") var new = false
    @Flag(help: "Print the kept events and stop.") var noFollow = false
    @Option(help: ArgumentHelp("Stop after this many events.", valueName: "n")) var count: Int?

    func run() throws {
        var printed = 0
        try perform { () throws(CustodyClientError) in
            try global.client.stream(Endpoint.events.path(query: [("after", new ? "latest" : String(after)), ("follow", String(!noFollow))])) { line in
                if global.json {
                    print(line)
                } else if let event = try? JSONDecoder().decode(CustodyEvent.self, from: Data(line.utf8)) {
                    let code = event.code.map { " [\($0)]" } ?? ""
                    print("\(event.sequence) \(event.kind)\(code) \(event.identity ?? "-"): \(event.message)")
                }
                fflush(nil)
                printed += 1
                return count.map { printed < $0 } ?? true
            }
        }
    }
}

/// The part of a support bundle that says how it was scrubbed.
private struct Scrubbing: Decodable { var identitiesScrubbed: Bool? }

struct Diagnose: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write a support bundle (admin): versions, the machine, the configuration, status, jobs and recent events, identities scrubbed unless the administrator turned that off.",
        discussion: "The daemon scrubs the bundle as its log: configured values (ValuesToScrubFromLogging) always, identities unless the administrator turned that off (ScrubAccountIdentities = false, custodyd --log-identities), which the bundle and this command then say. Writes custody-diagnose-<time>.json, or --out FILE, or standard output with --out -.")
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("Where to write the bundle (- for standard output).", valueName: "file")) var out: String?

    func run() throws {
        let response = try request(global, Endpoint.diagnostics)
        var bundle = response.body
        // The client's side: its own version, and whether it reached the daemon as root.
        let client = ",\n  \"client\" : { \"custodyctl\" : \"\(Custodyctl.configuration.version)\", \"uid\" : \"\(geteuid())\" }\n}"
        if let close = bundle.lastIndex(of: UInt8(ascii: "}")) {
            bundle.replaceSubrange(close..., with: Array(client.utf8))
        }
        let path = out ?? "custody-diagnose-\(time(nil)).json"
        if path == "-" {
            try emit(bundle + [10], to: nil)
        } else {
            try emit(bundle + [10], to: path)
            if !global.json {
                // What the daemon says it did, not what it usually does.
                let scrubbed = (try? JSONDecoder().decode(Scrubbing.self, from: Data(response.body)))?.identitiesScrubbed
                let what = scrubbed == true ? "identities and configured values are scrubbed"
                    : scrubbed == false ? "configured values are scrubbed, identities are NOT (ScrubAccountIdentities = false): check the bundle before sharing it"
                    : "the daemon does not say whether identities are scrubbed: check the bundle before sharing it"
                print("wrote \(path) (\(bundle.count) bytes); \(what)")
            }
        }
    }
}
