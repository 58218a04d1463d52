import ArgumentParser
import CustodyClient
import CustodySystem
import FoundationEssentials
import Glibc

func describe(_ info: FileProtectionInfo) -> String {
    var lines = ["\(info.path)"]
    lines.append("  kind: \(info.kind)")
    lines.append("  owner: " + (info.owner.map { $0 + (info.managed ? " (managed)" : " (unmanaged)") } ?? "none"))
    lines.append("  encrypted: " + (info.encrypted ? "yes, class \(info.protectionClass ?? "?")" : "no") + (info.plainReason.map { ": " + $0 } ?? ""))
    if info.kind == "file" { lines.append("  size: \(info.size) bytes") }
    if let mount = info.mountPoint { lines.append("  mount: \(mount)") }
    return lines.joined(separator: "\n")
}

struct Protect: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Set the owner of a file, or of a directory and everything in it, in a mount.",
        discussion: "Files of a managed identity whose policy encrypts are encrypted; --remove makes them plain and ownerless.")
    @OptionGroup var global: Global
    @Argument(help: "A file or directory in a mount.") var path: String
    @Argument(help: "The new owner identity.") var identity: String?
    @Flag(help: "Remove the owner instead.") var remove = false

    func validate() throws {
        guard (identity == nil) == remove else { throw ValidationError("give an identity or --remove") }
    }

    func run() throws {
        let path = absolute(self.path)
        let started = try request(global, Endpoint.protectFile, body: ProtectRequest(path: path, identity: identity, wait: false))
        let job = try decode(CustodyJob.self, started)
        let total = countObjects(path)
        let finished = try follow(job, global) { progress in
            let done = progress["done"] ?? 0
            return (total > 0 ? Double(done) / Double(total) : nil, "\(done)/\(total) files and directories")
        }
        let response = try request(global, Endpoint.job, String(finished.id))
        let result = try jobResult(FileProtectionInfo.self, response)
        show(response, global) { describe(result) }
    }

    /// Files and directories under `path` (for the progress bar's total).
    func countObjects(_ path: String) -> Int {
        var info = stat()
        guard lstat(path, &info) == 0 else { return 0 }
        guard info.st_mode & S_IFMT == S_IFDIR else { return 1 }
        guard let directory = opendir(path) else { return 1 }
        defer { closedir(directory) }
        var count = 1
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name == "." || name == ".." || name.hasPrefix(".custody-") { continue }
            let type = entry.pointee.d_type
            if type == UInt8(DT_DIR) { count += countObjects(path + "/" + name) } else if type == UInt8(DT_REG) { count += 1 }
        }
        return count
    }
}

struct Info: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show a file's protection: owner, managed or not, encrypted, class, size.")
    @OptionGroup var global: Global
    @Argument(help: "A file or directory (in a mount or anywhere).") var path: String

    func run() throws {
        let response = try request(global, Endpoint.fileInfo, body: PathRequest(path: absolute(path)))
        let info = try decode(FileProtectionInfo.self, response)
        show(response, global) { describe(info) }
    }
}

struct EncryptFile: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Encrypt a file in place for an enrolled account (encryptFile:forAccountId:).")
    @OptionGroup var global: Global
    @Argument(help: "The file.") var path: String
    @Argument(help: "The account (ID or UPN).") var identity: String

    func run() throws {
        let response = try request(global, Endpoint.encryptFile, body: PathIdentityRequest(path: absolute(path), identity: identity))
        let info = try decode(FileProtectionInfo.self, response)
        show(response, global) { "encrypted " + describe(info) }
    }
}

struct DecryptFile: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Decrypt a file into a copy (decryptFile:toCopyPath:), or in place with --in-place.")
    @OptionGroup var global: Global
    @Argument(help: "The encrypted file.") var path: String
    @Argument(help: "Where to write the plaintext copy.") var copyPath: String?
    @Flag(help: "Decrypt the file itself.") var inPlace = false

    func validate() throws {
        guard (copyPath == nil) == inPlace else { throw ValidationError("give a copy path or --in-place") }
    }

    func run() throws {
        let response = try request(global, Endpoint.decryptFile, body: DecryptRequest(path: absolute(path), copyPath: copyPath.map(absolute)))
        let info = try decode(FileProtectionInfo.self, response)
        show(response, global) { "decrypted to " + describe(info) }
    }
}

struct IsEncrypted: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Is the file in Custody's encrypted format? Exit 0 yes, 2 no.")
    @OptionGroup var global: Global
    @Argument(help: "The file.") var path: String

    func run() throws {
        let response = try request(global, Endpoint.isEncrypted, body: PathRequest(path: absolute(path)))
        let answer = try decode(EncryptedAnswer.self, response)
        show(response, global) { answer.encrypted ? "\(answer.path): encrypted" : "\(answer.path): not encrypted" }
        if !answer.encrypted { throw ExitCode(Exit.no) }
    }
}

struct Repair: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Cut an encrypted file back to its last authentic block (administrators).",
        discussion: """
            For a file that reads as damaged because custodyd stopped without a clean shutdown while writing it \
            (a torn write: the event stream says so), or that is damaged: the file keeps the blocks before the first \
            that fails authentication, and its new last block is sealed again, so it reads cleanly to its new end. \
            Nothing that did not verify is kept. A whole file is left as it is. The file must not be open in the mount; \
            its owner's keys must be unlocked. The repair is logged and sent as a fileRepaired event.
            """)
    @OptionGroup var global: Global
    @Argument(help: "The file (in a mount, or a stored file outside one).") var path: String

    func run() throws {
        let response = try request(global, Endpoint.repairFile, body: PathRequest(path: absolute(path)))
        let answer = try decode(RepairResult.self, response)
        show(response, global) {
            guard answer.repaired else { return "\(answer.path): whole, nothing to repair (\(answer.sizeAfter) bytes)" }
            let before = answer.sizeBefore.map { "\($0) bytes" } ?? "a torn length"
            return "\(answer.path): cut back to its last authentic block, \(before) → \(answer.sizeAfter) bytes"
                + (answer.firstDamagedBlock.map { " (block \($0) was the first damaged)" } ?? "")
        }
    }
}

