import CustodySystem
import CustodyTestSupport
import Foundation
import Glibc
import XCTest

/// The guard: a process that read a managed identity's file saves only where the identity's
/// policy allows, whatever started it. The guard watches only file systems this test makes: a
/// tmpfs standing for the home directory (with a synced OneDrive folder in it) and an ext4 loop
/// mount standing for a USB stick.
final class GuardTests: XCTestCase {
    var daemon: MountedDaemon?
    var work = ""
    var home: String { work + "/home" }
    /// A tmpfs standing for /media; the USB stick is mounted below it.
    var media: String { work + "/media" }
    var usb: String { media + "/usb" }
    var oneDrive: String { home + "/OneDrive - Contoso" }
    var uid: UInt32 = 0
    var loopImage: String { work + "/usb.img" }

    override func tearDown() {
        if let daemon, daemon.pid > 0 { kill(daemon.pid, SIGTERM) }
        daemon?.destroy()
        daemon = nil
        for mountPoint in [home, media + "/later", usb, media] where !work.isEmpty && MountTable.entry(at: mountPoint) != nil {
            _ = try? runCommand(["umount", "-l", mountPoint])
        }
        if !work.isEmpty { _ = try? runCommand(["rm", "-rf", work]) }
    }

    /// dana's account, whose data may be saved to the mounts and OneDrive only; the daemon's guard
    /// watches the home tmpfs and the USB stick.
    func start(saveTo: [String]? = ["AccountDocument", "OneDriveForBusiness"], openFrom: [String]? = nil) throws {
        work = try makeTemporaryDirectory("custody-guard")
        XCTAssertEqual(chmod(work, 0o755), 0)
        for directory in [home, media] { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        try mustRun(["mount", "-t", "tmpfs", "-o", "size=64m,mode=1777", "custody-guard-home", home])
        try mustRun(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "custody-guard-media", media])
        try FileManager.default.createDirectory(atPath: usb, withIntermediateDirectories: true)
        try mustRun(["truncate", "-s", "32M", loopImage])
        try mustRun(["mkfs.ext4", "-q", "-F", loopImage])
        try mustRun(["mount", "-o", "loop", loopImage, usb])
        try mustRun(["chmod", "1777", usb])
        try FileManager.default.createDirectory(atPath: oneDrive, withIntermediateDirectories: true)
        try mustRun(["chmod", "1777", oneDrive])
        uid = try testUser()
        let config = work + "/custody.toml"
        try """
            [settings]
            MultiIdentity = true
            LockGracePeriod = 1
            [locations]
            OneDriveForBusiness = ["\(oneDrive)"]
            """.write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = try MountedDaemon(extraArguments: ["--config", config, "--allow-other", "--socket-mode", "0666",
                                                        "--guard-file-systems", home, "--guard-file-systems", media])
        self.daemon = daemon
        try daemon.openToOtherUsers()
        try mustRun(["chmod", "1777", daemon.mountPoint])
        func list(_ names: [String]?) -> String { names.map { "[" + $0.map { "\"\($0)\"" }.joined(separator: ", ") + "]" } ?? "null" }
        let enrolled = try daemon.api("POST", "/v1/accounts", #"{"id": "d-oid", "upn": "dana@contoso.com", "uid": \#(uid), "policy": {"protectionLevel": "untilFirstAuth", "saveToLocations": \#(list(saveTo)), "openFromLocations": \#(list(openFrom))}}"#)
        XCTAssertEqual(enrolled.status, 201, enrolled.body)
        // The guard starts once the mounts serve: a test reads only after it runs.
        try eventually("the guard runs") { (try? daemon.apiJSON("GET", "/v1/status").json).flatMap { field($0, "guard.level") } == "fanotify" }
        let shown = try daemon.ctl(["status"]).output
        XCTAssertTrue(shown.contains("guard: on (fanotify) for 3 file systems; 0 processes hold managed data; 0 refused"), shown)
    }

    /// Runs `script` as the test user (whose processes act as dana's account).
    func asUser(_ script: String) throws -> CommandResult {
        try runCommand(["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "sh", "-c", script])
    }

    func contents(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }

    func testEveryWayOfCopyingOutIsRefusedAndInsideIsAllowed() throws {
        try start()
        guard let daemon else { return }
        let m = daemon.mountPoint
        let script = """
            set -u
            cd '\(m)'
            echo CORPSECRET > plan.txt && echo wrote
            echo CORPSECRET > plan2.txt
            cp plan.txt '\(home)/copy.txt' 2>/dev/null || echo cp-refused
            cat plan.txt > '\(home)/redirect.txt' 2>/dev/null || echo redirect-refused
            tee '\(home)/tee.txt' < plan.txt >/dev/null 2>&1 || echo tee-refused
            dd if=plan.txt of='\(home)/dd.txt' status=none 2>/dev/null || echo dd-refused
            mv plan2.txt '\(home)/' 2>/dev/null || echo mv-refused
            tar cf '\(home)/a.tar' plan.txt 2>/dev/null || echo tar-refused
            cp plan.txt /dev/null && echo devnull-ok
            cp plan.txt '\(usb)/stick.txt' 2>/dev/null || echo usb-refused
            /usr/bin/python3 - <<'PY' 2>/dev/null || echo python-refused
            data = open('plan.txt').read()
            open('\(home)/py.txt', 'w').write(data)
            PY
            /usr/bin/python3 - <<'PY' 2>/dev/null || echo copy-range-refused
            import os
            src = os.open('plan.txt', os.O_RDONLY)
            dst = os.open('\(usb)/cfr.txt', os.O_WRONLY | os.O_CREAT, 0o600)
            os.copy_file_range(src, dst, 100)
            PY
            /usr/bin/python3 - <<'PY' 2>/dev/null || echo atomic-save-refused
            import os
            data = open('plan.txt').read()
            with open('\(home)/.report.txt.tmp', 'w') as f:
                f.write(data)
            os.rename('\(home)/.report.txt.tmp', '\(home)/report.txt')
            PY
            read line < plan.txt; echo "$line" > '\(home)/shell.txt' 2>/dev/null || echo shell-refused
            '\(home)/tool' && echo exec-ok
            cp plan.txt '\(oneDrive)/synced.txt' && echo onedrive-ok
            cp plan.txt copy-in-mount.txt && echo mount-ok
            rsync plan.txt '\(home)/rsync.txt' 2>/dev/null || echo rsync-refused
            """
        // A program on the watched disk, where the data may not go: a holder still runs it.
        try mustRun(["cp", "/bin/true", home + "/tool"])
        let result = try asUser(script)
        for marker in ["wrote", "cp-refused", "redirect-refused", "tee-refused", "dd-refused", "mv-refused", "tar-refused", "devnull-ok",
                       "usb-refused", "python-refused", "copy-range-refused", "atomic-save-refused", "shell-refused", "onedrive-ok", "mount-ok", "rsync-refused", "exec-ok"] {
            XCTAssertTrue(result.output.contains(marker), "\(marker) missing: \(result.output) \(result.error)\n\(daemon.log)")
        }
        // No file the refused opens would have made is left, and no byte of the data landed.
        for name in ["copy.txt", "tee.txt", "dd.txt", "plan2.txt", "report.txt", ".report.txt.tmp", "py.txt", "rsync.txt"] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: home + "/" + name), "\(name) was left in the home directory")
        }
        for name in ["stick.txt", "cfr.txt"] {
            XCTAssertFalse(FileManager.default.fileExists(atPath: usb + "/" + name), "\(name) was left on the stick")
        }
        // The shell opened these before any process held the data: they exist, empty.
        for name in ["redirect.txt", "a.tar", "shell.txt"] where FileManager.default.fileExists(atPath: home + "/" + name) {
            XCTAssertFalse((contents(home + "/" + name) ?? "").contains("CORPSECRET"), "\(name) holds the data")
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: daemon.mnt("plan2.txt")), "mv kept its source")
        XCTAssertEqual(contents(oneDrive + "/synced.txt"), "CORPSECRET\n")
        XCTAssertEqual(try asUser("cat '\(daemon.mnt("copy-in-mount.txt"))'").output, "CORPSECRET\n")

