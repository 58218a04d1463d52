import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

/// A `custodyd` serving a fresh temporary backing directory at a fresh mount point.
/// Always unmounted and stopped (by PID) in `stop()`, which tests call from `tearDown`/`defer`.
final class MountedDaemon {
    let root: String
    let backing: String
    let mountPoint: String
    let state: String
    let logPath: String
    /// The daemon's control socket.
    let socket: String
    var pid: pid_t = 0

    /// Where the daemon binary is: `CUSTODYD`, else next to the test bundle.
    static var binary: String {
        if let path = ProcessInfo.processInfo.environment["CUSTODYD"] { return path }
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = bundle.deletingLastPathComponent()
        if directory.lastPathComponent == "MacOS" || bundle.pathExtension != "xctest" {
            directory = directory.deletingLastPathComponent()
        }
        return directory.appendingPathComponent("custodyd").path
    }

    /// FUSE must work here; under CI=true a missing /dev/fuse fails the test instead of skipping it.
    static func requireFUSE() throws {
        let fd = open("/dev/fuse", O_RDWR)
        if fd >= 0 { close(fd); return }
        if ProcessInfo.processInfo.environment["CI"] == "true" {
            XCTFail("/dev/fuse is not usable (\(Errno.current)) and CI=true: FUSE tests must run")
        }
        throw XCTSkip("/dev/fuse is not usable here")
    }

    /// `prepare` runs before the daemon starts, with the state directory's path (to enroll
    /// accounts and bind processes with an engine of the test's own).
    /// A command the daemon runs under (for example `prlimit --nofile=256`).
    var wrapper: [String] = []

