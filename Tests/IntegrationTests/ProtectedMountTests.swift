import CustodyCore
import CustodyFormat
import CustodySystem
import Foundation
import Glibc
import XCTest

/// The protected mount with three kinds of caller: a managed identity whose files are encrypted
/// (a shell bound to it before the daemon starts; its children inherit), an unmanaged identity
/// (the default of uid 65534), and a caller with no identity (root, MultiIdentity on).
final class ProtectedMountTests: XCTestCase {
    var daemon: MountedDaemon!
    var aliceShell: pid_t = 0
    var gate = "", aliceOutput = "", aliceStatus = ""
    static let markerA = "MARKER-ALICE-7f3e9a"
    static let markerB = "MARKER-BOB-2c81d4"
    static let markerC = "MARKER-NOBODY-55aa01"

    override func tearDown() {
        if aliceShell > 0 { kill(aliceShell, SIGKILL); waitForExit(aliceShell, seconds: 5) }
        daemon?.destroy()
        daemon = nil
    }

    /// Starts the daemon with Alice (enrolled, class A) and Bob (registered only) in its state, and
    /// a shell bound to Alice that runs `aliceScript` once the test opens the gate.
    func startMount(aliceScript: String, multiIdentity: Bool = true) throws {
        let root = try makeTemporaryDirectory("custody-alice")
        gate = root + "/gate"
        aliceOutput = root + "/out"
        aliceStatus = root + "/status"
        // Root (the test) reads Alice's files back, exempt from the transfer rules
        // (IdentityBoundaryTests covers them).
        var extra = ["--allow-other", "--default-identity", "65534=bob@PERSONAL.example", "--transfer-exempt-uid", "0"]
        if multiIdentity { extra.append("--multi-identity") }
        daemon = try MountedDaemon(extraArguments: extra) { [self] state in
            var settings = Settings()
            settings.multiIdentity = multiIdentity
            let engine = try Engine(stateDirectory: state, settings: settings)
            try engine.enroll(id: "alice-oid", upn: "Alice@Contoso.com", policy: Policy(protectionLevel: .complete))
            try engine.register(id: "bob-oid", upn: "bob@personal.example")
            let mountPoint = URL(fileURLWithPath: state).deletingLastPathComponent().appendingPathComponent("mnt").path
            let script = "while [ ! -e '\(gate)' ]; do sleep 0.02; done; cd '\(mountPoint)' && { \(aliceScript) ; } > '\(aliceOutput)' 2>&1; echo $? > '\(aliceStatus)'"
            aliceShell = try spawn("/bin/sh", ["-c", script])
            try engine.bindProcess(aliceShell, to: "alice@contoso.com")
        }
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
    }

