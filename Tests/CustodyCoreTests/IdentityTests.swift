@testable import CustodyCore
import CustodySystem
import Foundation
import Glibc
import XCTest
import CustodyTestSupport

final class IdentityTests: EngineTestCase {
    func testPrecedenceThreadProcessAncestorUidPrimaryNone() throws {
        let table = FakeProcessTable()
        // init(1) ← shell(100) ← worker(200, threads 200 and 201)
        table.add(1, start: 1)
        table.add(100, parent: 1, start: 500)
        table.add(200, parent: 100, start: 900)
        table.add(201, process: 200, parent: 100, start: 901)
        var settings = testSettings(multiIdentity: true)
        settings.defaultIdentities = [1000: "personal@example.org", 1001: "ALICE@contoso.COM"]
        let engine = try makeEngine(settings, processes: table)
        try engine.enroll(id: "alice-id", upn: "Alice@Contoso.com")

        XCTAssertEqual(engine.resolve(thread: 200, uid: 0), ResolvedIdentity(identity: nil, source: .none))
        XCTAssertEqual(engine.resolve(thread: 200, uid: 1000), ResolvedIdentity(identity: "personal@example.org", source: .uidDefault(1000)))
        XCTAssertEqual(engine.resolve(thread: 200, uid: 1001), ResolvedIdentity(identity: "Alice@Contoso.com", source: .uidDefault(1001)),
                       "a default naming a registered account answers with the account's spelling")

        try engine.bindProcess(100, to: "alice@contoso.com")
        XCTAssertEqual(engine.resolve(thread: 201, uid: 1000), ResolvedIdentity(identity: "Alice@Contoso.com", source: .ancestor(100)),
                       "descendants inherit; a registered account answers with its own spelling")
        XCTAssertEqual(engine.resolve(thread: 100, uid: 1000), ResolvedIdentity(identity: "Alice@Contoso.com", source: .process(100)))

        try engine.bindProcess(200, to: "Bob@Personal.example")
        XCTAssertEqual(engine.resolve(thread: 201, uid: 0), ResolvedIdentity(identity: "Bob@Personal.example", source: .process(200)),
                       "the nearest binding wins; an unregistered identity is unmanaged")
        try engine.bindThread(201, to: "alice-id")
        XCTAssertEqual(engine.resolve(thread: 201, uid: 0), ResolvedIdentity(identity: "Alice@Contoso.com", source: .thread(201)))
        XCTAssertEqual(engine.resolve(thread: 200, uid: 0), ResolvedIdentity(identity: "Bob@Personal.example", source: .process(200)),
                       "a thread binding is the thread's alone")
        try engine.unbindThread(201)
        try engine.unbindProcess(200)
        XCTAssertEqual(engine.resolve(thread: 201, uid: 0).source, .ancestor(100))
        XCTAssertThrowsError(try engine.bindProcess(4242, to: "alice")) { XCTAssertEqual($0 as? EngineError, .noSuchProcess(4242)) }
        XCTAssertThrowsError(try engine.bindProcess(100, to: "  ")) { XCTAssertEqual(($0 as? EngineError)?.code, 207) }

        // MultiIdentity off: the primary managed account is the fallback.
        let single = try Engine(stateDirectory: directory + "/single", settings: testSettings(multiIdentity: false), clock: ManualClock(), processes: table)
        XCTAssertEqual(single.resolve(thread: 200, uid: 0).source, .none, "no managed account yet")
        try single.enroll(id: "carol-id", upn: "carol@contoso.com")
        XCTAssertEqual(single.resolve(thread: 200, uid: 0), ResolvedIdentity(identity: "carol@contoso.com", source: .primaryAccount))
    }

