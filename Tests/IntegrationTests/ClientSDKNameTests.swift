import CustodyClient
import Foundation
import Glibc
import Synchronization
import XCTest

/// The SDK's own spellings in CustodyClient (`policy(forAccountId:)`, `protectFileProviderItem`,
/// `registerAndEnrollAccountId`, `deRegisterAndUnenrollAccountId`, `Data` in and out), written as
/// the iOS code calls them, against a real daemon and mount.
final class ClientSDKNameTests: XCTestCase {
    var daemon: MountedDaemon!

    override func setUpWithError() throws {
        daemon = try MountedDaemon(extraArguments: ["--multi-identity", "--transfer-exempt-uid", "0"])
    }

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    func testPolicyEnrolmentFilesAndDataByTheSDKsNames() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        let policies = PolicyManager(client: client)
        let files = FileProtectionManager(client: client)
        let data = DataProtectionManager(client: client)

        var strict = CustodyPolicy(protectionLevel: "untilFirstAuth", fileProviderEncryptionRequired: true)
        strict.saveToLocations = []
        let alice = try await enrollment.registerAndEnrollAccountId("alice-oid", upn: "alice@contoso.com", policy: strict)
        XCTAssertTrue(alice.enrolled)
        XCTAssertEqual(alice.id, "alice-oid")
        _ = try await enrollment.registerAndEnrollAccountId("bob-oid", upn: "bob@contoso.com")
        _ = try await enrollment.registerAccount(id: "carol-oid", upn: "carol@personal.example")
        do {
            _ = try await enrollment.registerAndEnrollAccountId("alice-oid", upn: "alice@contoso.com")
            XCTFail("enrolled twice")
        } catch {
            XCTAssertEqual(error.code, 208, "\(error)")
            XCTAssertEqual(error.name, "AlreadyEnrolled")
        }

        // A policy per account; none for an account that is not managed.
        let alicePolicy = try await policies.policy(forAccountId: "alice-oid")
        let bobPolicy = try await policies.policy(forAccountId: "bob@contoso.com")
        let carolPolicy = try await policies.policy(forAccountId: "carol-oid")
        let strangerPolicy = try await policies.policy(forAccountId: "nobody-oid")
        let alices = try XCTUnwrap(alicePolicy)
        let bobs = try XCTUnwrap(bobPolicy)
        XCTAssertNil(carolPolicy, "registered, not enrolled")
        let enrolledIDs = try await enrollment.enrolledAccountIds()
        XCTAssertEqual(Set(enrolledIDs), ["alice-oid", "bob-oid"])
        let aliceManaged = try await policies.isManagedAccountId("alice@contoso.com")
        let carolManaged = try await policies.isManagedAccountId("carol-oid")
        XCTAssertTrue(aliceManaged)
        XCTAssertFalse(carolManaged)
        XCTAssertNil(strangerPolicy, "not registered")
        XCTAssertTrue(alices.shouldFileProviderEncryptFiles)
        XCTAssertFalse(bobs.shouldFileProviderEncryptFiles)
        XCTAssertEqual(alices.fields.saveToLocations, [])
        // Alice's data may be saved nowhere; Bob's (no list) anywhere.
        let aliceSavesLocally = try await alices.isSaveToAllowed(for: .localDrive)
        let bobSavesLocally = try await bobs.isSaveToAllowed(for: .localDrive)
        let bobOpensFromLocal = try await bobs.isOpenFromAllowed(for: .localDrive)
        XCTAssertFalse(aliceSavesLocally)
        XCTAssertTrue(bobSavesLocally)
        XCTAssertTrue(bobOpensFromLocal)

        // An item of Alice's in the protected directory.
        let item = daemon.mnt("Q3 plan.txt")
        try writeFile(item, bytes("Q3: ship it"))
        let info = try await files.protectFileProviderItem(item, forAccountId: "alice-oid")
        XCTAssertEqual(info.owner, "alice@contoso.com")
        XCTAssertTrue(info.encrypted)
        XCTAssertEqual(try readFile(item), bytes("Q3: ship it"))
        // protect(_:accountId:): Alice's policy keeps her data from other identities, none
        // included, so the owner cannot be taken away; giving it to her again is no change.
        do {
            _ = try await files.protect(item, accountId: nil)
            XCTFail("a managed file lost its owner")
        } catch {
            XCTAssertEqual(error.code, 312, "\(error)")
        }
        let owned = try await files.protect(item, accountId: "alice-oid")
        XCTAssertEqual(owned.owner, "alice@contoso.com")
        XCTAssertTrue(owned.encrypted)

