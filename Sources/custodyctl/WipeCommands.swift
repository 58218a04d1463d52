import ArgumentParser
import CustodyClient
import FoundationEssentials
import Glibc

struct Wipe: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Selective wipe of an identity (admin): keys destroyed first, then its files deleted, then it is deregistered.",
        discussion: """
            On a terminal it first says what the wipe will delete and asks for the identity's name \
            to confirm (--yes does not ask; without a terminal on stdin nothing is asked). \
            --dry-run lists exactly what a wipe would delete and changes nothing. Shows a progress \
            bar on a terminal and waits for the result; --no-wait prints the job ID and returns.
            """)
    @OptionGroup var global: Global
    @Argument(help: "The account (ID or UPN).") var identity: String
    @Flag(help: "Start the wipe and return its job ID.") var noWait = false
    @Flag(help: "List what a wipe would delete, and change nothing.") var dryRun = false
    @Flag(help: "Do not ask for confirmation on a terminal.") var yes = false

    func run() throws {
        if dryRun {
            try listOwned(global, identity, mode: .wipePreview)
            return
        }
        if !yes { try confirmWipe(global, identity) }
        try runWipe(global: global, identity: identity, noWait: noWait, deregisterRoute: false)
    }
}

struct Files: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List what an identity owns in the mounts, with counts and bytes (admin).",
        discussion: """
            Files, directories it made and symlinks it named, as the mounts show them, then the \
            totals; a directory comes after what is in it. --wiped lists only what a wipe would \
            delete (as `custodyctl wipe --dry-run`). With --json, the daemon's lines (NDJSON).
            """)
    @OptionGroup var global: Global
    @Option(help: ArgumentHelp("The account (ID or UPN).", valueName: "identity")) var owner: String
    @Flag(help: "Only what a wipe of the identity would delete.") var wiped = false

    func run() throws {
        try listOwned(global, owner, mode: wiped ? .wipePreview : .all)
    }
}

enum OwnedListing { case all, wipePreview }

/// Prints what `identity` owns (or what a wipe deletes), one object per line as the daemon finds
/// it, then the totals.
func listOwned(_ global: Global, _ identity: String, mode: OwnedListing) throws {
    var summary: CustodyOwnedSummary?
    var failure: ErrorAnswer?
    try perform { () throws(CustodyClientError) in
        try global.client.ownedFiles(identity, wipe: mode == .wipePreview) { line in
            switch line {
            case .object(let object): if !global.json { print(describe(object, mode)) }
            case .summary(let found): summary = found
            case .error(let error): failure = error
            }
            if global.json, let bytes = try? line.json(lineEncoder) { print(String(decoding: bytes, as: UTF8.self)) }
            return true
        }
    }
    if let failure { printError("the listing stopped: \(failure.message) (\(failure.code) \(failure.name))") }
    guard let summary else {
        printError("the daemon ended the listing without its summary")
        throw ExitCode(Exit.failed)
    }
    if !global.json {
        if mode == .wipePreview {
            print(wipePreviewSentence(summary) + " Nothing was changed.")
        } else {
            print("\(summary.identity) owns \(totals(summary)) in the mounts" + (summary.keptDirectories > 0
                ? "; a wipe would leave \(count(summary.keptDirectories, "directory", "directories")) that hold other owners' objects." : "."))
        }
    }
    if !summary.complete || failure != nil { throw ExitCode(Exit.failed) }
}

private let lineEncoder: JSONEncoder = {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return encoder
}()

private func describe(_ object: CustodyOwnedObject, _ mode: OwnedListing) -> String {
    let size = object.kind == "file" ? humanBytes(object.size) : "-"
    let state = object.kind == "file" ? (object.encrypted ? "encrypted" : "plain") : ""
    let kind = object.kind.padding(9)
    let link = object.otherLink == true ? "  (another name of a file listed above)" : ""
    let prefix = mode == .wipePreview ? "would delete  " : ""
    return prefix + kind + " " + size.padding(10, left: true) + "  " + state.padding(9) + "  " + object.path + link
}

