@testable import CustodyCore
import CustodyFormat
import Foundation
import Glibc
import XCTest

/// The engine's file and data protection calls on files outside any mount.
final class FileProtectionTests: EngineTestCase {
    var files = ""

    override func setUpWithError() throws {
        try super.setUpWithError()
        files = directory + "/files"
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
    }

    func write(_ name: String, _ text: String, mode: mode_t = 0o644) throws -> String {
        let path = files + "/" + name
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: Int(mode)]))
        return path
    }

    func contents(_ path: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path))) }

    func testEncryptAndDecryptRoundTripKeepingModeAndRecognisingTheFile() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "a", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        let path = try write("doc.txt", String(repeating: "numbers ", count: 2000), mode: 0o640)
        try engine.encryptFile(storedPath: path, for: "ALICE@contoso.com")
        XCTAssertTrue(try engine.isFileEncrypted(storedPath: path))
        XCTAssertEqual(Array(try contents(path).prefix(8)), FileHeader.magic)
        XCTAssertNil(String(decoding: try contents(path), as: UTF8.self).range(of: "numbers"))
        let info = try engine.protectionInfo(ofStoredPath: path)
        XCTAssertEqual(info.owner, "alice@contoso.com")
        XCTAssertEqual(info.protectionClass, "untilFirstAuth")
        XCTAssertEqual(info.size, 16000)
        XCTAssertTrue(info.managed)
        var attributes = stat()
        XCTAssertEqual(stat(path, &attributes), 0)
        XCTAssertEqual(attributes.st_mode & 0o777, 0o640)
        XCTAssertThrowsError(try engine.encryptFile(storedPath: path, for: "alice@contoso.com")) { XCTAssertEqual($0 as? EngineError, .fileAlreadyEncrypted(path)) }

        try engine.decryptFile(storedPath: path, toCopyPath: files + "/copy.txt")
        XCTAssertEqual(try contents(files + "/copy.txt"), Array(String(repeating: "numbers ", count: 2000).utf8))
        try engine.decryptFile(storedPath: path)
        XCTAssertEqual(try contents(path), Array(String(repeating: "numbers ", count: 2000).utf8))
        XCTAssertThrowsError(try engine.decryptFile(storedPath: path)) { XCTAssertEqual($0 as? EngineError, .fileNotEncrypted(path)) }
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: files).sorted(), ["copy.txt", "doc.txt"], "no staging files left")
    }

    func testRefusalsLeaveTheFileAsItWas() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "a", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        _ = try engine.register(id: "b", upn: "bob@fabrikam.com")
        let path = try write("plain.txt", "plain")
        XCTAssertThrowsError(try engine.encryptFile(storedPath: path, for: "bob@fabrikam.com")) { XCTAssertEqual($0 as? EngineError, .identityNotManaged("bob@fabrikam.com")) }
        XCTAssertThrowsError(try engine.encryptFile(storedPath: path, for: "nobody@x.y")) { XCTAssertEqual($0 as? EngineError, .unknownAccount("nobody@x.y")) }
        XCTAssertEqual(link(path, files + "/second-name"), 0)
        XCTAssertThrowsError(try engine.encryptFile(storedPath: path, for: "alice@contoso.com")) {
            guard case .fileBusy? = $0 as? EngineError else { return XCTFail("\($0)") }
        }
        XCTAssertEqual(try contents(path), Array("plain".utf8))
        XCTAssertThrowsError(try engine.protectionInfo(ofStoredPath: files + "/missing")) {
            guard case .pathNotFound? = $0 as? EngineError else { return XCTFail("\($0)") }
            XCTAssertEqual(($0 as? EngineError)?.code, 101, "InvalidPath, answered as not found")
        }
        XCTAssertEqual(symlink(path, files + "/link"), 0)
        XCTAssertThrowsError(try engine.encryptFile(storedPath: files + "/link", for: "alice@contoso.com")) {
            guard case .invalidPath? = $0 as? EngineError else { return XCTFail("\($0)") }
        }
    }

    func testTamperedTruncatedAndOrphanedFilesFailToDecrypt() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "a", upn: "alice@contoso.com", policy: Policy(protectionLevel: .none))
        let path = try write("doc.txt", String(repeating: "x", count: 10000))
        try engine.encryptFile(storedPath: path, for: "alice@contoso.com")
        let sealed = try contents(path)

        var tampered = sealed
        tampered[FileHeader.length + 4100] ^= 1
        try Data(tampered).write(to: URL(fileURLWithPath: path))
        XCTAssertThrowsError(try engine.decryptFile(storedPath: path, toCopyPath: files + "/out")) {
            guard case .failedToDecryptFile? = $0 as? EngineError else { return XCTFail("\($0)") }
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: files + "/out"))
        XCTAssertEqual(try contents(path), tampered, "the input is untouched")

        // Cut at a block boundary: detected by the final-block flag.
        let blocks = BlockLayout()
        try Data(sealed.prefix(Int(blocks.storedSize(plaintextSize: 8192)))).write(to: URL(fileURLWithPath: path))
        XCTAssertThrowsError(try engine.decryptFile(storedPath: path)) {
            guard case .failedToDecryptFile? = $0 as? EngineError else { return XCTFail("\($0)") }
        }

        // After a wipe, the keys are gone.
        try Data(sealed).write(to: URL(fileURLWithPath: path))
        try engine.deregister("alice@contoso.com", wipe: true)
        XCTAssertThrowsError(try engine.decryptFile(storedPath: path, toCopyPath: files + "/out")) {
            guard case .failedToDecryptFile(_, let reason)? = $0 as? EngineError else { return XCTFail("\($0)") }
            XCTAssertTrue(reason.contains("no keys"), reason)
        }
        XCTAssertTrue(try engine.isFileEncrypted(storedPath: path), "still recognisable")
    }

    func testDataProtectionFollowsTheSDKRules() throws {
        let engine = try makeEngine()
        try engine.enroll(id: "a", upn: "alice@contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication))
        let sealed = try engine.protectData(Array("secret".utf8), for: "alice@contoso.com")
        XCTAssertEqual(try engine.dataProtectionInfo(sealed).encrypted, true)
        XCTAssertEqual(try engine.unprotectData(sealed), Array("secret".utf8))
        let tagged = try engine.protectData(Array("hello".utf8), for: "Someone@Gmail.com")
        XCTAssertEqual(try engine.dataProtectionInfo(tagged).owner, "Someone@Gmail.com")
        XCTAssertEqual(try engine.dataProtectionInfo(tagged).encrypted, false)
        XCTAssertEqual(try engine.unprotectData(tagged), Array("hello".utf8))
        XCTAssertEqual(try engine.unprotectData(Array("raw".utf8)), Array("raw".utf8))
        XCTAssertEqual(try engine.dataProtectionInfo(Array("raw".utf8)).isProtected, false)
        XCTAssertThrowsError(try engine.protectData([1], for: "  ")) {
            guard case .invalidIdentity? = $0 as? EngineError else { return XCTFail("\($0)") }
        }
        try engine.deregister("alice@contoso.com", wipe: true)
        XCTAssertThrowsError(try engine.unprotectData(sealed)) {
            guard case .failedToUnprotectData? = $0 as? EngineError else { return XCTFail("\($0)") }
        }
    }
}
