import CustodyCore
import CustodySystem
@testable import CustodyGuard
import Glibc
import XCTest

/// The parts a decision is made of: the intent of an open, the location of a path, the writable
/// files of a process, the file systems selected.
final class DecisionPartsTests: XCTestCase {
    func testIntentFromFlags() {
        XCTAssertEqual(OpenIntent(flags: Int64(O_RDONLY)), .read)
        XCTAssertEqual(OpenIntent(flags: Int64(O_RDONLY | O_CLOEXEC | O_NONBLOCK)), .read)
        XCTAssertEqual(OpenIntent(flags: Int64(O_WRONLY)), .write(creates: false, exclusive: false, reads: false))
        XCTAssertEqual(OpenIntent(flags: Int64(O_RDWR | O_CREAT)), .write(creates: true, exclusive: false, reads: true))
        XCTAssertEqual(OpenIntent(flags: Int64(O_WRONLY | O_CREAT | O_EXCL)), .write(creates: true, exclusive: true, reads: false))
        XCTAssertTrue(OpenIntent.unknown.reads)
        XCTAssertEqual(OpenIntent(flags: Int64(O_RDONLY | O_TRUNC)), .write(creates: false, exclusive: false, reads: true), "truncating is writing")
        XCTAssertEqual(OpenIntent(flags: Int64(O_RDONLY | O_CREAT)), .write(creates: true, exclusive: false, reads: true))
    }

    /// A thread in an open call that waits (here: on a FIFO nobody writes to) shows its flags.
    func testIntentOfAThreadInAnOpenCall() throws {
        let fifo = NSTemporaryPath() + "-fifo"
        XCTAssertEqual(mkfifo(fifo, 0o600), 0)
        defer { unlink(fifo) }
        var child: pid_t = 0
        let words = ["/usr/bin/python3", "-c", "import os; os.open('\(fifo)', os.O_WRONLY | os.O_APPEND)"]
        var arguments: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        XCTAssertEqual(posix_spawn(&child, "/usr/bin/python3", nil, nil, &arguments, environ), 0)
        defer {
            kill(child, SIGKILL)
            var status: Int32 = 0
            waitpid(child, &status, 0)
            for argument in arguments { free(argument) }
        }
        // Until python reaches its open it is starting: in execve (a read) or between calls.
        var intent = OpenIntent.unknown
        for _ in 0..<400 {
            intent = OpenIntent.of(thread: child)
            if intent != .unknown, intent != .read { break }
            usleep(20_000)
        }
        XCTAssertEqual(intent, .write(creates: false, exclusive: false, reads: false))
        XCTAssertEqual(OpenIntent.of(thread: getpid()), .unknown, "a thread not in an open call")

    }

    func testRulesAllowOnlyWhatEveryIdentityAllows() {
        let rules = SaveRules(generation: 1, directories: [("/home/d/OneDrive - Contoso/Team", "SharePoint"), ("/home/d/OneDrive - Contoso", "OneDriveForBusiness")],
                              allowed: ["a@contoso.com": ["AccountDocument", "OneDriveForBusiness"], "b@contoso.com": ["OneDriveForBusiness", "SharePoint"]])
        XCTAssertEqual(rules.configuredLocation(of: "/home/d/OneDrive - Contoso/Team/x"), "SharePoint", "the deepest directory")
        XCTAssertEqual(rules.configuredLocation(of: "/home/d/OneDrive - Contoso/x"), "OneDriveForBusiness")
        XCTAssertNil(rules.configuredLocation(of: "/home/d/OneDrive - Contoso2/x"), "a prefix is not a parent")
        XCTAssertTrue(rules.allows(["a@contoso.com", "b@contoso.com"], toSaveTo: "OneDriveForBusiness"))
        XCTAssertFalse(rules.allows(["a@contoso.com", "b@contoso.com"], toSaveTo: "SharePoint"))
        XCTAssertFalse(rules.allows(["a@contoso.com"], toSaveTo: "LocalDrive"))
        XCTAssertTrue(rules.allows(["gone@contoso.com"], toSaveTo: "LocalDrive"), "an identity the rules no longer name restricts nothing")
    }

    func testSharedWritableMappingsAreFound() {
        let maps = """
            7f00-7f01 rw-s 00000000 08:01 1234 /home/d/out.bin
            7f02-7f03 r--s 00000000 08:01 1235 /home/d/readonly.bin
            7f04-7f05 rw-p 00000000 08:01 1236 /usr/lib/x86_64-linux-gnu/libc.so.6
            7f06-7f07 rw-s 00000000 00:05 7 /dev/zero (deleted)
            7f08-7f09 rw-s 00000000 fd:1a 99 /media/usb/with space.db
            7f0a-7f0b rw-p 00000000 00:00 0 [heap]
            """
        let found = WritableFiles.parseSharedWritable(maps)
        XCTAssertEqual(found.map { $0.path }, ["/home/d/out.bin", "/dev/zero (deleted)", "/media/usb/with space.db"])
        XCTAssertEqual(found.last?.device, FileSystemSelection.makeDevice(major: 0xfd, minor: 0x1a))
    }

