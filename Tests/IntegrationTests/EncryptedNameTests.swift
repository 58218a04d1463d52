import CustodySystem
import Foundation
import Glibc
import XCTest

/// Names of a managed identity's entries are stored encrypted (`EncryptedNames.swift`): the
/// backing store, walked the way a thief with the disk would, shows none of them, while the mount
/// shows every name as it was given, to every tool.
final class EncryptedNameTests: XCTestCase {
    var daemon: MountedDaemon!

    override func tearDown() {
        daemon?.destroy()
        daemon = nil
    }

    static let arguments = ["--multi-identity", "--allow-other", "--lock-grace-period", "0", "--default-identity", "0=alice@contoso.com",
                            "--default-identity", "65534=bob@personal.example"]

    /// Alice (managed) is root's identity, Bob (unmanaged) uid 65534's.
    func startMount(level: String = "untilFirstAuth", passphrase: String? = nil) throws {
        daemon = try MountedDaemon(extraArguments: Self.arguments)
        XCTAssertEqual(chmod(daemon.root, 0o755), 0)
        XCTAssertEqual(chmod(daemon.backing, 0o1777), 0)
        let secret = passphrase.map { #", "passphrase": "\#($0)""# } ?? ""
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "alice-oid", "upn": "alice@contoso.com", "policy": {"protectionLevel": "\#(level)"}\#(secret)}"#).status, 201)
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts", #"{"id": "bob-oid", "upn": "bob@personal.example", "enroll": false}"#).status, 201)
    }

    func asBob(_ script: String) throws -> CommandResult {
        try runCommand(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", "cd '\(daemon.mountPoint)' && \(script)"])
    }

    /// Every name in the backing tree (files, directories, symlinks) and every symlink's target.
    func storedNamesAndTargets() throws -> [String] {
        try mustRun(["/usr/bin/python3", "-c", """
            import os, sys
            for top, dirs, files in os.walk(sys.argv[1]):
                for name in dirs + files:
                    print(os.fsdecode(name.encode('utf-8', 'surrogateescape')) if isinstance(name, str) else name)
                    path = os.path.join(top, name)
                    if os.path.islink(path):
                        print(os.readlink(path))
            """, daemon.backing]).split(separator: "\n").map(String.init)
    }

    static let long = String(repeating: "Ω", count: 120) + "-end.txt"  // 248 bytes
    static let secrets = ["Project-Falcon", "acquisition-plan", "layoffs-2027", "board-minutes", "unicode-name", "ΩΩΩΩ", "end.txt",
                          "repository", "README", "Makefile", "not-text", "types.h", "falcon-link"]

    func testTheBackingStoreShowsNoManagedNameAndTheMountShowsEveryOne() throws {
        try startMount()
        try mustRun(["sh", "-c", """
            cd '\(daemon.mountPoint)' && mkdir -p Project-Falcon/board-minutes && chmod 1777 Project-Falcon && \
            echo plan > Project-Falcon/acquisition-plan.txt && echo cuts > 'layoffs-2027.xlsx' && \
            ln -s Project-Falcon/acquisition-plan.txt falcon-link && ln Project-Falcon/acquisition-plan.txt Project-Falcon/board-minutes/hard && \
            echo long > '\(Self.long)' && echo bytes > "$(printf 'not-text-\\377\\376')" && echo u > 'unicode-name-é' && \
            mkdir repository && cd repository && git init -q && git config user.email a@contoso.com && git config user.name A && \
            printf 'all:\\n\\ttrue\\n' > Makefile && echo hi > README && git add . && git commit -q -m first && \
            echo more >> README && git commit -q -am second && git fsck --full && cd .. && \
            tar -C /usr/include -cf - linux/types.h linux/netfilter | tar -xf - && rsync -a linux/ synced/ && echo x > synced/README
            """])
        // Bob (unmanaged) keeps plain names, also inside Alice's directory.
        let bob = try asBob("echo bob > Project-Falcon/bob-notes.txt && echo bob > bob-top.txt")
        XCTAssertEqual(bob.status, 0, bob.error)

        // The disk: Bob's names in clear, none of Alice's, no target of hers.
        let stored = try storedNamesAndTargets()
        XCTAssertTrue(stored.contains("bob-notes.txt") && stored.contains("bob-top.txt"), "\(stored)")
        for secret in Self.secrets {
            XCTAssertFalse(stored.contains { $0.contains(secret) }, "\(secret) is stored in clear: \(stored.filter { $0.contains(secret) })")
        }
        XCTAssertFalse(stored.contains { $0.contains("netfilter") || $0.contains(".git") }, "tar's and git's names")
        XCTAssertTrue(stored.filter { !$0.hasPrefix("bob-") }.allSatisfy { $0.hasPrefix("~c3") }, "\(stored.filter { !$0.hasPrefix("~c3") })")
        // Names are not in any file's body or attribute, nor in the state directory.
        for secret in ["Project-Falcon", "acquisition-plan", "layoffs-2027"] {
            XCTAssertEqual(try runCommand(["grep", "-rl", secret, daemon.backing, daemon.state]).output, "", secret)
            XCTAssertFalse(try mustRun(["getfattr", "-R", "-h", "-d", "-m", "-", "-e", "text", daemon.backing]).contains(secret), secret)
        }
        // Nor is Alice's identity anywhere on the disk: not in a header, a record or a name (Bob's
        // personal files keep naming him).
        for identity in ["alice@", "alice-oid", "contoso"] {
            XCTAssertEqual(try runCommand(["grep", "-rli", identity, daemon.backing]).output, "", identity)
            XCTAssertFalse(try mustRun(["getfattr", "-R", "-h", "-d", "-m", "-", "-e", "text", daemon.backing]).lowercased().contains(identity), identity)
            XCTAssertFalse(stored.contains { $0.lowercased().contains(identity) }, identity)
        }
        XCTAssertTrue(try mustRun(["getfattr", "-R", "-h", "-d", "-m", "-", "-e", "text", daemon.backing]).contains("bob@personal.example"))
        try assertTheStateDirectoryNamesNoIdentity()
        // The same name in two directories is stored differently.
        let readmes = try mustRun(["sh", "-c", "(ls -1 '\(daemon.back("repository"))'; ls -1 '\(daemon.back("synced"))') | sort | uniq -d"])
        XCTAssertEqual(readmes, "")

        // The mount: every name as given, to every tool.
        let names = try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && find . -path ./repository/.git -prune -o -print | LC_ALL=C sort"])
        for expected in ["./Project-Falcon/acquisition-plan.txt", "./Project-Falcon/board-minutes/hard", "./Project-Falcon/bob-notes.txt",
                         "./layoffs-2027.xlsx", "./falcon-link", "./\(Self.long)", "./unicode-name-é", "./repository/README", "./linux/types.h",
                         "./synced/netfilter", "./bob-top.txt"] {
            XCTAssertTrue(names.split(separator: "\n").contains(Substring(expected)), "\(expected) in \(names)")
        }
        XCTAssertEqual(try mustRun(["cat", daemon.mnt("falcon-link")]), "plan\n")
        XCTAssertEqual(String(decoding: try Syscall.readlinkat(AT_FDCWD, daemon.mnt("falcon-link")).prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self),
                       "Project-Falcon/acquisition-plan.txt")
        XCTAssertEqual(try Syscall.lstat(daemon.mnt("Project-Falcon/board-minutes/hard")).st_nlink, 2)
        XCTAssertEqual(try mustRun(["cat", daemon.mnt(Self.long)]), "long\n")
        XCTAssertEqual(try mustRun(["sh", "-c", "cat \"\(daemon.mountPoint)/$(printf 'not-text-\\377\\376')\""]), "bytes\n")
        XCTAssertEqual(try mustRun(["git", "-C", daemon.mnt("repository"), "log", "--oneline"]).split(separator: "\n").count, 2)
        try mustRun(["diff", "-r", "/usr/include/linux/netfilter", daemon.mnt("synced/netfilter")])
        // No new name may read as a stored one.
        XCTAssertEqual(errnoOf { try writeFile(self.daemon.mnt("~c3AAAAAA.fake"), bytes("x")) }, EINVAL)

        // A wipe: Alice's names go with her keys, then her entries; the directory holding Bob's
        // note stays, under a name nobody can read.
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/wipe").status, 200)
        let after = try storedNamesAndTargets()
        XCTAssertEqual(after.filter { !$0.hasPrefix("~c3") }.sorted(), ["bob-notes.txt", "bob-top.txt"])
        XCTAssertEqual(after.filter { $0.hasPrefix("~c3") }.count, 1, "\(after)")
        let left = try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && find . | LC_ALL=C sort"]).split(separator: "\n")
        XCTAssertEqual(left.count, 4, "\(left)")
        XCTAssertTrue(left.contains("./bob-top.txt") && left.contains { $0.hasPrefix("./~c3") && $0.hasSuffix("/bob-notes.txt") }, "\(left)")
        try assertTheStateDirectoryNamesNoIdentity()
    }

    /// No name or body in the state directory holds an identity (managed or not) or a plain hash
    /// of one (which a guess could be tested against): what names them is sealed (`StateSeal`).
    func assertTheStateDirectoryNamesNoIdentity() throws {
        let names = try mustRun(["find", daemon.state]).lowercased()
        // (Strings long enough that a sealed file's base64 cannot hold one by chance.)
        for identity in ["alice@", "alice-oid", "contoso", "bob@personal", "bob-oid", "personal.example"] {
            XCTAssertEqual(try runCommand(["grep", "-rli", identity, daemon.state]).output, "", identity)
            XCTAssertFalse(names.contains(identity), "\(identity) in \(names)")
        }
        for id in ["alice-oid", "bob-oid"] {
            let hash = try mustRun(["sh", "-c", "printf %s \(id) | sha256sum | cut -c1-32"]).trimmingCharacters(in: .whitespacesAndNewlines)
            XCTAssertFalse(names.contains(hash), "a plain hash of \(id)")
        }
        XCTAssertTrue(try mustRun(["cat", daemon.state + "/accounts.json"]).contains("sealedState"))
    }

    /// Every POSIX name operation on encrypted names, as Alice, and across the two kinds of name.
    func testNameOperationsOnEncryptedNames() throws {
        try startMount()
        let script = #"""
            import ctypes, errno, os, stat, sys
            libc = ctypes.CDLL(None, use_errno=True)
            def renameat2(a, b, flags):
                if libc.syscall(316, -100, a.encode(), -100, b.encode(), flags) != 0:
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            def fails(code, call, *args):
                try:
                    call(*args)
                except OSError as e:
                    assert e.errno == code, (call, args, e)
                    return
                raise AssertionError(("no error", call, args))
            os.chdir(sys.argv[1])
            os.mkdir('dir'); open('dir/a', 'w').write('A'); open('b', 'w').write('B')
            os.mkfifo('fifo'); os.symlink('dir/a', 'link'); os.link('b', 'dir/b-link')
            assert os.stat('b').st_nlink == 2 and open('dir/b-link').read() == 'B'
            assert stat.S_ISFIFO(os.lstat('fifo').st_mode) and os.readlink('link') == 'dir/a' and open('link').read() == 'A'
            fails(errno.EEXIST, os.mkdir, 'dir'); fails(errno.EEXIST, os.open, 'b', os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            fails(errno.ENOENT, os.stat, 'missing'); fails(errno.ENOTEMPTY, os.rmdir, 'dir')
            # rename: over an existing name, no-replace, exchange (a file and a directory), into another directory
            open('c', 'w').write('C'); os.rename('c', 'b2'); assert open('b2').read() == 'C' and not os.path.exists('c')
            os.rename('b2', 'b'); assert open('b').read() == 'C' and open('dir/b-link').read() == 'B'
            fails(errno.EEXIST, renameat2, 'b', 'dir/a', 1)
            renameat2('b', 'dir', 2); assert open('dir').read() == 'C' and open('b/a').read() == 'A'
            os.rename('b/a', 'moved'); assert open('moved').read() == 'A' and os.listdir('b') == ['b-link']
            os.rename('b', 'renamed-dir'); assert open('renamed-dir/b-link').read() == 'B'
            # 255 bytes, and bytes that are not UTF-8
            long = 'x' * 251 + '.txt'; open(long, 'w').write('L'); assert open(long).read() == 'L' and long in os.listdir('.')
            fails(errno.ENAMETOOLONG, open, 'y' * 256, 'w')
            raw = b'caf\xe9-\xff'; open(raw, 'wb').write(b'R'); assert raw in os.listdir(b'.'); os.rename(raw, raw + b'2')
            assert open(raw + b'2', 'rb').read() == b'R'
            # a listing read in pieces, with seek
            os.mkdir('many')
            for i in range(1500): open('many/entry-%04d-%s' % (i, 'n' * 60), 'w').close()
            d = libc.opendir(b'many'); libc.readdir.restype = ctypes.c_void_p; libc.telldir.restype = ctypes.c_long
            seen = 0; mark = None
            while libc.readdir(d):
                seen += 1
                if seen == 700: mark = libc.telldir(d)
            libc.seekdir(d, ctypes.c_long(mark)); again = 0
            while libc.readdir(d): again += 1
            libc.closedir(d)
            assert seen == 1502 and again == 802, (seen, again)
            assert sorted(os.listdir('many')) == sorted('entry-%04d-%s' % (i, 'n' * 60) for i in range(1500))
            for name in os.listdir('many'): os.unlink('many/' + name)
            os.rmdir('many'); os.unlink('fifo'); os.unlink('link'); os.rmdir('dir') if os.path.isdir('dir') else os.unlink('dir')
            print('ok')
            """#
        XCTAssertEqual(try mustRun(["/usr/bin/python3", "-c", script, daemon.mountPoint]), "ok\n")
        XCTAssertTrue(try FileManager.default.contentsOfDirectory(atPath: daemon.backing).allSatisfy { $0.hasPrefix("~c3") })

        // Across kinds: Bob's plain name and Alice's encrypted one are one name in the mount.
        XCTAssertEqual(try asBob("echo bob > shared.txt && echo bob > bob-only.txt").status, 0)
        let clobber = try asBob("set -C; echo again > moved")
        XCTAssertNotEqual(clobber.status, 0, "Alice's name exists for Bob too")
        XCTAssertTrue(clobber.error.contains("exists"), clobber.error)
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && echo alice > mine.txt && mv mine.txt shared.txt"])
        let listing = try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint)
        XCTAssertEqual(listing.filter { $0 == "shared.txt" }.count, 1, "\(listing)")
        XCTAssertEqual(try mustRun(["cat", daemon.mnt("shared.txt")]), "alice\n")
        XCTAssertFalse(try FileManager.default.contentsOfDirectory(atPath: daemon.backing).contains("shared.txt"), "the plain form went")
        // Bob's renamed file stays plain.
        XCTAssertEqual(try asBob("mv bob-only.txt bob-renamed.txt && cat bob-renamed.txt").output, "bob\n")
        XCTAssertTrue(try FileManager.default.contentsOfDirectory(atPath: daemon.backing).contains("bob-renamed.txt"))

        // A directory Alice makes has its tweak from the start, empty; Bob's has none.
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && mkdir alice-dir && chmod 1777 alice-dir"])
        XCTAssertEqual(try asBob("mkdir bob-dir").status, 0)
        let tweaks = try mustRun(["/usr/bin/python3", "-c", """
            import os, sys
            for name in sorted(os.listdir(sys.argv[1])):
                path = os.path.join(sys.argv[1], name)
                if os.path.isdir(path) and not os.listdir(path):
                    has = 'trusted.custody.dirid' in os.listxattr(path, follow_symlinks=False)
                    print(('alice' if name.startswith('~c3') else name), has)
            """, daemon.backing])
        XCTAssertEqual(tweaks, "bob-dir False\nalice True\n")
        // A directory of both: names found in either form after a listing showed Alice's, also
        // once the kernel has forgotten them (each a fresh lookup).
        XCTAssertEqual(try asBob("echo bob > alice-dir/bob.txt").status, 0)
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && echo alice > alice-dir/alice.txt && ls alice-dir > /dev/null"])
        try mustRun(["sh", "-c", "sync; echo 2 > /proc/sys/vm/drop_caches"])
        XCTAssertEqual(try asBob("cat alice-dir/bob.txt && mv alice-dir/bob.txt alice-dir/bob-moved.txt && cat alice-dir/bob-moved.txt").output, "bob\nbob\n")
        XCTAssertEqual(try mustRun(["cat", daemon.mnt("alice-dir/alice.txt")]), "alice\n")
        XCTAssertEqual(try mustRun(["ls", daemon.mnt("alice-dir")]), "alice.txt\nbob-moved.txt\n")
        let mixed = try FileManager.default.contentsOfDirectory(atPath: daemon.backing).first { name in
            name.hasPrefix("~c3") && ((try? FileManager.default.contentsOfDirectory(atPath: daemon.backing + "/" + name))?.contains("bob-moved.txt") ?? false)
        }
        XCTAssertNotNil(mixed, "Bob's name stays plain in Alice's directory")
        XCTAssertEqual(stat(daemon.mnt("alice-dir/missing")), ENOENT)
    }

    /// A directory the mount made knows which names it may hold encrypted, and looks for any other
    /// name in plain only: every way a name gets into one is found by a fresh lookup (the
    /// directory's node kept, its children's forgotten), also after names changed form.
    /// `--plain-names` (`encrypt_names = false`): a managed identity's new names are stored as
    /// given (its content stays encrypted); names stored encrypted before stay readable through the
    /// mount, and a daemon that encrypts names again finds the plain ones.
    func testPlainNamesStoreNewNamesAsGivenAndEncryptedOnesStayReadable() throws {
        try startMount()
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && mkdir sealed-dir && echo one > sealed-dir/sealed.txt"])
        daemon.stop()
        try daemon.start(extraArguments: Self.arguments + ["--plain-names"])
        try mustRun(["sh", "-c", """
            cd '\(daemon.mountPoint)' && mkdir open-dir && echo two > open-dir/open.txt && echo three > sealed-dir/added.txt && \
            ln -s open-dir/open.txt open-link
            """])
        let stored = try storedNamesAndTargets()
        for name in ["open-dir", "open.txt", "added.txt", "open-link", "open-dir/open.txt"] {
            XCTAssertTrue(stored.contains(name), "\(name) is not stored as given: \(stored)")
        }
        XCTAssertFalse(stored.contains { $0.contains("sealed") }, "\(stored)")
        let body = try Data(contentsOf: URL(fileURLWithPath: daemon.backing + "/open-dir/open.txt"))
        XCTAssertNotEqual(body, Data("two\n".utf8), "the content is still encrypted")
        XCTAssertEqual(try String(contentsOfFile: daemon.mnt("sealed-dir/sealed.txt"), encoding: .utf8), "one\n")
        XCTAssertEqual(Set(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("sealed-dir"))), ["sealed.txt", "added.txt"])
        daemon.stop()
        try daemon.start(extraArguments: Self.arguments)
        XCTAssertEqual(Set(try FileManager.default.contentsOfDirectory(atPath: daemon.mnt("sealed-dir"))), ["sealed.txt", "added.txt"])
        XCTAssertEqual(try String(contentsOfFile: daemon.mnt("open-dir/open.txt"), encoding: .utf8), "two\n")
        XCTAssertEqual(try String(contentsOfFile: daemon.mnt("sealed-dir/added.txt"), encoding: .utf8), "three\n")
        XCTAssertEqual(try FileManager.default.destinationOfSymbolicLink(atPath: daemon.mnt("open-link")), "open-dir/open.txt")
    }

    func testADirectoryTheMountMadeFindsEveryNameItHolds() throws {
        try startMount()
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && mkdir made made2 && chmod 1777 made made2 && echo A > made/a.txt && echo X > made2/x.txt "
                     + "&& echo L > linked-from.txt && echo M > moved-from.txt && echo old > made/again.txt"])
        XCTAssertEqual(try asBob("echo bob > made/bob.txt").status, 0)
        // Processes whose working directories keep the two directories' nodes while the kernel
        // forgets their entries: each name below is then a LOOKUP the daemon answers.
        let holders = try ["made", "made2"].map { directory -> Process in
            let holder = Process()
            holder.executableURL = URL(fileURLWithPath: "/bin/sleep")
            holder.arguments = ["600"]
            holder.currentDirectoryURL = URL(fileURLWithPath: daemon.mnt(directory))
            try holder.run()
            return holder
        }
        defer { for holder in holders { holder.terminate(); holder.waitUntilExit() } }
        func freshLookups(_ expected: [(String, String)], missing: [String], file: StaticString = #filePath, line: UInt = #line) throws {
            try mustRun(["sh", "-c", "sync; echo 2 > /proc/sys/vm/drop_caches"])
            for (name, content) in expected {
                XCTAssertEqual(try? String(contentsOfFile: daemon.mnt(name), encoding: .utf8), content, name, file: file, line: line)
            }
            for name in missing { XCTAssertEqual(stat(daemon.mnt(name)), ENOENT, name, file: file, line: line) }
        }

        // A hard link and a rename into it, a name removed and made again, a copy the control API writes.
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && ln linked-from.txt made/linked.txt && mv moved-from.txt made/moved.txt "
                     + "&& rm made/again.txt && echo new > made/again.txt"])
        XCTAssertEqual(try daemon.ctl(["decrypt-file", daemon.mnt("made/linked.txt"), daemon.mnt("made/copy.txt")]).status, 0)
        try freshLookups([("made/a.txt", "A\n"), ("made/bob.txt", "bob\n"), ("made/linked.txt", "L\n"), ("made/moved.txt", "M\n"),
                          ("made/again.txt", "new\n"), ("made/copy.txt", "L\n"), ("made2/x.txt", "X\n")],
                         missing: ["made/moved-from.txt", "made/x.txt", "made2/a.txt", "made/missing"])
        let stored = try FileManager.default.contentsOfDirectory(atPath: daemon.backing).first { name in
            name.hasPrefix("~c3") && ((try? FileManager.default.contentsOfDirectory(atPath: daemon.backing + "/" + name))?.contains("bob.txt") ?? false)
        }
        let made = try XCTUnwrap(stored, "Bob's name is plain in Alice's directory")

        // An owner change turns Bob's plain name into Alice's encrypted one.
        XCTAssertEqual(try daemon.ctl(["protect", daemon.mnt("made/bob.txt"), "alice@contoso.com"]).status, 0)
        XCTAssertFalse(try FileManager.default.contentsOfDirectory(atPath: daemon.backing + "/" + made).contains("bob.txt"))
        try freshLookups([("made/bob.txt", "bob\n"), ("made/a.txt", "A\n")], missing: ["made/missing"])

        // An exchange across the two: each name now holds the other's file, in its own form.
        let exchange = #"import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "#
            + #"sys.exit(0 if libc.syscall(316, -100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 2) == 0 else ctypes.get_errno())"#
        try mustRun(["/usr/bin/python3", "-c", exchange, daemon.mnt("made/a.txt"), daemon.mnt("made2/x.txt")])
        try freshLookups([("made/a.txt", "X\n"), ("made2/x.txt", "A\n"), ("made/copy.txt", "L\n")], missing: ["made2/a.txt", "made/x.txt"])
        XCTAssertEqual(try mustRun(["ls", daemon.mnt("made")]), "a.txt\nagain.txt\nbob.txt\ncopy.txt\nlinked.txt\nmoved.txt\n")
    }

    private func stat(_ path: String) -> Int32 {
        var attributes = Glibc.stat()
        return Glibc.lstat(path, &attributes) == 0 ? 0 : errno
    }

    /// Names stay listable while the identity is locked (its name key is class C's: held from the
    /// first unlock), while class A content is refused; before the first unlock the mount lists
    /// the stored names, and an unlock shows the real ones.
    func testListingWhileLockedAndBeforeTheFirstUnlock() throws {
        try startMount(level: "complete", passphrase: "pw")
        try mustRun(["sh", "-c", "cd '\(daemon.mountPoint)' && mkdir Project-Falcon && echo plan > Project-Falcon/acquisition-plan.txt"])
        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/lock").status, 200)
        XCTAssertEqual(try mustRun(["ls", daemon.mnt("Project-Falcon")]), "acquisition-plan.txt\n", "names stay while locked")
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt("Project-Falcon/acquisition-plan.txt")) }, EACCES, "class A content does not")

        // A restart: nothing of Alice is unlocked, so her names show as stored.
        daemon.stop()
        try daemon.start(extraArguments: Self.arguments)
        let top = try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint)
        XCTAssertEqual(top.count, 1)
        XCTAssertTrue(top[0].hasPrefix("~c3"), "\(top)")
        let inside = try FileManager.default.contentsOfDirectory(atPath: daemon.mnt(top[0]))
        XCTAssertTrue(inside.count == 1 && inside[0].hasPrefix("~c3"), "\(inside)")
        XCTAssertEqual(errnoOf { _ = try readFile(self.daemon.mnt(top[0] + "/" + inside[0])) }, EACCES)
        XCTAssertEqual(errnoOf { try writeFile(self.daemon.mnt("new.txt"), bytes("x")) }, EACCES, "nothing is named for Alice before her unlock")
        XCTAssertEqual(errnoOf { _ = try Syscall.lstat(self.daemon.mnt("Project-Falcon")) }, ENOENT)

        XCTAssertEqual(try daemon.api("POST", "/v1/accounts/alice@contoso.com/unlock", #"{"passphrase": "pw"}"#).status, 200)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: daemon.mountPoint), ["Project-Falcon"])
        usleep(1_100_000)  // the failed lookup above is believed for the negative timeout
        XCTAssertEqual(try mustRun(["cat", daemon.mnt("Project-Falcon/acquisition-plan.txt")]), "plan\n")
    }
}