        // A process that never read the data is not affected, on either file system.
        let plain = try asUser("echo mine > '\(home)/mine.txt' && cp /etc/hostname '\(usb)/h.txt' && echo plain-ok")
        XCTAssertTrue(plain.output.contains("plain-ok"), plain.output + plain.error)

        // Every refusal is an event with the process, the identity, the location and the path.
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains("saveBlocked"), events)
        XCTAssertTrue(events.contains("LocalDrive") && events.contains("dana@contoso.com") && events.contains("copy.txt"), events)
        XCTAssertTrue(events.contains("/usr/bin/cp") || events.contains("/bin/cp"), "the executable: \(events)")

        // Once every holder has exited, nothing is held, and the kernel asks nothing.
        try eventually("every holder has exited") { (try? daemon.apiJSON("GET", "/v1/status").json).flatMap { field($0, "guard.holders") } == "0" }
        let metrics = try daemon.api("GET", "/v1/metrics").body
        XCTAssertTrue(metrics.contains("custody_guard_level{level=\"fanotify\"} 1"), metrics)
        let refused = metrics.split(separator: "\n").first { $0.hasPrefix("custody_guard_refusals_total ") }
        XCTAssertGreaterThanOrEqual(Int(refused?.split(separator: " ").last ?? "") ?? 0, 10, "\(String(describing: refused))")
    }

    /// `cat plan.txt > out` opens `out` first: the read of the managed file is what is refused.
    func testAProcessWritingOutsideMayNotStartHolding() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let python = """
            import errno, os
            out = os.open('\(home)/out.txt', os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.open('\(daemon.mnt("plan.txt"))', os.O_RDONLY)
                print('opened')
            except OSError as e:
                print('errno', e.errno)
            os.close(out)
            fd = os.open('\(daemon.mnt("plan.txt"))', os.O_RDONLY)
            print('after-close', len(os.read(fd, 100)))
            try:
                os.open('\(home)/later.txt', os.O_WRONLY | os.O_CREAT, 0o600)
                print('created')
            except OSError as e:
                print('create errno', e.errno)
            """
        let result = try runCommand(["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", python])
        XCTAssertTrue(result.output.contains("errno 13"), result.output + result.error)
        XCTAssertTrue(result.output.contains("after-close 11"), "with the file closed it reads: \(result.output)")
        // fanotify answers a refused open with EPERM.
        XCTAssertTrue(result.output.contains("create errno 1"), result.output + result.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: home + "/later.txt"))
    }

    /// Children started after the read hold the data; those started before do not; a policy
    /// that allows LocalDrive lets the holders save there.
    func testChildrenAndPolicyChanges() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let script = """
            (sleep 1; echo early > '\(home)/early.txt' && echo early-ok) &
            cat '\(daemon.mnt("plan.txt"))' > /dev/null
            sh -c "echo late > '\(home)/late.txt'" 2>/dev/null || echo late-refused
            wait
            """
        // The outer shell does not read: cat does, and the child shell after it is cat's sibling.
        let siblings = try asUser(script)
        XCTAssertTrue(siblings.output.contains("early-ok"), siblings.output + siblings.error)
        XCTAssertFalse(siblings.output.contains("late-refused"), "a sibling of the reader holds nothing: \(siblings.output)")
        let inherited = try asUser("""
            (sleep 1; echo early > '\(home)/early2.txt' && echo early-ok) &
            read x < '\(daemon.mnt("plan.txt"))'
            sh -c "echo late > '\(home)/late2.txt'" 2>/dev/null || echo late-refused
            wait
            """)
        XCTAssertTrue(inherited.output.contains("early-ok"), "started before the read: \(inherited.output)")
        XCTAssertTrue(inherited.output.contains("late-refused"), "started after the read: \(inherited.output)")
        XCTAssertFalse(FileManager.default.fileExists(atPath: home + "/late2.txt"))

        XCTAssertEqual(try daemon.ctl(["policy", "dana@contoso.com", "--save-to", "all"]).status, 0)
        try eventually("the policy now allows every location", timeout: 5, interval: 0.2) {
            (try? self.asUser("cp '\(daemon.mnt("plan.txt"))' '\(self.home)/allowed.txt'"))?.status == 0
        }
    }

    /// Open-from: data read from a location the identity may not open from does not go into its
    /// files, whichever is opened first; system files (root's) and allowed locations do.
    func testDataFromElsewhereDoesNotGoIntoTheIdentitysFiles() throws {
        try start(saveTo: nil, openFrom: ["AccountDocument", "OneDriveForBusiness"])
        guard let daemon else { return }
        let m = daemon.mountPoint
        let script = """
            set -u
            echo personal > '\(home)/personal.txt'
            echo synced > '\(oneDrive)/team.txt'
            cp '\(home)/personal.txt' '\(m)/imported.txt' 2>/dev/null || echo cp-refused
            cat '\(home)/personal.txt' > '\(m)/cat.txt' 2>/dev/null || echo cat-refused
            cp '\(usb)/../home/personal.txt' '\(m)/again.txt' 2>/dev/null || echo again-refused
            cp '\(oneDrive)/team.txt' '\(m)/team.txt' && echo onedrive-ok
            cp /etc/hostname '\(m)/host.txt' && echo system-ok
            /usr/bin/python3 - <<'PY'
            import os
            fd = os.open('\(m)/closed.txt', os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, b'mine')
            os.close(fd)
            print('after-close', open('\(home)/personal.txt').read().strip())
            PY
            """
        let result = try asUser(script)
        for marker in ["cp-refused", "cat-refused", "again-refused", "onedrive-ok", "system-ok", "after-close personal"] {
            XCTAssertTrue(result.output.contains(marker), "\(marker) missing: \(result.output) \(result.error)\n\(daemon.log)")
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: daemon.mnt("imported.txt")), "a refused create leaves nothing in the mount")
        XCTAssertEqual(try asUser("cat '\(m)/cat.txt'").output, "", "the shell made it; no byte of the personal file went in")
        XCTAssertEqual(try asUser("cat '\(m)/team.txt'").output, "synced\n")
        let events = try daemon.api("GET", "/v1/events?follow=false").body
        XCTAssertTrue(events.contains("openFromBlocked") && events.contains("personal.txt") && events.contains("LocalDrive"), events)
    }

    /// The person at the keyboard is told: `custodyctl agent`, on a private session bus with
    /// python-dbusmock's notification daemon, shows a blocked save (identity, location, program;
    /// no path), at most one a minute here, and a lock.
    func testTheAgentShowsRefusalsAndLocksAsNotifications() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let session = work + "/session"
        try FileManager.default.createDirectory(atPath: session, withIntermediateDirectories: true)
        XCTAssertEqual(chown(session, uid, uid), 0)
        let address = "unix:path=\(session)/bus"
        let calls = session + "/notifications.log"
        let asTheUser = ["setpriv", "--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "env", "DBUS_SESSION_BUS_ADDRESS=\(address)"]
        var started: [pid_t] = []
        defer {
            for pid in started.reversed() {
                kill(pid, SIGTERM)
                XCTAssertTrue(waitForExit(pid, seconds: 10), "process \(pid) did not stop")
            }
        }
        started.append(try spawn(asTheUser[0], Array(asTheUser.dropFirst()) + ["dbus-daemon", "--session", "--nofork", "--nopidfile", "--address=\(address)"],
                                 stderrPath: session + "/bus.err"))
        try eventually("the session bus is up") { FileManager.default.fileExists(atPath: session + "/bus") }
        started.append(try spawn(asTheUser[0], Array(asTheUser.dropFirst()) + ["/usr/bin/python3", "-m", "dbusmock", "--template", "notification_daemon", "-l", calls],
                                 stderrPath: session + "/mock.err"))
        try eventually("the notification daemon is on the bus") { FileManager.default.fileExists(atPath: calls) }
        started.append(try spawn(asTheUser[0], Array(asTheUser.dropFirst()) + [MountedDaemon.tool("custodyctl"), "agent", "--socket", daemon.socket, "--interval", "60"],
                                 stderrPath: session + "/agent.err"))
        // Blocked saves until the agent, once connected, shows one.
        try eventually("a notification of the blocked save", timeout: 20, interval: 0.3) {
            _ = try? self.asUser("cp '\(daemon.mnt("plan.txt"))' '\(self.home)/copy.txt'")
            return (self.contents(calls) ?? "").contains("Notify")
        }
        for _ in 0..<3 { _ = try asUser("cp '\(daemon.mnt("plan.txt"))' '\(home)/copy.txt'") }
        XCTAssertEqual(try daemon.ctl(["lock", "dana@contoso.com"]).status, 0)
        try eventually("a notification of the lock", timeout: 30, interval: 0.2) { (self.contents(calls) ?? "").contains("dana@contoso.com locked") }
        let shown = contents(calls) ?? ""
        XCTAssertTrue(shown.contains("Save blocked") && shown.contains("cp may not save dana@contoso.com's data to LocalDrive"), shown)
        XCTAssertEqual(shown.components(separatedBy: "Save blocked").count - 1, 1, "one a minute: \(shown)")
        XCTAssertFalse(shown.contains(home), "no notification names a path: \(shown)")
        XCTAssertFalse(shown.contains("copy.txt"), "no notification names a file: \(shown)")
    }

    /// A stick mounted after the daemon started is watched as soon as it appears.
    func testAFileSystemMountedLaterIsCovered() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let later = media + "/later"
        try FileManager.default.createDirectory(atPath: later, withIntermediateDirectories: true)
        try mustRun(["mount", "-t", "tmpfs", "-o", "size=8m,mode=1777", "custody-guard-later", later])
        try eventually("the new file system is watched") {
            let status = try daemon.apiJSON("GET", "/v1/status").json
            return ((status["guard"] as? [String: Any])?["fileSystems"] as? [String])?.contains(later) == true
        }
        let copied = try asUser("cp '\(daemon.mnt("plan.txt"))' '\(later)/stick.txt' 2>/dev/null || echo refused")
        XCTAssertTrue(copied.output.contains("refused"), copied.output + copied.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: later + "/stick.txt"))
        XCTAssertEqual(try runCommand(["umount", later]).status, 0)
    }

    /// A process that read managed data still holds it when the daemon comes back, and so do the
    /// processes it started meanwhile.
    func testHoldersAreKeptAcrossARestart() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let go = work + "/go", output = work + "/holder.out"
        let python = """
            import os, subprocess, time
            data = open('\(daemon.mnt("plan.txt"))').read()
            print('read', flush=True)
            while not os.path.exists('\(go)'):
                time.sleep(0.05)
            try:
                open('\(home)/after-restart.txt', 'w').write(data)
                print('wrote')
            except OSError as e:
                print('errno', e.errno)
            child = subprocess.run(['sh', '-c', "echo x > '\(home)/child.txt' 2>/dev/null || echo child-refused"], capture_output=True, text=True)
            print(child.stdout.strip(), flush=True)
            """
        let holder = try spawn("setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", python], stdoutPath: output)
        defer {
            kill(holder, SIGKILL)
            _ = waitForExit(holder, seconds: 5)
        }
        try eventually("the holder read the file") { (self.contents(output) ?? "").contains("read") }
        // A restart: the daemon stops (unmounting) and starts again on the same state.
        kill(daemon.pid, SIGTERM)
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(daemon.pid, seconds: 15, status: &status))
        XCTAssertEqual(status, 0, daemon.log)
        daemon.pid = 0
        try daemon.start(extraArguments: ["--config", work + "/custody.toml", "--allow-other", "--socket-mode", "0666",
                                          "--guard-file-systems", home, "--guard-file-systems", media])
        // The guard starts after the mount: wait for it to have taken the holder up.
        try eventually("the holder taken up again") {
            (try? daemon.apiJSON("GET", "/v1/status").json).flatMap { field($0, "guard.holders") } == "1"
        }
        XCTAssertTrue(daemon.log.contains("still holds managed data from before the restart"), daemon.log)
        XCTAssertTrue(FileManager.default.createFile(atPath: go, contents: nil))
        XCTAssertTrue(waitForExit(holder, seconds: 15))
        let printed = contents(output) ?? ""
        XCTAssertTrue(printed.contains("errno 1"), "still a holder after the restart: \(printed)")
        XCTAssertTrue(printed.contains("child-refused"), printed)
        XCTAssertFalse(FileManager.default.fileExists(atPath: home + "/after-restart.txt"))
        let saved = try String(contentsOfFile: daemon.state + "/holders.json", encoding: .utf8)
        XCTAssertTrue(saved.contains("sealedState"), "sealed: it names identities: \(saved)")
        XCTAssertFalse(saved.contains("contoso"), saved)
        var info = stat()
        XCTAssertEqual(stat(daemon.state + "/holders.json", &info), 0)
        XCTAssertEqual(info.st_mode & 0o777, 0o600)
    }

    /// A daemon killed with SIGKILL while holders write leaves every open on the machine going.
    func testOpensCarryOnWhenTheDaemonIsKilled() throws {
        try start()
        guard let daemon else { return }
        XCTAssertEqual(try asUser("echo CORPSECRET > '\(daemon.mnt("plan.txt"))'").status, 0)
        let marker = work + "/killed"
        let python = """
            import os, time
            os.open('\(daemon.mnt("plan.txt"))', os.O_RDONLY)
            refused = created = 0
            deadline = time.time() + 20
            i = 0
            while time.time() < deadline:
                i += 1
                try:
                    os.close(os.open('\(home)/n%d' % i, os.O_WRONLY | os.O_CREAT, 0o600))
                    if os.path.exists('\(marker)'):
                        created += 1
                        if created >= 20:
                            break
                except OSError:
                    refused += 1
                time.sleep(0.005)
            print('refused', refused, 'created', created)
            """
        let output = work + "/holder.out"
        let holder = try spawn("setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", python], stdoutPath: output)
        Thread.sleep(forTimeInterval: 1)
        daemon.killHard()
        XCTAssertTrue(FileManager.default.createFile(atPath: marker, contents: nil))
        var status: Int32 = 0
        XCTAssertTrue(waitForExit(holder, seconds: 25, status: &status), "the holder hung after the daemon was killed")
        let printed = contents(output) ?? ""
        XCTAssertTrue(printed.contains("created 20"), "creations after the kill: \(printed)")
        XCTAssertFalse(printed.contains("refused 0 "), "the guard refused while it ran: \(printed)")
        // A new process on the watched file systems is not held up either.
        XCTAssertEqual(try runCommand(["cp", "/etc/hostname", usb + "/after-kill"]).status, 0)
    }
}