        // The receiver's policy is asked: Bob may not receive it (Alice's policy shares with no
        // other identity), Alice may.
        let bobReceives = try await bobs.canReceiveSharedFileDecision(item)
        XCTAssertFalse(bobReceives.allowed, bobReceives.reason)
        XCTAssertEqual(bobReceives.code, 312, bobReceives.reason)
        let aliceReceives = try await alices.canReceiveSharedFile(item)
        XCTAssertTrue(aliceReceives)

        // Data as Data.
        let clipboard = Data("pasteboard secret".utf8)
        let sealed = try await data.protect(clipboard, accountId: "alice-oid")
        XCTAssertNil(sealed.range(of: clipboard))
        let sealedInfo = try await data.protectionInfo(sealed)
        XCTAssertTrue(sealedInfo.encrypted)
        let opened = try await data.unprotect(sealed)
        XCTAssertEqual(opened, clipboard)
        let untouched = try await data.unprotect(Data("never protected".utf8))
        XCTAssertEqual(untouched, Data("never protected".utf8))

        // Deregistering: with wipe, the item goes and the account has no policy any more.
        let wipe = try await enrollment.deRegisterAndUnenrollAccountId("alice-oid", withWipe: true)
        XCTAssertEqual(wipe?.code, 104)
        XCTAssertFalse(FileManager.default.fileExists(atPath: item))
        let afterWipe = try await policies.policy(forAccountId: "alice-oid")
        XCTAssertNil(afterWipe)
        let quietly = try await enrollment.deRegisterAndUnenrollAccountId("bob-oid", withWipe: false)
        XCTAssertNil(quietly)
        let accounts = try await enrollment.registeredAccounts()
        XCTAssertEqual(accounts.map(\.upn), ["carol@personal.example"])
    }

    /// Process and thread identities by the SDK's names: what the daemon resolves, and whose a
    /// file the process (or the thread) makes in the mount is; locking and unlocking.
    func testProcessAndThreadIdentitiesAndLocks() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        let policies = PolicyManager(client: client)
        let files = FileProtectionManager(client: client)
        try await enrollment.registerAndEnrollAccountId("alice-oid", upn: "alice@contoso.com")
        try await enrollment.registerAndEnrollAccountId("bob-oid", upn: "bob@contoso.com")

        let before = try await policies.getProcessAccountId()
        XCTAssertNil(before)
        try await policies.setProcessAccountId("alice-oid")
        let bound = try await policies.getProcessAccountId()
        XCTAssertEqual(bound, "alice@contoso.com")
        try writeFile(daemon.mnt("by-process.txt"), bytes("p"))
        let processFile = try await files.protectionInfo(daemon.mnt("by-process.txt"))
        XCTAssertEqual(processFile.owner, "alice@contoso.com")

        // A thread of its own works as Bob, and back as the process after.
        let mount = daemon.mountPoint
        let outcome = Mutex<[String]>([])
        let thread = Thread {
            do {
                try policies.setCurrentThreadAccountId("bob@contoso.com")
                let own = try policies.getCurrentThreadAccountId()
                let fd = open(mount + "/by-thread.txt", O_CREAT | O_WRONLY, 0o644)
                if fd >= 0 { close(fd) }
                try policies.setCurrentThreadAccountId(nil)
                let after = try policies.getCurrentThreadAccountId()
                outcome.withLock { $0 = [own ?? "-", fd >= 0 ? "made" : "not made", after ?? "-"] }
            } catch {
                outcome.withLock { $0 = ["\(error)"] }
            }
        }
        thread.start()
        let deadline = Date().addingTimeInterval(10)
        while outcome.withLock({ $0.isEmpty }), Date() < deadline { try await Task.sleep(nanoseconds: 20_000_000) }
        XCTAssertEqual(outcome.withLock { $0 }, ["bob@contoso.com", "made", "alice@contoso.com"])
        let threadFile = try await files.protectionInfo(daemon.mnt("by-thread.txt"))
        XCTAssertEqual(threadFile.owner, "bob@contoso.com")
        let stillAlice = try await policies.getProcessAccountId()
        XCTAssertEqual(stillAlice, "alice@contoso.com", "the thread's binding left the process's alone")

        try await policies.setProcessAccountId(nil)
        let unbound = try await policies.getProcessAccountId()
        XCTAssertNil(unbound)
        try writeFile(daemon.mnt("unbound.txt"), bytes("u"))
        let unboundFile = try await files.protectionInfo(daemon.mnt("unbound.txt"))
        XCTAssertNil(unboundFile.owner)

        // Locks.
        let locks = LockManager(client: client)
        let locked = try await locks.lock("alice@contoso.com")
        XCTAssertNotEqual(locked.lock, "unlocked")
        let unlocked = try await locks.unlock("alice@contoso.com")
        XCTAssertEqual(unlocked.lock, "unlocked")
        do {
            try await locks.lock("nobody@contoso.com")
            XCTFail("locked an unknown account")
        } catch {
            XCTAssertEqual(error.name, "UnknownAccount", "\(error)")
        }
    }

    /// Jobs, typed, followed to the end: protecting a directory tree, then a selective wipe.
    func testJobsAreStartedFollowedAndFinishedTyped() async throws {
        let client = ControlClient(socketPath: daemon.socket)
        let enrollment = EnrollmentManager(client: client)
        let jobs = JobManager(client: client)
        try await enrollment.registerAndEnrollAccountId("alice-oid", upn: "alice@contoso.com")
        try FileManager.default.createDirectory(atPath: daemon.mnt("tree/deeper"), withIntermediateDirectories: true)
        for index in 0..<20 { try writeFile(daemon.mnt("tree/deeper/file-\(index).txt"), bytes("file \(index)")) }

        let protect = try await jobs.startProtect(daemon.mnt("tree"), identity: "alice@contoso.com")
        XCTAssertEqual(protect.kind, .protect)
        XCTAssertEqual(protect.target, daemon.mnt("tree"))
        var snapshots: [Job] = []
        for try await snapshot in jobs.progress(of: protect.id, interval: 0.01) { snapshots.append(snapshot) }
        let finished = try XCTUnwrap(snapshots.last)
        XCTAssertEqual(finished.state, .succeeded)
        XCTAssertNil(finished.failure)
        XCTAssertEqual(finished.progress["done"], 22, "the directory, the one below it and 20 files: \(finished.progress)")
        XCTAssertEqual(finished.protectionInfo?.owner, "alice@contoso.com")
        XCTAssertTrue(snapshots.dropLast().allSatisfy { $0.state == .running })
        let owner = try await FileProtectionManager(client: client).protectionInfo(daemon.mnt("tree/deeper/file-7.txt")).owner
        XCTAssertEqual(owner, "alice@contoso.com")

        let wipe = try await jobs.startWipe("alice@contoso.com")
        XCTAssertEqual(wipe.kind, .wipe)
        let wiped = try await jobs.wait(for: wipe.id)
        XCTAssertEqual(wiped.state, .succeeded)
        XCTAssertEqual(wiped.wipeResult?.code, 104)
        XCTAssertEqual(wiped.wipeResult?.deleted, 20)
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.mnt("tree/deeper/file-7.txt")))
        let listed = try await jobs.jobs()
        XCTAssertEqual(Set(listed.map(\.id)), [protect.id, wipe.id])

        // A job nobody started, and a wipe that fails as a job (no such account now).
        do {
            _ = try await jobs.job(999_999)
            XCTFail("a job that does not exist")
        } catch {
            XCTAssertEqual(error.name, "UnknownJob")
        }
        do {
            _ = try await jobs.startWipe("alice@contoso.com")
            XCTFail("wiped an account twice")
        } catch {
            XCTAssertEqual(error.name, "UnknownAccount", "\(error)")
        }
    }

    /// No daemon at the socket, or a path that is no daemon's socket: the SDK-named calls fail
    /// with the client's typed error.
    func testTheSDKsNamesFailTypedWithoutADaemon() async throws {
        let missing = daemon.root + "/no-daemon.sock"
        let policies = PolicyManager(client: ControlClient(socketPath: missing))
        do {
            _ = try await policies.policy(forAccountId: "alice-oid")
            XCTFail("an answer from no daemon")
        } catch {
            guard case .cannotConnect(let path, let code) = error else { return XCTFail("\(error)") }
            XCTAssertEqual(path, missing)
            XCTAssertEqual(code, ENOENT)
        }
        // A wrong socket: a path that is there but is no daemon's (an ordinary file).
        let wrong = daemon.root + "/not-a-socket"
        try writeFile(wrong, bytes("x"))
        do {
            _ = try await EnrollmentManager(client: ControlClient(socketPath: wrong)).registeredAccounts()
            XCTFail("an answer from a file")
        } catch {
            guard case .cannotConnect(let path, let code) = error else { return XCTFail("\(error)") }
            XCTAssertEqual(path, wrong)
            XCTAssertEqual(code, ECONNREFUSED)
        }
    }
}
