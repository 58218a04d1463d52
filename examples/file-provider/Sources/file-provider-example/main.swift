// The Intune App SDK guide's file-provider steps against custodyd, in order: enroll an account,
// protect an item, export it encrypted, import it back, decrypt it to a copy, ask whether another
// account may receive it, and react to a selective wipe. Each step prints what it did; any
// surprise exits with 1.
//
// Usage: file-provider-example SOCKET MOUNT EXPORTS
//   SOCKET   custodyd's control socket (an administrator's: the example enrolls and wipes)
//   MOUNT    a directory custodyd protects (the file provider's items live there)
//   EXPORTS  an ordinary directory (where the provider hands items out)
import CustodyClient
import FoundationEssentials
import Glibc
import Synchronization

func step(_ text: String) { print("• " + text) }

func fail(_ text: String) -> Never {
    print("✗ " + text)
    exit(1)
}

/// Hears the enrollment manager's calls, as an app's IntuneMAMEnrollmentDelegate does.
final class Delegate: EnrollmentDelegate, @unchecked Sendable {
    let statuses = Mutex<[String]>([])
    let cachedCopies = Mutex<[String]>([])

    func enrollmentRequest(with status: EnrollmentStatus) {
        statuses.withLock { $0.append("enrollment \(status.statusCode)") }
    }

    func policyRequest(with status: EnrollmentStatus) {
        statuses.withLock { $0.append("policy \(status.statusCode)") }
    }

    func unenrollRequest(with status: EnrollmentStatus, wiped: Bool) {
        // A wiped account's data leaves the app too: the copies it handed out of the mount. The
        // status is recorded after, so that whoever waits for it finds the copies gone.
        if wiped { for copy in cachedCopies.withLock({ $0 }) { unlink(copy) } }
        statuses.withLock { $0.append("unenroll \(status.statusCode) wiped=\(wiped)") }
    }

    func waitFor(_ status: String) async {
        for _ in 0..<500 where !statuses.withLock({ $0.contains(status) }) { try? await Task.sleep(nanoseconds: 10_000_000) }
        guard statuses.withLock({ $0.contains(status) }) else { fail("the delegate never heard \(status): \(statuses.withLock { $0 })") }
    }
}

func write(_ path: String, _ text: String) {
    guard let file = fopen(path, "w") else { fail("cannot write \(path)") }
    fputs(text, file)
    fclose(file)
}

func read(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = fread(&buffer, 1, buffer.count, file)
        if count == 0 { break }
        bytes += buffer[..<count]
    }
    return String(decoding: bytes, as: UTF8.self)
}

let arguments = CommandLine.arguments
guard arguments.count == 4 else { fail("usage: file-provider-example SOCKET MOUNT EXPORTS") }
let (socket, mount, exports) = (arguments[1], arguments[2], arguments[3])
let client = ControlClient(socketPath: socket)
let enrollment = EnrollmentManager(client: client)
let files = FileProtectionManager(client: client)
let policies = PolicyManager(client: client)
let account = "alice-oid"

do {
    // IntuneMAMEnrollmentManager.instance().delegate = self
    let delegate = Delegate()
    var start: UInt64 = 0
    for try await event in client.events(after: 0, follow: false) { start = event.sequence }
    let delivering = Task { try await enrollment.deliverEvents(to: delegate, after: start) }

    // 1. Enroll the account; its policy asks file providers to encrypt what they hand out.
    let policy = CustodyPolicy(protectionLevel: "untilFirstAuth", fileProviderEncryptionRequired: true)
    try await enrollment.registerAndEnrollAccountId(account, upn: "alice@contoso.com", policy: policy)
    await delegate.waitFor("enrollment 100")
    step("enrolled \(account): enrollmentRequestWithStatus 100")

    // 2. Protect an item the provider keeps for the account.
    let item = mount + "/Q3 plan.txt"
    write(item, "Q3: ship it")
    let info = try await files.protectFileProviderItem(item, forAccountId: account)
    guard info.encrypted, info.owner == "alice@contoso.com" else { fail("the item is not the account's and encrypted: \(info)") }
    step("protectFileProviderItem: owned by \(info.owner ?? "-"), encrypted")

    // 3. Export: the policy says whether the provider encrypts the copy it hands out.
    guard let accountPolicy = try await policies.policy(forAccountId: account) else { fail("no policy for \(account)") }
    let exported = exports + "/Q3 plan.txt"
    write(exported, read(item) ?? "")
    if accountPolicy.shouldFileProviderEncryptFiles {
        try await files.encryptFile(exported, forAccountId: account)
    }
    guard try await files.isFileEncrypted(exported), read(exported)?.contains("ship it") == false else { fail("the export is readable") }
    delegate.cachedCopies.withLock { $0.append(exported) }
    step("exported: shouldFileProviderEncryptFiles, so encryptFile(forAccountId:); the copy is ciphertext")

    // 4. Import: an encrypted item comes back and is decrypted to a copy for the app.
    let imported = exports + "/imported.txt"
    if try await files.isFileEncrypted(exported) {
        try await files.decryptFile(exported, toCopyPath: imported)
    }
    guard read(imported) == "Q3: ship it" else { fail("the imported copy reads \(read(imported) ?? "nothing")") }
    delegate.cachedCopies.withLock { $0.append(imported) }
    step("imported: isFileEncrypted, decryptFile(toCopyPath:) gives the plaintext")

    // 5. May another account receive it? The receiver's policy is asked.
    try await enrollment.registerAndEnrollAccountId("bob-oid", upn: "bob@contoso.com")
    guard let bobPolicy = try await policies.policy(forAccountId: "bob-oid") else { fail("no policy for bob-oid") }
    let bobMay = try await bobPolicy.canReceiveSharedFile(item)
    let aliceMay = try await accountPolicy.canReceiveSharedFile(item)
    guard !bobMay, aliceMay else { fail("canReceiveSharedFile: bob \(bobMay), alice \(aliceMay)") }
    step("canReceiveSharedFile: not for bob-oid (alice's policy shares with no other account), yes for alice-oid")

    // 6. A selective wipe (an administrator's, here the example's own): the item goes, the
    // delegate hears it and drops the copies the app handed out.
    let wipe = try await enrollment.deRegisterAndUnenrollAccountId(account, withWipe: true)
    await delegate.waitFor("unenroll 104 wiped=true")
    guard wipe?.code == 104, access(item, F_OK) != 0, access(exported, F_OK) != 0, access(imported, F_OK) != 0 else {
        fail("after the wipe: code \(wipe?.code ?? 0), item there \(access(item, F_OK) == 0), copies there \(access(exported, F_OK) == 0 || access(imported, F_OK) == 0)")
    }
    step("wiped: unenrollRequestWithStatus 104; the item and the app's copies are gone")
    delivering.cancel()
    print("✓ the file-provider flow works")
} catch {
    fail("\(error)")
}