    func testAUsersProcessesActAsTheAccountItOwns() throws {
        let table = FakeProcessTable()
        table.add(1, start: 1)
        table.add(50, parent: 1, start: 5)
        var settings = testSettings(multiIdentity: true)
        settings.defaultIdentities = [1002: "configured@example.org"]
        let engine = try makeEngine(settings, processes: table)
        try engine.register(id: "reg-id", upn: "registered@contoso.com", uid: 1001)
        XCTAssertEqual(engine.resolve(thread: 50, uid: 1001).source, .none, "a registered (unmanaged) account is not acted as")
        try engine.enroll(id: "pat-id", upn: "pat@contoso.com", uid: 1001)
        try engine.enroll(id: "quinn-id", upn: "quinn@contoso.com", uid: 1002)
        XCTAssertEqual(engine.resolve(thread: 50, uid: 1001), ResolvedIdentity(identity: "pat@contoso.com", source: .uidAccount(1001)))
        XCTAssertEqual(engine.resolve(thread: 50, uid: 1002).source, .uidDefault(1002), "a configured default comes first")
        XCTAssertEqual(engine.resolve(thread: 50, uid: 1003).source, .none)
        try engine.bindProcess(50, to: "me@gmail.com")
        XCTAssertEqual(engine.resolve(thread: 50, uid: 1001).identity, "me@gmail.com", "a binding comes first")
    }

    func testAReusedPIDDoesNotInheritTheBinding() throws {
        let table = FakeProcessTable()
        table.add(1, start: 1)
        table.add(300, parent: 1, start: 1000)
        let engine = try makeEngine(processes: table)
        try engine.bindProcess(300, to: "alice@contoso.com")
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0).identity, "alice@contoso.com")
        // Process 300 exits; an unrelated process gets PID 300 later.
        table.remove(300)
        table.add(300, parent: 1, start: 5000)
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0), ResolvedIdentity(identity: nil, source: .none))
        // Nor do its children.
        table.add(301, parent: 300, start: 5001)
        XCTAssertEqual(engine.resolve(thread: 301, uid: 0).source, .none)
        // And after a restart the stale binding is dropped.
        let reloaded = try makeEngine(processes: table)
        XCTAssertEqual(reloaded.resolve(thread: 300, uid: 0).source, .none)
    }

    /// bindings.json holds only bindings of live tasks: exited ones leave it (pruning, any bind,
    /// a restart), and a wipe takes every binding to the wiped identity with it.
    func testBindingsOfExitedProcessesAndWipedIdentitiesLeaveTheStateDirectory() throws {
        let table = FakeProcessTable()
        for pid: Int32 in [1, 400, 401, 402, 403] { table.add(pid, parent: pid == 1 ? nil : 1, start: UInt64(pid) * 10) }
        let engine = try makeEngine(processes: table)
        _ = try engine.register(id: "alice-oid", upn: "alice@contoso.com")
        try engine.bindProcess(400, to: "alice@contoso.com")
        try engine.bindThread(401, to: "ALICE@contoso.com")
        try engine.bindProcess(402, to: "me@gmail.com")
        try engine.bindProcess(403, to: "me@gmail.com")
        func bindings() throws -> Engine.Bindings { try XCTUnwrap(try engine.files.read(Engine.Bindings.self, from: "bindings.json")) }
        func stored() throws -> String { String(decoding: try JSONEncoder().encode(try bindings()), as: UTF8.self) }
        XCTAssertTrue(try stored().contains("alice@contoso.com"))
        XCTAssertFalse(try String(contentsOfFile: directory + "/bindings.json", encoding: .utf8).contains("alice"), "sealed on disk")
        // 402 exits: the periodic prune drops it from the file.
        table.remove(402)
        XCTAssertTrue(engine.pruneExitedBindings())
        XCTAssertFalse(engine.pruneExitedBindings(), "nothing more to drop")
        let afterPrune = try stored()
        XCTAssertFalse(afterPrune.contains("402"), afterPrune)
        XCTAssertEqual(engine.resolve(thread: 403, uid: 0).identity, "me@gmail.com")
        // 403 exits; the next bind drops it too.
        table.remove(403)
        table.add(404, parent: 1, start: 4040)
        try engine.bindProcess(404, to: "me@gmail.com")
        XCTAssertEqual(try bindings().processes.map(\.task.id).sorted(), [400, 404])
        // The wipe takes the process and the thread binding of alice (any spelling) with it.
        try engine.deregister("alice@contoso.com", wipe: true)
        let afterWipe = try stored()
        XCTAssertFalse(afterWipe.lowercased().contains("alice"), afterWipe)
        XCTAssertEqual(engine.resolve(thread: 404, uid: 0).identity, "me@gmail.com")
        // A restart after processes exited rewrites the file without them.
        table.remove(404)
        _ = try makeEngine(processes: table)
        let afterRestart = try stored()
        XCTAssertFalse(afterRestart.contains("me@gmail.com"), afterRestart)
    }

    func testDirectoryOwnerAppliesOnlyToCallersWithoutIdentity() throws {
        let engine = try makeEngine()
        let nobody = ResolvedIdentity(identity: nil, source: .none)
        let bob = ResolvedIdentity(identity: "bob@x", source: .process(5))
        XCTAssertEqual(engine.ownerForNewFile(nobody, directoryOwner: "alice@contoso.com"), "alice@contoso.com")
        XCTAssertEqual(engine.ownerForNewFile(bob, directoryOwner: "alice@contoso.com"), "bob@x")
        XCTAssertNil(engine.ownerForNewFile(nobody, directoryOwner: nil))
    }

    /// The real /proc: a shell bound to an identity, and its child `sleep` inheriting it.
    func testRealProcessesInheritThroughProc() throws {
        let engine = try makeEngine(processes: LinuxProcessTable())
        let shell = Process()
        shell.executableURL = URL(fileURLWithPath: "/bin/sh")
        shell.arguments = ["-c", "sleep 30 & wait"]
        try shell.run()
        defer { shell.terminate(); shell.waitUntilExit() }
        let table = LinuxProcessTable()
        var child: Int32?
        for _ in 0..<200 {
            let text = readTextFile("/proc/\(shell.processIdentifier)/task/\(shell.processIdentifier)/children") ?? ""
            if let pid = text.split(separator: " ").first.flatMap({ Int32($0) }) { child = pid; break }
            usleep(10_000)
        }
        let sleeper = try XCTUnwrap(child)
        defer { kill(sleeper, SIGKILL) }
        XCTAssertEqual(table.parent(of: sleeper), shell.processIdentifier)
        XCTAssertEqual(table.process(ofThread: sleeper), sleeper)
        XCTAssertNotNil(table.startTime(of: sleeper))
        try engine.bindProcess(shell.processIdentifier, to: "alice@contoso.com")
        XCTAssertEqual(engine.resolve(thread: sleeper, uid: 0), ResolvedIdentity(identity: "alice@contoso.com", source: .ancestor(shell.processIdentifier)))
        // This test's own thread is not a descendant of the shell.
        XCTAssertEqual(engine.resolve(thread: Linux.currentThreadID(), uid: 0).source, .none)
        try engine.bindThread(Linux.currentThreadID(), to: "bob@x")
        XCTAssertEqual(engine.resolve(thread: Linux.currentThreadID(), uid: 0).source, .thread(Linux.currentThreadID()))
    }
}

