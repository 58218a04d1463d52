import CustodyCore
import CustodyCrypto
import CustodyFormat
import CustodySystem
import CustodyTestSupport
import Foundation
import Glibc
import XCTest

/// What an earlier release stored for a managed identity (plain names, owner records and headers
/// that name it) keeps working and is brought to format version 3 in the background.
final class FormatUpgradeTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testAnEarlierReleasesTreeIsUpgradedAndReadsTheSame() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"]) { state in
            let engine = try Engine(stateDirectory: state)
            try engine.enroll(id: "alice-oid", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
            // Written as the earlier release did: names in clear, version 1 records and version 2
            // headers naming alice, and a personal file beside them.
            let backing = URL(fileURLWithPath: state).deletingLastPathComponent().appendingPathComponent("backing").path
            let owner = try Owner("alice@contoso.com")
            XCTAssertEqual(mkdir(backing + "/Project-Falcon", 0o755), 0)
            try OwnerRecord(owner: owner).store(at: backing + "/Project-Falcon")
            let classKey = try engine.classKey(for: "alice@contoso.com", .untilFirstAuthentication, purpose: .create)
            for (index, name) in ["Project-Falcon/acquisition-plan.txt", "layoffs-2027.txt"].enumerated() {
                let fd = try Syscall.open(backing + "/" + name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
                let file = try ProtectedFile.create(on: DescriptorStorage(fd: fd), owner: owner, protectionClass: .untilFirstAuthentication,
                                                    classKey: classKey)
                try Array("secret \(index)\n".utf8).withUnsafeBytes { try file.write($0, at: 0) }
                try file.sync()
                close(fd)
                try OwnerRecord(owner: owner, encryptedClass: .untilFirstAuthentication).store(at: backing + "/" + name)
            }
            // A version 1 file (an older release still): written anew in the current format.
            let fileKey = try SecretBytes.random(count: 32)
            let header = try FileHeader.encrypted(owner: owner, protectionClass: .untilFirstAuthentication, classKey: classKey, fileKey: fileKey,
                                                  blockSize: FileHeader.defaultBlockSize, version: 1)
            let fd = try Syscall.open(backing + "/version-one.txt", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            let storage = DescriptorStorage(fd: fd)
            try storage.writeBytes(header.encoded(), at: 0)
            let file = try ProtectedFile(storage: storage, header: header, fileKey: fileKey)
            try Array("version one\n".utf8).withUnsafeBytes { try file.write($0, at: 0) }
            try file.sync()
            close(fd)
            try OwnerRecord(owner: owner, encryptedClass: .untilFirstAuthentication).store(at: backing + "/version-one.txt")
            try Data("personal\n".utf8).write(to: URL(fileURLWithPath: backing + "/personal.txt"))
        }
        // The upgrade runs once the mount serves: wait until nothing names alice.
        try eventually("the upgrade", timeout: 20, interval: 0.1) {
            (try? runCommand(["grep", "-rli", "contoso", daemon.backing]).output.isEmpty) == true
                && (try? FileManager.default.contentsOfDirectory(atPath: daemon.backing).filter { $0.hasPrefix("~c3") }.count) == 3
        }
        let top = try FileManager.default.contentsOfDirectory(atPath: daemon.backing).sorted()
        XCTAssertEqual(top.filter { !$0.hasPrefix("~c3") }, ["personal.txt"])
        XCTAssertFalse(try mustRun(["getfattr", "-R", "-h", "-d", "-m", "-", "-e", "text", daemon.backing]).lowercased().contains("alice"))
        // Every stored header of alice's is version 3 now, naming no one; the mount reads the same.
        for path in try mustRun(["find", daemon.backing, "-type", "f", "-name", "~c3*"]).split(separator: "\n") {
            let bytes = Array(try Data(contentsOf: URL(fileURLWithPath: String(path))).prefix(FileHeader.length))
            let header = try bytes.withUnsafeBytes { try FileHeader.decode($0) }
            XCTAssertEqual(header.version, 3, String(path))
            XCTAssertNil(header.owner)
        }
        XCTAssertEqual(try readFile(daemon.mnt("Project-Falcon/acquisition-plan.txt")), bytes("secret 0\n"))
        XCTAssertEqual(try readFile(daemon.mnt("layoffs-2027.txt")), bytes("secret 1\n"))
        XCTAssertEqual(try readFile(daemon.mnt("version-one.txt")), bytes("version one\n"))
        XCTAssertEqual(xattr(daemon.mnt("Project-Falcon"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(xattr(daemon.mnt("layoffs-2027.txt"), "user.custody.owner"), "alice@contoso.com")
        XCTAssertEqual(try readFile(daemon.mnt("personal.txt")), bytes("personal\n"))

        // The pass completed: the backing directory says so, and the next start walks nothing.
        try eventually("the pass noted as complete", timeout: 10, interval: 0.1) { xattr(self.daemon.backing, "trusted.custody.upgraded") != nil }
        let noted = try XCTUnwrap(xattr(daemon.backing, "trusted.custody.upgraded"))
        XCTAssertTrue(noted.hasPrefix("v3:") && noted.count == 9, noted)
        daemon.stop()
        try OwnerRecord(owner: try Owner("alice@contoso.com")).store(at: mkdirBacking("Planted-Later"))
        try daemon.start(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        XCTAssertEqual(try readFile(daemon.mnt("layoffs-2027.txt")), bytes("secret 1\n"))
        usleep(1_500_000)
        XCTAssertTrue(FileManager.default.fileExists(atPath: daemon.backing + "/Planted-Later"), "no pass once one completed")
        // Without the note (a backing directory restored from an earlier release), it runs again.
        daemon.stop()
        try mustRun(["setfattr", "-x", "trusted.custody.upgraded", daemon.backing])
        try daemon.start(extraArguments: ["--multi-identity", "--default-identity", "0=alice@contoso.com"])
        try eventually("the second upgrade", timeout: 20, interval: 0.1) { !FileManager.default.fileExists(atPath: self.daemon.backing + "/Planted-Later") }
        XCTAssertTrue(FileManager.default.fileExists(atPath: daemon.mnt("Planted-Later")))
    }

    func mkdirBacking(_ name: String) throws -> String {
        let path = daemon.backing + "/" + name
        XCTAssertEqual(mkdir(path, 0o755), 0)
        return path
    }
}