    init(extraArguments: [String] = [], wrapper: [String] = [], prepare: ((String) throws -> Void)? = nil) throws {
        self.wrapper = wrapper
        try Self.requireFUSE()
        root = try makeTemporaryDirectory("custody-test")
        backing = root + "/backing"
        mountPoint = root + "/mnt"
        state = root + "/state"
        logPath = root + "/custodyd.log"
        socket = root + "/control.sock"
        for dir in [backing, mountPoint] { try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true) }
        if let prepare {
            try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
            do { try prepare(state) } catch {
                _ = try? runCommand(["rm", "-rf", root])
                throw error
            }
        }
        try start(extraArguments: extraArguments)
    }

    func start(extraArguments: [String] = []) throws {
        // The guard watches only what a test names: never the machine's own file systems.
        let guardArguments = extraArguments.contains("--guard-file-systems") ? [] : ["--guard-file-systems", "none"]
        let arguments = ["--state", state, "--socket", socket] + guardArguments + extraArguments + [backing, mountPoint]
        if let program = wrapper.first {
            pid = try spawn(program, Array(wrapper.dropFirst()) + [Self.binary] + arguments, stdoutPath: logPath, stderrPath: logPath)
        } else {
            pid = try spawn(Self.binary, arguments, stdoutPath: logPath, stderrPath: logPath)
        }
        let deadline = Date().addingTimeInterval(15)
        while Date() < deadline {
            if MountTable.entry(at: mountPoint)?.fileSystemType == "fuse.custody" { return }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                pid = 0
                throw HarnessError("custodyd exited before mounting: \(log)")
            }
            usleep(20_000)
        }
        stop()
        throw HarnessError("custodyd did not mount within 15 s: \(log)")
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    var isMounted: Bool { MountTable.entry(at: mountPoint) != nil }

    /// Unmounts and waits for the daemon, which must exit with status 0 (a crash anywhere in its
    /// teardown fails the test that caused it); escalates to SIGTERM (a daemon serving a
    /// configuration outlives an unmount) and SIGKILL if it lingers.
    func stop(file: StaticString = #filePath, line: UInt = #line) {
        if isMounted {
            _ = try? runCommand(["fusermount3", "-u", mountPoint])
            if isMounted { _ = try? runCommand(["fusermount3", "-uz", mountPoint]) }
        }
        guard pid > 0 else { return }
        defer { pid = 0 }
        var status: Int32 = 0
        var after = "its unmount"
        if !waitForExit(pid, seconds: 10, status: &status) {
            kill(pid, SIGTERM)
            after = "SIGTERM (it outlived its unmount by 10 s)"
            if !waitForExit(pid, seconds: 5, status: &status) {
                kill(pid, SIGKILL)
                _ = waitForExit(pid, seconds: 5)
                XCTFail("custodyd (\(pid)) did not exit after its unmount and SIGTERM; log: \(log)", file: file, line: line)
                return
            }
        }
        if status != 0 { XCTFail("custodyd (\(pid)) \(describeExit(status)) after \(after); log: \(log)", file: file, line: line) }
    }

    /// Kills the daemon with SIGKILL (no cleanup at all) and clears its dead mount.
    func killHard() {
        guard pid > 0 else { return }
        kill(pid, SIGKILL)
        waitForExit(pid, seconds: 10)
        pid = 0
        _ = try? runCommand(["fusermount3", "-uz", mountPoint])
    }

    /// Stops the daemon (which must exit with status 0) and removes every temporary file.
    func destroy(file: StaticString = #filePath, line: UInt = #line) {
        stop(file: file, line: line)
        _ = try? runCommand(["rm", "-rf", root])
    }

    func mnt(_ relative: String) -> String { mountPoint + "/" + relative }
    /// The backing path of `relative`: names as the backing directory stores them. A name stored
    /// encrypted is found through the mount (the entry with the inode number the mount shows);
    /// one that does not exist is kept as given.
    func back(_ relative: String) -> String {
        var stored = backing, shown = mountPoint
        for name in relative.split(separator: "/").map(String.init) {
            shown += "/" + name
            var attributes = stat()
            // Listed, not looked up: a lookup of a name that is not there would be cached.
            if lstat(stored + "/" + name, &attributes) != 0,
               let inode = Self.entries(in: shown.dropLast(name.utf8.count + 1).description).first(where: { $0.name == name })?.inode,
               let found = Self.entries(in: stored).first(where: { $0.inode == inode }) {
                stored += "/" + found.name
            } else {
                stored += "/" + name
            }
        }
        return stored
    }

    /// Before an identity's first unlock (or without its keys) its names show as stored (`~c3…`):
    /// the errno of reading the one such file at the top of the mount (nil when there is not
    /// exactly one). Listed, not looked up by its name, which a lookup would cache as missing.
    func refusalUnderStoredName() -> Int32? {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: mountPoint).filter({ $0.hasPrefix("~c3") }),
              names.count == 1 else { return nil }
        return errnoOf { _ = try readFile(self.mnt(names[0])) }
    }

    /// The entries of `directory`, with their inode numbers.
    static func entries(in directory: String) -> [(name: String, inode: ino_t)] {
        guard let stream = opendir(directory) else { return [] }
        defer { closedir(stream) }
        var found: [(name: String, inode: ino_t)] = []
        while let record = readdir(stream) {
            let name = withUnsafePointer(to: record.pointee.d_name) { pointer in
                pointer.withMemoryRebound(to: CChar.self, capacity: 256) { String(cString: $0) }
            }
            found.append((name, record.pointee.d_ino))
        }
        return found
    }
}

struct HarnessError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Waits for a child; true when it exited (and was reaped) within the time.
@discardableResult
func waitForExit(_ pid: pid_t, seconds: Double, status: UnsafeMutablePointer<Int32>? = nil) -> Bool {
    var result: Int32 = 0
    let exited = (try? eventually("process \(pid) to exit", timeout: seconds) {
        let reaped = waitpid(pid, &result, WNOHANG)
        return reaped == pid || (reaped == -1 && errno == ECHILD)
    }) != nil
    if exited { status?.pointee = result }
    return exited
}

/// What a wait status says, for messages: "exited with status N" or "was killed by SIGNAME".
func describeExit(_ status: Int32) -> String {
    let signal = status & 0x7f
    if signal == 0 { return "exited with status \((status >> 8) & 0xff)" }
    let name = strsignal(signal).map { String(cString: $0) } ?? "signal \(signal)"
    return "was killed by \(name)\(status & 0x80 != 0 ? " (core dumped)" : "")"
}

func makeTemporaryDirectory(_ prefix: String) throws -> String { try TemporaryDirectory(prefix).path }

/// Starts a program with stdout and stderr sent to files (or /dev/null), with this process's
/// environment plus `environment`.
func spawn(_ program: String, _ arguments: [String], stdoutPath: String = "/dev/null", stderrPath: String = "/dev/null",
           environment: [String: String] = [:]) throws -> pid_t {
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
    posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
    let argv = ([program] + arguments).map { strdup($0) } + [nil]
    var merged = ProcessInfo.processInfo.environment
    for (key, value) in environment { merged[key] = value }
    let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { (argv + envp).forEach { free($0) } }
    var pid: pid_t = 0
    let result = posix_spawnp(&pid, program, &actions, nil, argv, envp)
    guard result == 0 else { throw HarnessError("cannot start \(program): \(Errno(result))") }
    return pid
}