struct CanReceive: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "May an identity receive this file (canReceiveSharedFile)? Exit 0 yes, 2 no.")
    @OptionGroup var global: Global
    @Argument(help: "The file.") var path: String
    @Argument(help: "The receiving identity.") var identity: String

    func run() throws {
        let response = try request(global, Endpoint.canReceive, body: PathIdentityRequest(path: absolute(path), identity: identity))
        let decision = try decode(SharingDecision.self, response)
        show(response, global) { (decision.allowed ? "yes: " : "no: ") + decision.reason }
        if !decision.allowed { throw ExitCode(Exit.no) }
    }
}

// MARK: Data

/// Input bytes: a string argument, a file, or standard input.
struct DataInput: ParsableArguments {
    @Option(help: ArgumentHelp("Protect this string.", valueName: "text")) var string: String?
    @Option(name: .customLong("in"), help: ArgumentHelp("Read the bytes from this file (default: standard input).", valueName: "file")) var input: String?

    func read() throws -> [UInt8] {
        if let string { return Array(string.utf8) }
        return try readBytes(from: input)
    }
}

/// The bytes of a file, or of standard input when `input` is nil.
func readBytes(from input: String?) throws -> [UInt8] {
    let fd = input.map { open($0, O_RDONLY | O_CLOEXEC) } ?? 0
    guard fd >= 0 else {
        printError("cannot read \(input ?? "stdin"): \(String(cString: strerror(errno)))")
        throw ExitCode(Exit.failed)
    }
    defer { if input != nil { close(fd) } }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        if count < 0, errno == EINTR { continue }
        if count <= 0 { break }
        bytes += chunk[0..<count]
    }
    return bytes
}

/// Writes bytes to a file or standard output.
func emit(_ bytes: [UInt8], to path: String?) throws {
    let fd = path.map { open($0, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600) } ?? 1
    guard fd >= 0 else {
        printError("cannot write \(path ?? "stdout"): \(String(cString: strerror(errno)))")
        throw ExitCode(Exit.failed)
    }
    defer { if path != nil { close(fd) } }
    var offset = 0
    while offset < bytes.count {
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
        if written < 0, errno == EINTR { continue }
        guard written > 0 else { throw ExitCode(Exit.failed) }
        offset += written
    }
}


func base64Bytes(_ text: String) throws -> [UInt8] {
    guard let data = Data(base64Encoded: text) else {
        printError("the daemon's answer is not base64")
        throw ExitCode(Exit.failed)
    }
    return Array(data)
}

struct ProtectData: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Protect bytes for an identity: encrypted for a managed one, tagged for others.",
        discussion: "Reads --string, --in FILE or standard input; writes the protected bytes to --out FILE or standard output (base64 with --base64).")
    @OptionGroup var global: Global
    @Argument(help: "The identity.") var identity: String
    @OptionGroup var input: DataInput
    @Option(help: ArgumentHelp("Write the protected bytes here.", valueName: "file")) var out: String?
    @Flag(help: "Print base64 instead of raw bytes.") var base64 = false

    func run() throws {
        let bytes = try input.read()
        let response = try request(global, Endpoint.protectData, body: DataRequest(identity: identity, data: Data(bytes).base64EncodedString()))
        let answer = try decode(DataResult.self, response)
        if global.json { print(response.text); return }
        if base64 { print(answer.data) } else { try emit(try base64Bytes(answer.data), to: out) }
    }
}

struct UnprotectData: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Unprotect bytes (input that was never protected comes back unchanged).",
        discussion: "Reads --in FILE or standard input (raw, or base64 with --base64); writes the plaintext to --out FILE or standard output.")
    @OptionGroup var global: Global
    @Option(name: .customLong("in"), help: ArgumentHelp("Read the protected bytes from this file.", valueName: "file")) var input: String?
    @Option(help: ArgumentHelp("Write the plaintext here.", valueName: "file")) var out: String?
    @Flag(help: "The input is base64.") var base64 = false

    func run() throws {
        var bytes = try readBytes(from: input)
        if base64 { bytes = try base64Bytes(String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: " \n\r\t")) }
        let response = try request(global, Endpoint.unprotectData, body: DataRequest(data: Data(bytes).base64EncodedString()))
        let answer = try decode(DataResult.self, response)
        if global.json { print(response.text); return }
        try emit(try base64Bytes(answer.data), to: out)
    }
}

struct DataInfo: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show what protected bytes say about themselves: owner, managed, encrypted, class.")
    @OptionGroup var global: Global
    @Option(name: .customLong("in"), help: ArgumentHelp("Read the bytes from this file (default: standard input).", valueName: "file")) var input: String?

    func run() throws {
        let bytes = try readBytes(from: input)
        let response = try request(global, Endpoint.dataInfo, body: DataRequest(data: Data(bytes).base64EncodedString()))
        let info = try decode(DataProtectionInfo.self, response)
        show(response, global) {
            guard info.isProtected else { return "not protected" }
            return "owner: \(info.owner ?? "none")" + (info.managed ? " (managed)" : " (unmanaged)") + "\nencrypted: " + (info.encrypted ? "yes, class \(info.protectionClass ?? "?")" : "no")
        }
    }
}