func totals(_ summary: CustodyOwnedSummary) -> String {
    var parts = [count(summary.files, "file", "files") + " (\(summary.encryptedFiles) encrypted, \(humanBytes(summary.size)); \(humanBytes(summary.bytesOnDisk)) on disk)",
                 count(summary.directories, "directory", "directories"), count(summary.symlinks, "symlink", "symlinks")]
    if summary.other > 0 { parts.append(count(summary.other, "other object", "other objects")) }
    return parts.dropLast().joined(separator: ", ") + " and " + (parts.last ?? "")
}

func wipePreviewSentence(_ summary: CustodyOwnedSummary) -> String {
    var text = "A wipe of \(summary.identity) destroys its keys (every copy of its encrypted files becomes unreadable), then deletes \(totals(summary))."
    if summary.keptDirectories > 0 {
        text += " \(count(summary.keptDirectories, "directory", "directories")) of it stay, holding other owners' objects (custodyctl files --owner \(summary.identity) lists them)."
    }
    return text
}

func count(_ number: Int, _ one: String, _ many: String) -> String { "\(number) \(number == 1 ? one : many)" }

extension String {
    fileprivate func padding(_ width: Int, left: Bool = false) -> String {
        let fill = String(repeating: " ", count: max(0, width - count))
        return left ? fill + self : self + fill
    }
}

/// On a terminal (stdin), says what the wipe will delete and asks for the identity's name; any
/// other answer, or none, stops here with nothing changed.
func confirmWipe(_ global: Global, _ identity: String) throws {
    guard isatty(0) == 1 else { return }
    var summary: CustodyOwnedSummary?
    try perform { () throws(CustodyClientError) in
        try global.client.ownedFiles(identity, wipe: true) { line in
            if case .summary(let found) = line { summary = found }
            return true
        }
    }
    guard let summary else {
        printError("the daemon ended the listing without its summary; nothing was wiped")
        throw ExitCode(Exit.failed)
    }
    let account = try decode(CustodyAccount.self, try request(global, Endpoint.account, identity))
    var question = wipePreviewSentence(summary)
        + " This cannot be undone (custodyctl wipe \(identity) --dry-run lists every path).\n"
        + "Type the identity (\(account.upn)) to wipe it: "
    question.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
    let answer = (readLine(strippingNewline: true) ?? "").trimmingCharacters(in: .whitespaces)
    let accepted = [account.upn, account.id, identity].contains { $0.lowercased() == answer.lowercased() }
    guard !answer.isEmpty, accepted else {
        printError(answer.isEmpty ? "not confirmed: nothing was wiped" : "\(answer) is not \(account.upn): nothing was wiped")
        throw ExitCode(Exit.failed)
    }
}

func runWipe(global: Global, identity: String, noWait: Bool, deregisterRoute: Bool) throws {
    let started = deregisterRoute ? try request(global, Endpoint.deregister, identity, query: [("wipe", "true"), ("wait", "false")])
        : try request(global, Endpoint.wipe, identity, query: [("wait", "false")])
    let job = try decode(CustodyJob.self, started)
    if noWait {
        show(started, global) { "wipe of \(job.target) started: job \(job.id) (custodyctl jobs \(job.id))" }
        return
    }
    let finished = try follow(job, global) { progress in
        var text = "scanned \(progress["scanned"] ?? 0), deleted \(progress["deleted"] ?? 0), \(humanBytes(progress["bytesFreed"] ?? 0)) freed"
        if progress["keysDestroyedMicroseconds"] != nil { text = "keys destroyed; " + text }
        return (nil, text)
    }
    let response = try request(global, Endpoint.job, String(finished.id))
    let result = try jobResult(WipeResult.self, response)
    show(response, global) {
        """
        wiped \(result.identity): \(result.code) \(result.result)
          keys destroyed after \(String(format3(result.keysDestroyedSeconds * 1000))) ms
          scanned \(result.scanned), deleted \(result.deleted), \(humanBytes(result.bytesFreed)) freed
        """
    }
}