/// Remembered answers (`ResolutionCache`): used again only while nothing they rest on changed.
final class ResolutionCacheTests: EngineTestCase {
    func testAnswersAreRememberedUntilABindingOrATaskChanges() throws {
        let table = FakeProcessTable()
        // init(1) ← run(100, bound) ← sh(200) ← tar(300)
        table.add(1, start: 1)
        table.add(100, parent: 1, start: 10)
        table.add(200, parent: 100, start: 20)
        table.add(300, parent: 200, start: 30)
        let engine = try makeEngine(testSettings(multiIdentity: true), processes: table)
        try engine.bindProcess(100, to: "alice@contoso.com")
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0).source, .ancestor(100))
        let walked = table.parentLookups.withLock { $0 }
        for _ in 0..<100 { XCTAssertEqual(engine.resolve(thread: 300, uid: 0).source, .ancestor(100)) }
        XCTAssertEqual(table.parentLookups.withLock { $0 }, walked, "asking again does not walk the tree again")

        // Another uid is another answer (a setuid program keeps its thread ID).
        engine.updateSettings({ var s = testSettings(multiIdentity: true); s.defaultIdentities = [1000: "me@gmail.com"]; return s }())
        XCTAssertEqual(engine.resolve(thread: 1, uid: 1000).identity, "me@gmail.com", "settings changes are seen at once")

        // A process between the thread and the bound one exits: tar is an orphan now.
        table.remove(200)
        table.add(300, parent: 1, start: 30)
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0).source, .none, "the chain the answer rested on changed")
        // A new binding is seen at once.
        try engine.bindProcess(300, to: "bob@x")
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0), ResolvedIdentity(identity: "bob@x", source: .process(300)))
        try engine.unbindProcess(300)
        XCTAssertEqual(engine.resolve(thread: 300, uid: 0).source, .none)
    }

    func testThroughProcTheDescriptorOfAnExitedTaskFails() throws {
        let table = LinuxProcessTable()
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sleep")
        child.arguments = ["30"]
        try child.run()
        let probe = try XCTUnwrap(table.probe(child.processIdentifier))
        XCTAssertTrue(probe.isSameTask)
        child.terminate()
        child.waitUntilExit()
        XCTAssertFalse(probe.isSameTask, "the held descriptor names the task that exited")
        XCTAssertNil(table.probe(child.processIdentifier))
    }

    func testTheCacheStaysBounded() throws {
        let table = FakeProcessTable()
        table.add(1, start: 1)
        for tid in Int32(2)..<Int32(1500) { table.add(tid, parent: 1, start: UInt64(tid)) }
        let engine = try makeEngine(testSettings(multiIdentity: true), processes: table)
        try engine.bindProcess(1, to: "alice@contoso.com")
        for tid in Int32(2)..<Int32(1500) { XCTAssertEqual(engine.resolve(thread: tid, uid: 0).identity, "alice@contoso.com") }
        XCTAssertLessThanOrEqual(engine.resolutions.count, engine.resolutions.capacity)
        for tid in Int32(2)..<Int32(1500) { table.remove(tid) }
        engine.pruneExitedBindings()
        XCTAssertEqual(engine.resolutions.count, 0, "exited threads are forgotten")
    }
}