struct CommandResult {
    var status: Int32
    var output: String
    var error: String
}

/// Runs a command to completion and captures its output.
@discardableResult
func runCommand(_ arguments: [String], input: Data? = nil, directory: String? = nil, environment: [String: String]? = nil) throws -> CommandResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = arguments
    if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
    if let environment { process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
    let out = Pipe(), err = Pipe(), inPipe = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = input == nil ? FileHandle.nullDevice : inPipe
    try process.run()
    if let input {
        inPipe.fileHandleForWriting.write(input)
        try? inPipe.fileHandleForWriting.close()
    }
    // Read both pipes concurrently so that neither fills up.
    let group = DispatchGroup()
    nonisolated(unsafe) var errorData = Data()
    DispatchQueue.global().async(group: group) { errorData = err.fileHandleForReading.readDataToEndOfFile() }
    let outputData = out.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    process.waitUntilExit()
    return CommandResult(status: process.terminationStatus,
                         output: String(decoding: outputData, as: UTF8.self),
                         error: String(decoding: errorData, as: UTF8.self))
}

/// Runs a command and fails the test unless it exits 0.
@discardableResult
func mustRun(_ arguments: [String], input: Data? = nil, directory: String? = nil, file: StaticString = #filePath, line: UInt = #line) throws -> String {
    let result = try runCommand(arguments, input: input, directory: directory)
    if result.status != 0 {
        throw HarnessError("\(arguments.joined(separator: " ")) exited \(result.status): \(result.error)")
    }
    return result.output
}

// MARK: Small file helpers that report errno, so tests can assert on it.

func writeFile(_ path: String, _ bytes: [UInt8], flags: Int32 = O_WRONLY | O_CREAT | O_TRUNC, mode: mode_t = 0o644) throws {
    let fd = try Syscall.open(path, flags | O_CLOEXEC, mode)
    defer { close(fd) }
    try bytes.withUnsafeBytes { buffer in
        guard let base = buffer.baseAddress else { return }
        var offset = 0
        while offset < buffer.count {
            let n = Glibc.write(fd, base + offset, buffer.count - offset)
            if n < 0 { throw Errno.current }
            offset += n
        }
    }
}

func readFile(_ path: String) throws -> [UInt8] {
    let fd = try Syscall.open(path, O_RDONLY | O_CLOEXEC)
    defer { close(fd) }
    return try readAll(fd)
}

func readAll(_ fd: Int32) throws -> [UInt8] {
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    var offset: Int64 = 0
    while true {
        let n = try chunk.withUnsafeMutableBytes { buffer in
            try Syscall.pread(fd, buffer.baseAddress!, buffer.count, offset)
        }
        if n == 0 { return result }
        result.append(contentsOf: chunk[0..<n])
        offset += Int64(n)
    }
}

func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// The errno a throwing call failed with, or nil if it succeeded.
func errnoOf(_ body: () throws -> Void) -> Int32? {
    do {
        try body()
        return nil
    } catch let error as Errno {
        return error.rawValue
    } catch {
        return -1
    }
}

extension MountedDaemon {
    /// Calls the control API with curl; returns the HTTP status and the body.
    @discardableResult
    func api(_ method: String, _ path: String, _ body: String? = nil, asUser uid: UInt32? = nil) throws -> (status: Int, body: String) {
        var arguments = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket", socket, "-X", method]
        if let body { arguments += ["-H", "Content-Type: application/json", "--data-binary", body] }
        arguments.append("http://localhost" + path)
        if let uid { arguments = ["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + arguments }
        let result = try runCommand(arguments)
        let lines = result.output.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(lines.last ?? "") ?? 0, lines.dropLast().joined(separator: "\n"))
    }
}

/// The value of an extended attribute (the mount's virtual ones included), or nil.
func xattr(_ path: String, _ name: String) -> String? {
    var buffer = [UInt8](repeating: 0, count: 256)
    guard let count = try? Syscall.getxattr(path, name, &buffer, buffer.count) else { return nil }
    return String(decoding: buffer[0..<count], as: UTF8.self)
}