    /// Opens the gate and waits for Alice's shell; fails with its output if it failed.
    func runAlice() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: gate, contents: Data()))
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(aliceShell, seconds: 120, status: &status), "Alice's shell finished")
        aliceShell = 0
        let output = (try? String(contentsOfFile: aliceOutput, encoding: .utf8)) ?? ""
        let code = (try? String(contentsOfFile: aliceStatus, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(code, "0", "Alice's commands failed: \(output)\ndaemon log: \(daemon.log)")
    }

    func testThreeIdentitiesOwnersEncryptionAndVirtualAttributes() throws {
        try startMount(aliceScript: """
            echo taken-over > preexisting.txt && cat preexisting.txt && \
            echo \(Self.markerA) > alice.txt && mkdir work && echo second > work/nested.txt && \
            cat alice.txt && dd if=/dev/urandom of=big.bin bs=64k count=40 status=none && \
            sha256sum big.bin | cut -c1-64 > big.sum
            """)
        // A plain file made by root before Alice starts; Alice then overwrites it (O_TRUNC).
        try writeFile(daemon.mnt("preexisting.txt"), bytes("root's plain bytes\n"))
        XCTAssertNil(xattr(daemon.mnt("preexisting.txt"), "user.custody.owner"))
        try runAlice()
        let aliceText = try String(contentsOfFile: aliceOutput, encoding: .utf8)
        XCTAssertTrue(aliceText.contains(Self.markerA), "Alice reads her own file back")
        XCTAssertTrue(aliceText.hasPrefix("taken-over\n"), aliceText)
        XCTAssertEqual(xattr(daemon.mnt("preexisting.txt"), "user.custody.owner"), "Alice@Contoso.com", "opened with truncate: now Alice's")
        XCTAssertEqual(xattr(daemon.mnt("preexisting.txt"), "user.custody.encrypted"), "1")
        XCTAssertEqual(try readFile(daemon.mnt("preexisting.txt")), bytes("taken-over\n"))
        XCTAssertEqual(Array(try readFile(daemon.back("preexisting.txt")).prefix(8)), FileHeader.magic)

        // Bob: unmanaged, by the default identity of uid 65534.
        let bob = try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "echo \(Self.markerB) > '\(daemon.mnt("bob.txt"))'"])
        XCTAssertEqual(bob.status, 0, bob.error)
        // Root: no identity (MultiIdentity on, no binding, no default).
        try writeFile(daemon.mnt("none.txt"), bytes(Self.markerC + "\n"))

        // The backing store holds Alice's marker nowhere; the others' in clear.
        let grep = { (marker: String) in try runCommand(["grep", "-rl", marker, self.daemon.backing]).output }
        XCTAssertEqual(try grep(Self.markerA), "", "no plaintext of a managed file on the backing store")
        XCTAssertTrue(try grep(Self.markerB).contains("bob.txt"))
        XCTAssertTrue(try grep(Self.markerC).contains("none.txt"))

        // Through the mount: content, size, owners.
        XCTAssertEqual(try readFile(daemon.mnt("alice.txt")), bytes(Self.markerA + "\n"))
        XCTAssertEqual(try Syscall.lstat(daemon.mnt("alice.txt")).st_size, Self.markerA.utf8.count + 1, "stat shows the plaintext size")
        XCTAssertEqual(try Syscall.lstat(daemon.back("alice.txt")).st_size, 512 + Self.markerA.utf8.count + 1 + 28)
        XCTAssertEqual(xattr(daemon.mnt("alice.txt"), "user.custody.owner"), "Alice@Contoso.com")
        XCTAssertEqual(xattr(daemon.mnt("alice.txt"), "user.custody.class"), "complete")
        XCTAssertEqual(xattr(daemon.mnt("alice.txt"), "user.custody.encrypted"), "1")
        XCTAssertEqual(xattr(daemon.mnt("work/nested.txt"), "user.custody.owner"), "Alice@Contoso.com", "children of the bound shell inherit")
        XCTAssertEqual(xattr(daemon.mnt("bob.txt"), "user.custody.owner"), "bob@personal.example")
        XCTAssertEqual(xattr(daemon.mnt("bob.txt"), "user.custody.encrypted"), "0")
        XCTAssertNil(xattr(daemon.mnt("bob.txt"), "user.custody.class"))
        XCTAssertNil(xattr(daemon.mnt("none.txt"), "user.custody.owner"))
        XCTAssertEqual(xattr(daemon.mnt("none.txt"), "user.custody.encrypted"), "0")

        // The records stay on the backing store, hidden and unsettable through the mount.
        let listing = try mustRun(["getfattr", "-d", "-m", "-", "--absolute-names", daemon.mnt("alice.txt")])
        XCTAssertTrue(listing.contains("user.custody.owner=\"Alice@Contoso.com\""), listing)
        XCTAssertFalse(listing.contains("trusted."), listing)
        XCTAssertNotEqual(try runCommand(["setfattr", "-n", "trusted.custody.owner", "-v", "x", daemon.mnt("none.txt")]).status, 0)
        let steal = try runCommand(["setfattr", "-n", "user.custody.owner", "-v", "mallory@x", daemon.mnt("alice.txt")])
        XCTAssertNotEqual(steal.status, 0, "Alice's policy does not let other identities receive her files")
        XCTAssertTrue(steal.error.contains("not permitted"), steal.error)
        XCTAssertEqual(try OwnerRecord.load(from: daemon.back("bob.txt"))?.owner?.display, "bob@personal.example")
        // Alice's record names her by a key ID, not by name.
        let aliceRecord = try XCTUnwrap(try OwnerRecord.load(from: daemon.back("alice.txt")))
        XCTAssertNil(aliceRecord.owner)
        XCTAssertEqual(aliceRecord.encryptedClass, .complete)

        // A copy of the backing file is still a self-describing protected file: it names no owner,
        // and the daemon that holds the owner's keybag says whose it is.
        try mustRun(["cp", daemon.back("alice.txt"), daemon.root + "/exported"])
        let exported = Array(try Data(contentsOf: URL(fileURLWithPath: daemon.root + "/exported")))
        let header = try exported.withUnsafeBytes { try FileHeader.decode($0) }
        XCTAssertNil(header.owner)
        XCTAssertEqual(header.version, 3)
        XCTAssertEqual(header.protectionClass, .complete)
        XCTAssertNil(exported.firstRange(of: Array("contoso".utf8)))
        let info = try daemon.apiJSON("POST", "/v1/files/info", #"{"path": "\#(daemon.root)/exported"}"#)
        XCTAssertEqual(field(info.json, "owner"), "Alice@Contoso.com", "\(info.json)")

        // A larger random file round-trips (checked by Alice's own sha256 inside the mount).
        let sum = try String(contentsOfFile: daemon.mnt("big.sum"), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        XCTAssertEqual(try mustRun(["sha256sum", daemon.mnt("big.bin")]).prefix(64), Substring(sum))
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        XCTAssertEqual(try mustRun(["sha256sum", daemon.mnt("big.bin")]).prefix(64), Substring(sum), "cold read through the mount")

        // Rename and hard links keep the owner.
        XCTAssertEqual(rename(daemon.mnt("alice.txt"), daemon.mnt("work/renamed.txt")), 0)
        XCTAssertEqual(link(daemon.mnt("work/renamed.txt"), daemon.mnt("hardlink.txt")), 0)
        for path in ["work/renamed.txt", "hardlink.txt"] {
            XCTAssertEqual(xattr(daemon.mnt(path), "user.custody.owner"), "Alice@Contoso.com", path)
            XCTAssertEqual(try readFile(daemon.mnt(path)), bytes(Self.markerA + "\n"), path)
        }

        // Opened with truncate by a caller with no identity: the file becomes that caller's (none).
        try writeFile(daemon.mnt("work/nested.txt"), bytes("now personal\n"))
        XCTAssertNil(xattr(daemon.mnt("work/nested.txt"), "user.custody.owner"))
        XCTAssertEqual(try readFile(daemon.back("work/nested.txt")), bytes("now personal\n"))
    }

    func testManagedIdentityToolsTarCpSqlite() throws {
        let tarball = try makeTemporaryDirectory("custody-tar") + "/include.tar"
        try mustRun(["tar", "-C", "/usr", "-cf", tarball, "include"])
        try startMount(aliceScript: """
            tar -xf '\(tarball)' && cp -r include/linux copy && \
            sqlite3 notes.db "create table t(v text); insert into t values('\(Self.markerA)'); insert into t select v||'x' from t;" && \
            sqlite3 notes.db "select count(*) from t; pragma integrity_check;"
            """)
        try runAlice()
        XCTAssertTrue(try String(contentsOfFile: aliceOutput, encoding: .utf8).contains("2\nok"))
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include", daemon.mnt("include")])
        try mustRun(["diff", "-r", "--no-dereference", "/usr/include/linux", daemon.mnt("copy")])
        // Every regular file Alice made is stored encrypted.
        let files = try mustRun(["find", daemon.back("include"), daemon.back("copy"), daemon.back("notes.db"), "-type", "f"]).split(separator: "\n")
        XCTAssertGreaterThan(files.count, 5000)
        for path in files {
            let handle = try XCTUnwrap(FileHandle(forReadingAtPath: String(path)))
            let magic = handle.readData(ofLength: 8)
            try handle.close()
            XCTAssertEqual(Array(magic), FileHeader.magic, "\(path) is stored encrypted")
        }
        XCTAssertEqual(try runCommand(["grep", "-rl", Self.markerA, daemon.backing]).output, "")
        XCTAssertEqual(try mustRun(["sqlite3", daemon.mnt("notes.db"), "select v from t order by v limit 1;"]), Self.markerA + "\n")
    }

    func testWithoutMultiIdentityCallersDefaultToThePrimaryAccount() throws {
        try startMount(aliceScript: "true", multiIdentity: false)
        try runAlice()
        try writeFile(daemon.mnt("root-wrote.txt"), bytes(Self.markerC))
        XCTAssertEqual(xattr(daemon.mnt("root-wrote.txt"), "user.custody.owner"), "Alice@Contoso.com")
        XCTAssertEqual(xattr(daemon.mnt("root-wrote.txt"), "user.custody.encrypted"), "1")
        XCTAssertEqual(try runCommand(["grep", "-rl", Self.markerC, daemon.backing]).output, "")
    }

    func testGitRsyncReflinkCopyAndSharedMmapOnEncryptedFiles() throws {
        try startMount(aliceScript: """
            git init -q repo && cd repo && git config user.email a@contoso.com && git config user.name Alice && \
            echo \(Self.markerA) > notes.md && git add notes.md && git commit -q -m first && \
            echo more >> notes.md && git commit -q -am second && git log --oneline | wc -l && git fsck --full && cd .. && \
            rsync -a /usr/include/linux/ synced/ && cp --reflink=auto repo/notes.md reflinked.md && \
            head -c 65536 /dev/zero > mapped.bin
            """)
        try runAlice()
        let output = try String(contentsOfFile: aliceOutput, encoding: .utf8)
        XCTAssertTrue(output.hasPrefix("2\n"), "two commits: \(output)")
        try mustRun(["diff", "-r", "/usr/include/linux", daemon.mnt("synced")])
        XCTAssertEqual(try readFile(daemon.mnt("reflinked.md")), bytes(Self.markerA + "\nmore\n"))
        XCTAssertEqual(try runCommand(["grep", "-rl", Self.markerA, daemon.backing]).output, "", "git objects are compressed, the work tree file is not: neither is stored in clear")

        // A shared writable mapping of an encrypted file writes through the format.
        let fd = try Syscall.open(daemon.mnt("mapped.bin"), O_RDWR)
        let length = 65536
        guard let map = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), map != MAP_FAILED else {
            close(fd)
            return XCTFail("mmap: \(Errno.current)")
        }
        for offset in stride(from: 0, to: length, by: 4096) { map.storeBytes(of: 0xC3, toByteOffset: offset + 7, as: UInt8.self) }
        XCTAssertEqual(msync(map, length, MS_SYNC), 0)
        munmap(map, length)
        close(fd)
        try mustRun(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        let stored = try readFile(daemon.mnt("mapped.bin"))
        XCTAssertEqual(stored.count, length)
        XCTAssertEqual(stored.enumerated().filter { $0.element != 0 }.map(\.offset), Array(stride(from: 7, to: length, by: 4096)))
        XCTAssertEqual(xattr(daemon.mnt("mapped.bin"), "user.custody.encrypted"), "1")
    }
}