    func testADescriptorOpenForWritingIsFound() throws {
        let path = NSTemporaryPath() + "-writable"
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(fd, 0)
        defer {
            close(fd)
            unlink(path)
        }
        let reader = open("/etc/hostname", O_RDONLY | O_CLOEXEC)
        defer { close(reader) }
        let files = WritableFiles.of(process: getpid())
        XCTAssertTrue(files.contains { $0.path == path }, "\(files)")
        XCTAssertFalse(files.contains { $0.path == "/etc/hostname" })
    }

    func testFileSystemSelection() {
        let entries = [MountEntryFixture.entry("/", "ext4", "8:1"), MountEntryFixture.entry("/proc", "proc", "0:22"),
                       MountEntryFixture.entry("/dev/shm", "tmpfs", "0:24"), MountEntryFixture.entry("/srv/nfs", "nfs4", "0:50"),
                       MountEntryFixture.entry("/home/d/Work", "fuse.custody", "0:60")]
        let devices = Dictionary(uniqueKeysWithValues: entries.map { ($0.mountPoint, FileSystemSelection.device($0.device)) })
        let all = FileSystemSelection.select(.all, entries: entries) { devices[$0] ?? nil }
        let names = Set(all.values.map(\.mountPoint))
        XCTAssertTrue(names.contains("/"))
        XCTAssertTrue(names.contains("/dev/shm"))
        XCTAssertFalse(names.contains("/proc"))
        XCTAssertFalse(names.contains("/home/d/Work"), "Custody's own mounts are left to the mount")
        XCTAssertEqual(FileSystemSelection.location(of: "nfs4"), "Other")
        XCTAssertEqual(FileSystemSelection.location(of: "vfat"), "LocalDrive")
        XCTAssertTrue(FileSystemSelection.select(.none, entries: entries).isEmpty)
        let covered = FileSystemSelection.select(.all, entries: entries) { $0 == "/dev/shm" ? FileSystemSelection.device("8:1") : devices[$0] ?? nil }
        XCTAssertFalse(covered.values.contains { $0.mountPoint == "/dev/shm" }, "a mount point another mount covers cannot be marked by its path")
        XCTAssertEqual(FileSystemSelection.device("8:1"), FileSystemSelection.makeDevice(major: 8, minor: 1))
        let listed = FileSystemSelection.select(.holding(["/dev/shm", "/srv"]), entries: entries + [MountEntryFixture.entry("/srv/nfs/x", "proc", "0:70")]) {
            $0 == "/srv" ? FileSystemSelection.device("8:1") : devices[$0] ?? nil
        }
        XCTAssertEqual(Set(listed.values.map(\.mountPoint)), ["/dev/shm", "/srv", "/srv/nfs"], "what holds the paths, and what is mounted below them")
        XCTAssertEqual(listed.values.first { $0.mountPoint == "/srv/nfs" }?.location, "Other")
        var info = stat()
        XCTAssertEqual(stat("/", &info), 0)
        XCTAssertTrue(FileSystemSelection.select(.holding(["/"]), entries: MountTable.entries()).keys.contains(UInt64(info.st_dev)))
    }

    func testAFileJustCreatedIsRemovedAndAnOlderOneIsNot() throws {
        let fresh = NSTemporaryPath() + "-fresh", old = NSTemporaryPath() + "-old", full = NSTemporaryPath() + "-full"
        for path in [fresh, old, full] { close(open(path, O_WRONLY | O_CREAT, 0o600)) }
        defer { for path in [fresh, old, full] { unlink(path) } }
        XCTAssertEqual(write(open(full, O_WRONLY), "x", 1), 1)
        var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000, tv_nsec: 0)]
        XCTAssertEqual(utimensat(AT_FDCWD, old, &times, 0), 0)
        // ctime follows the change above: only a file untouched for a while is "old"; use O_EXCL's rule for the fresh one.
        var info = stat()
        XCTAssertEqual(stat(full, &info), 0)
        XCTAssertFalse(DataGuard.removeIfJustCreated(full, info, exclusive: true), "not empty")
        XCTAssertEqual(stat(fresh, &info), 0)
        XCTAssertTrue(DataGuard.removeIfJustCreated(fresh, info, exclusive: false))
        XCTAssertNotEqual(access(fresh, F_OK), 0)
        XCTAssertEqual(stat(old, &info), 0)
        info.st_ctim.tv_sec -= 60
        XCTAssertFalse(DataGuard.removeIfJustCreated(old, info, exclusive: false), "changed a minute ago: not made by this open")
        XCTAssertEqual(access(old, F_OK), 0)
    }
}

enum MountEntryFixture {
    static func entry(_ mountPoint: String, _ type: String, _ device: String) -> MountEntry {
        MountEntry(mountPoint: mountPoint, fileSystemType: type, source: "x", device: device)
    }
}

func NSTemporaryPath() -> String { "/tmp/custody-guard-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))" }