final class PersistenceTests: EngineTestCase {
    func testRestartReloadsEverything() throws {
        let table = FakeProcessTable()
        table.add(1, start: 1)
        table.add(700, parent: 1, start: 70)
        let clock = ManualClock()
        do {
            let engine = try makeEngine(testSettings(grace: 0), clock: clock, processes: table)
            try engine.register(id: "bob-id", upn: "bob@personal.example", uid: 1000)
            try engine.enroll(id: "alice-id", upn: "Alice@Contoso.com", policy: Policy(protectionLevel: .untilFirstAuthentication), passphrase: try passphrase("pw"), uid: 1001)
            try engine.enroll(id: "dave-id", upn: "dave@contoso.com")
            try engine.bindProcess(700, to: "alice@contoso.com")
            try engine.setPolicy("alice-id", Policy(protectionLevel: .complete))
        }
        let engine = try makeEngine(testSettings(grace: 0), clock: clock, processes: table)
        XCTAssertEqual(engine.accounts().map(\.upn).sorted(), ["Alice@Contoso.com", "bob@personal.example", "dave@contoso.com"])
        let alice = try engine.account("alice@contoso.com")
        XCTAssertEqual(alice.policy?.protectionLevel, .complete)
        XCTAssertEqual(alice.uid, 1001)
        XCTAssertTrue(alice.hasPassphrase)
        XCTAssertTrue(alice.reprotectPending)
        XCTAssertEqual(engine.resolve(thread: 700, uid: 0).identity, "Alice@Contoso.com", "bindings survive a restart")
        XCTAssertEqual(try engine.lockStatus("alice-id"), .locked, "an identity with a passphrase starts locked")
        XCTAssertFalse(try engine.hasBeenUnlocked("alice-id"), "class C waits for the first unlock after a restart")
        XCTAssertThrowsError(try engine.classKey(for: "alice-id", .untilFirstAuthentication, purpose: .open))
        XCTAssertNotNil(try engine.classKey(for: "alice-id", .none, purpose: .open), "class D needs no unlock")
        XCTAssertEqual(try engine.lockStatus("dave-id"), .unlocked, "an identity without a passphrase starts unlocked")
        try engine.unlock("alice-id", passphrase: try passphrase("pw"))
        XCTAssertTrue(try engine.hasBeenUnlocked("alice-id"))
    }

