import CustodyClient
import Foundation
import Glibc
import XCTest

/// Reads like a file-provider extension on iOS, with CustodyClient's SDK-named managers: export a
/// managed file (policy says exports are encrypted → encrypt a copy for the account), import one
/// (is it encrypted? → decrypt to a copy path; may the target owner receive it?).
final class FileProviderExampleTests: XCTestCase {
    var daemon: MountedDaemon!
    var exports: String!

    override func setUpWithError() throws {
        // The test exports and imports as root, exempt from the transfer rules.
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--transfer-exempt-uid", "0"])
        exports = try makeTemporaryDirectory("file-provider")
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
        if let exports { _ = try? runCommand(["rm", "-rf", exports]) }
    }

    func testExportAndImportLikeAFileProvider() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        let files = FileProtectionManager(client: client)
        let data = DataProtectionManager(client: client)

        let policy = CustodyPolicy(protectionLevel: "NSFileProtectionCompleteUntilFirstUserAuthentication", fileProviderEncryptionRequired: true)
        let alice = try await enrollment.registerAndEnrollAccount(id: "alice-oid", upn: "alice@contoso.com", policy: policy)
        XCTAssertTrue(alice.enrolled)
        _ = try await enrollment.registerAndEnrollAccount(id: "bob-oid", upn: "bob@contoso.com")
        let accounts = try await enrollment.registeredAccounts()
        XCTAssertEqual(Set(accounts.map(\.upn)), ["alice@contoso.com", "bob@contoso.com"])

        // A document alice's app keeps in the protected directory.
        let document = daemon.mnt("Q3 plan.txt")
        try writeFile(document, bytes("Q3: ship it"))
        try await files.protect(document, identity: "alice@contoso.com")
        let info = try await files.protectionInfo(document)
        XCTAssertEqual(info.owner, "alice@contoso.com")
        XCTAssertTrue(info.encrypted)

        // Export: the extension copies the item out; the policy wants exports encrypted.
        let exported = exports + "/Q3 plan.txt"
        try writeFile(exported, try readFile(document))
        let owner = try XCTUnwrap(info.owner)
        if let account = accounts.first(where: { $0.upn == owner }), account.policy?.fileProviderEncryptionRequired == true {
            try await files.encryptFile(exported, forAccountId: account.id)
        }
        let exportedIsEncrypted = try await files.isFileEncrypted(exported)
        XCTAssertTrue(exportedIsEncrypted)
        XCTAssertNil(String(decoding: try readFile(exported), as: UTF8.self).range(of: "ship it"))

        // Import: an encrypted item comes back; decrypt it to a copy for the app.
        let imported = exports + "/imported.txt"
        if try await files.isFileEncrypted(exported) {
            try await files.decryptFile(exported, toCopyPath: imported)
        }
        XCTAssertEqual(try readFile(imported), bytes("Q3: ship it"))

        // May bob's app receive alice's document? Not under her policy.
        let decision = try await files.canReceiveSharedFile(document, identity: "bob@contoso.com")
        XCTAssertFalse(decision.allowed, decision.reason)
        let own = try await files.canReceiveSharedFile(document, identity: "alice@contoso.com")
        XCTAssertTrue(own.allowed)

        // Data protection for a clipboard item.
        let sealed = try await data.protect("pasteboard secret", identity: "alice@contoso.com")
        let dataInfo = try await data.protectionInfo(sealed)
        XCTAssertTrue(dataInfo.encrypted)
        let clear = try await data.unprotectString(sealed)
        XCTAssertEqual(clear, "pasteboard secret")

        // Selective wipe: the export is unreadable from then on, with the documented error.
        let wipe = try await enrollment.deRegisterAndUnenrollAccount("alice@contoso.com", withWipe: true)
        XCTAssertEqual(wipe?.code, 104)
        XCTAssertFalse(FileManager.default.fileExists(atPath: document))
        do {
            try await files.decryptFile(exported, toCopyPath: exports + "/after-wipe.txt")
            XCTFail("a wiped identity's export decrypted")
        } catch {
            XCTAssertEqual(error.code, 103)
            XCTAssertEqual(error.name, "FailedToDecryptFile")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: exports + "/after-wipe.txt"))
    }
}