    func testBadStateFilesGiveErrorsNamingTheFile() throws {
        _ = try makeEngine()
        try Data("{ not json".utf8).write(to: URL(fileURLWithPath: directory + "/accounts.json"))
        XCTAssertThrowsError(try makeEngine()) {
            guard case .corruptState(let file, _) = $0 as? EngineError else { return XCTFail("\($0)") }
            XCTAssertEqual(file, self.directory + "/accounts.json")
        }
        try Data(#"{"version": 1, "accounts": [{"id": "a", "upn": "a@x", "registeredAt": 0, "policy": {"protectionLevel": "bogus"}}]}"#.utf8)
            .write(to: URL(fileURLWithPath: directory + "/accounts.json"))
        XCTAssertThrowsError(try makeEngine()) { XCTAssertTrue("\($0)".contains("bogus"), "\($0)") }
        try FileManager.default.removeItem(atPath: directory + "/accounts.json")

        let engine = try makeEngine()
        try engine.enroll(id: "alice", upn: "alice@contoso.com")
        let name = engine.files.keybagName("alice"), keybag = directory + "/" + name
        var stored = try XCTUnwrap(try engine.files.read(StoredKeybag.self, from: name))
        // Swap two class keys' wraps: each is bound to its slot, so neither unwraps.
        let a = stored.classes["A"]!, c = stored.classes["C"]!
        stored.classes["A"]?.wrapped = c.wrapped
        stored.classes["C"]?.wrapped = a.wrapped
        try engine.files.write(stored, to: name)
        // One identity's keybag: that identity is unavailable, with the file named (StateFileTests).
        XCTAssertThrowsError(try makeEngine().classKey(for: "alice", .none, purpose: .open)) {
            guard case .keysUnavailable(let reason) = $0 as? EngineError else { return XCTFail("\($0)") }
            XCTAssertTrue(reason.contains(keybag), reason)
        }
        try FileManager.default.removeItem(atPath: keybag)
        XCTAssertThrowsError(try makeEngine().classKey(for: "alice", .none, purpose: .open)) { XCTAssertTrue("\($0)".contains("is missing"), "\($0)") }
    }

    func testMachineKeyIsPrivateAndChecked() throws {
        _ = try makeEngine()
        let keys = try FileManager.default.contentsOfDirectory(atPath: directory + "/machine-keys")
        XCTAssertEqual(keys.count, 1)
        let path = directory + "/machine-keys/" + keys[0]
        XCTAssertTrue(path.hasSuffix(".key"), "a file store without a TPM: \(path)")
        XCTAssertEqual(try Syscall.lstat(path).st_mode & 0o777, 0o600)
        XCTAssertEqual(try Syscall.lstat(path).st_size, 32)
        chmod(path, 0o644)
        XCTAssertThrowsError(try makeEngine()) { XCTAssertTrue("\($0)".contains("0600"), "\($0)") }
        chmod(path, 0o600)
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o600)
        XCTAssertThrowsError(try makeEngine()) { XCTAssertTrue("\($0)".contains("32"), "\($0)") }
    }

    /// What a daemon killed in the middle of a write leaves: a complete old file and a partial
    /// temporary. The next start reads the old file and removes the temporary.
    func testAKilledWriteLeavesTheOldStateReadable() throws {
        do {
            let engine = try makeEngine()
            try engine.enroll(id: "alice", upn: "alice@contoso.com")
        }
        try Data(#"{"version": 1, "accou"#.utf8).write(to: URL(fileURLWithPath: directory + "/accounts.json.tmp-99-1234"))
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: directory + "/keybags/x.json.tmp-99-5"))
        let engine = try makeEngine()
        XCTAssertEqual(engine.accounts().map(\.upn), ["alice@contoso.com"])
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory + "/accounts.json.tmp-99-1234"))
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory + "/keybags/x.json.tmp-99-5"))
    }

    func testNoTemporaryFilesAreLeftBehind() throws {
        let engine = try makeEngine()
        for index in 0..<20 { try engine.register(id: "id\(index)", upn: "user\(index)@x") }
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.contains(".tmp-") }
        XCTAssertEqual(leftovers, [])
        XCTAssertEqual(try Syscall.lstat(directory + "/accounts.json").st_mode & 0o777, 0o600)
    }
}
