@testable import CustodyFUSE
import CustodySystem
import Glibc
import XCTest
import CustodyTestSupport

final class InodeTableTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-fuse").path
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
    }

    private func pathFD(_ path: String) throws -> (Int32, stat) {
        let fd = try Syscall.open(path, Linux.O_PATH | O_NOFOLLOW)
        return (fd, try Syscall.stat(of: fd))
    }

    private func isOpen(_ fd: Int32) -> Bool { fcntl(fd, F_GETFD) != -1 }

    private func makeTable() throws -> InodeTable {
        let (fd, st) = try pathFD(directory)
        return InodeTable(root: Inode(fd: fd, device: UInt64(st.st_dev), number: UInt64(st.st_ino), fileType: S_IFDIR))
    }

    func testSameObjectGetsSameIDAndDuplicateDescriptorIsClosed() throws {
        let table = try makeTable()
        close(try Syscall.open(directory + "/f", O_CREAT | O_WRONLY, 0o644))
        XCTAssertEqual(link(directory + "/f", directory + "/g"), 0)
        let (fd1, st1) = try pathFD(directory + "/f")
        let (fd2, st2) = try pathFD(directory + "/g")
        let id1 = table.remember(fd: fd1, attributes: st1)
        let id2 = table.remember(fd: fd2, attributes: st2)
        XCTAssertEqual(id1, id2, "hard links map to one node ID")
        XCTAssertNotEqual(id1, InodeTable.rootID)
        XCTAssertTrue(isOpen(fd1))
        XCTAssertFalse(isOpen(fd2), "the second descriptor was closed, not leaked")
        XCTAssertEqual(table.count, 2)

        // Two lookups: the first forget keeps it, the second retires it and closes its descriptor.
        table.forget(id1, count: 1)
        XCTAssertNoThrow(try table.inode(id1))
        table.forget(id1, count: 1)
        XCTAssertThrowsError(try table.inode(id1)) { XCTAssertEqual($0 as? Errno, .badFileDescriptor) }
        XCTAssertFalse(isOpen(fd1), "a forgotten inode's descriptor is closed")
        XCTAssertEqual(table.count, 1)
    }

    func testANodeWhoseObjectAnotherDaemonRemovedIsNotTheObjectFoundByItsNumber() throws {
        let table = try makeTable()
        close(try Syscall.open(directory + "/kept", O_CREAT | O_WRONLY, 0o644))
        close(try Syscall.open(directory + "/removed", O_CREAT | O_WRONLY, 0o644))
        let (keptFD, kept) = try pathFD(directory + "/kept")
        let (removedFD, removed) = try pathFD(directory + "/removed")
        let keptID = table.remember(fd: keptFD, attributes: kept)
        let removedID = table.remember(fd: removedFD, attributes: removed)

        // Still linked: the same node.
        table.detachIfGone(kept)
        let (again, _) = try pathFD(directory + "/kept")
        XCTAssertEqual(table.remember(fd: again, attributes: kept), keptID)

        // Removed behind the daemon, and its number found again (as a store that reuses numbers
        // gives it to a new file): a node of its own, the old one left to the kernel's forget.
        XCTAssertEqual(unlink(directory + "/removed"), 0)
        table.detachIfGone(removed)
        close(try Syscall.open(directory + "/new", O_CREAT | O_WRONLY, 0o644))
        let (newFD, _) = try pathFD(directory + "/new")
        let newID = table.remember(fd: newFD, attributes: removed)
        XCTAssertNotEqual(newID, removedID)
        XCTAssertTrue(isOpen(newFD), "the new object's descriptor is kept, not closed as a duplicate")
        XCTAssertNoThrow(try table.inode(removedID), "the old node stays until the kernel forgets it")
        XCTAssertEqual(try table.inode(newID).fd, newFD)
    }

    func testEncryptedNamesAreFoundByTheNameTheKernelKnowsUntilTheyGo() throws {
        let table = try makeTable()
        let shown = FileName("report.txt"), stored = FileName("~c3AbCdEf.sealed-form")
        close(try Syscall.open(directory + "/" + stored.description, O_CREAT | O_WRONLY, 0o644))
        close(try Syscall.open(directory + "/plain.txt", O_CREAT | O_WRONLY, 0o644))
        let (fd, st) = try pathFD(directory + "/" + stored.description)
        let id = table.remember(fd: fd, attributes: st, name: EntryName(parent: InodeTable.rootID, name: shown, stored: stored))
        XCTAssertEqual(table.storedName(in: InodeTable.rootID, shown: shown), stored)
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: FileName("report.txt2")))
        XCTAssertNil(table.storedName(in: 99, shown: shown), "only in the directory it was listed in")
        // A plain name needs no index.
        let (plainFD, plainStat) = try pathFD(directory + "/plain.txt")
        let plainID = table.remember(fd: plainFD, attributes: plainStat, name: EntryName(parent: InodeTable.rootID, name: FileName("plain.txt")))
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: FileName("plain.txt")))
        // Its stored form changed (an owner change): the index follows.
        let restored = FileName("~c3ZyXwVu.other-form")
        let root = try table.inode(InodeTable.rootID)
        table.renamed(in: root, from: stored, to: restored)
        XCTAssertEqual(table.storedName(in: InodeTable.rootID, shown: shown), restored)
        // Looked up again by another name (a hard link, a rename): the old name is dropped.
        let (again, againStat) = try pathFD(directory + "/" + stored.description)
        XCTAssertEqual(table.remember(fd: again, attributes: againStat, name: EntryName(parent: InodeTable.rootID, name: FileName("moved.txt"), stored: stored)), id)
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: shown))
        XCTAssertEqual(table.storedName(in: InodeTable.rootID, shown: FileName("moved.txt")), stored)
        // Looked up by the same name stored plain now (its owner became unmanaged): not indexed.
        let (plainAgain, plainAgainStat) = try pathFD(directory + "/" + stored.description)
        _ = table.remember(fd: plainAgain, attributes: plainAgainStat, name: EntryName(parent: InodeTable.rootID, name: FileName("moved.txt")))
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: FileName("moved.txt")))
        _ = table.remember(fd: try pathFD(directory + "/" + stored.description).0, attributes: plainAgainStat,
                           name: EntryName(parent: InodeTable.rootID, name: FileName("moved.txt"), stored: stored))
        // Removed: the name goes with the object, and with a node the kernel forgets.
        table.detach(id)
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: FileName("moved.txt")))
        let (third, thirdStat) = try pathFD(directory + "/plain.txt")
        _ = table.remember(fd: third, attributes: thirdStat, name: EntryName(parent: InodeTable.rootID, name: FileName("p"), stored: FileName("~c3AbCdEf.p")))
        XCTAssertEqual(table.storedName(in: InodeTable.rootID, shown: FileName("p")), FileName("~c3AbCdEf.p"))
        table.forget(plainID, count: 2)
        XCTAssertNil(table.storedName(in: InodeTable.rootID, shown: FileName("p")))
    }

    func testAListingShowsTheNameAKnownNodeHasForTheSameStoredName() throws {
        let table = try makeTable()
        let stored = FileName("~c3AbCdEf.sealed-form")
        close(try Syscall.open(directory + "/" + stored.description, O_CREAT | O_WRONLY, 0o644))
        close(try Syscall.open(directory + "/other", O_CREAT | O_WRONLY, 0o644))
        let (fd, st) = try pathFD(directory + "/" + stored.description)
        let id = table.remember(fd: fd, attributes: st, name: EntryName(parent: InodeTable.rootID, name: FileName("report.txt"), stored: stored))
        func shown(_ attributes: stat, in parent: UInt64 = InodeTable.rootID, _ name: FileName = stored) -> FileName? {
            name.cString.withUnsafeBufferPointer { table.shownName(ofObject: UInt64(attributes.st_dev), UInt64(attributes.st_ino), in: parent, stored: $0.baseAddress!) }
        }
        XCTAssertEqual(shown(st), FileName("report.txt"))
        XCTAssertNil(shown(st, in: 99), "known in another directory")
        XCTAssertNil(shown(st, FileName("~c3AbCdEf.another")), "listed by another stored name (moved, re-keyed)")
        let (otherFD, otherStat) = try pathFD(directory + "/other")
        XCTAssertNil(shown(otherStat), "another object")
        close(otherFD)
        // A plain name is not one a listing decrypts.
        let (plainFD, plainStat) = try pathFD(directory + "/other")
        _ = table.remember(fd: plainFD, attributes: plainStat, name: EntryName(parent: InodeTable.rootID, name: FileName("other")))
        XCTAssertNil(shown(plainStat, FileName("other")))
        // Gone from its inode number: nothing is shown for whatever takes it.
        table.detach(id)
        XCTAssertNil(shown(st))
    }

    func testADirectoryKnowsItsNamesOnlyWhenItsNodeIsMadeWithIt() throws {
        let table = try makeTable()
        XCTAssertEqual(mkdir(directory + "/made", 0o755), 0)
        XCTAssertEqual(mkdir(directory + "/listed", 0o755), 0)
        let (fd, st) = try pathFD(directory + "/made")
        let made = table.remember(fd: fd, attributes: st, made: MadeDirectoryNames(generation: 7))
        XCTAssertEqual(try table.inode(made).madeNames.withLock { $0?.generation }, 7)
        // A node another request made first (a listing) may have served requests already.
        let (listedFD, listedStat) = try pathFD(directory + "/listed")
        let listed = table.remember(fd: listedFD, attributes: listedStat)
        let (againFD, againStat) = try pathFD(directory + "/listed")
        XCTAssertEqual(table.remember(fd: againFD, attributes: againStat, made: MadeDirectoryNames(generation: 7)), listed)
        XCTAssertTrue(try table.inode(listed).madeNames.withLock { $0 == nil })
        // Not for a file.
        close(try Syscall.open(directory + "/file", O_CREAT | O_WRONLY, 0o644))
        let (fileFD, fileStat) = try pathFD(directory + "/file")
        let file = table.remember(fd: fileFD, attributes: fileStat, made: MadeDirectoryNames(generation: 7))
        XCTAssertTrue(try table.inode(file).madeNames.withLock { $0 == nil })
    }

    func testNodeIDsAreNotReusedAndRootIsNeverForgotten() throws {
        let table = try makeTable()
        close(try Syscall.open(directory + "/f", O_CREAT | O_WRONLY, 0o644))
        var (fd, st) = try pathFD(directory + "/f")
        let first = table.remember(fd: fd, attributes: st)
        table.forget(first, count: 1)
        (fd, st) = try pathFD(directory + "/f")
        let second = table.remember(fd: fd, attributes: st)
        XCTAssertNotEqual(first, second)
        table.forget(InodeTable.rootID, count: 1 << 40)
        XCTAssertNoThrow(try table.inode(InodeTable.rootID))
    }

    /// A removed file's inode number comes back as another file while the kernel still holds the
    /// old node (its FORGET on the way): the new file gets a node of its own, and the late forget
    /// of the old one leaves the new one alone.
    func testAReusedInodeNumberIsANewNode() throws {
        let table = try makeTable()
        close(try Syscall.open(directory + "/p", O_CREAT | O_WRONLY, 0o644))
        let (fd, st) = try pathFD(directory + "/p")
        let placeholder = table.remember(fd: fd, attributes: st)

        // Another type under the same number (tar replaces a placeholder file with a symlink).
        var symlinkStat = st
        symlinkStat.st_mode = S_IFLNK | 0o777
        let (linkFD, _) = try pathFD(directory)
        let symlink = table.remember(fd: linkFD, attributes: symlinkStat)
        XCTAssertNotEqual(symlink, placeholder, "a number that comes back as another type is another node")
        XCTAssertEqual(try table.inode(placeholder).fileType, S_IFREG, "the kernel's old node still answers as it was")
        XCTAssertEqual(try table.inode(symlink).fileType, S_IFLNK)
        table.forget(placeholder, count: 1)
        XCTAssertEqual(table.id(device: UInt64(st.st_dev), number: UInt64(st.st_ino)), symlink, "the late forget left the new node")

        // The same type after the last name went through the mount (detach).
        table.detach(symlink)
        XCTAssertNil(table.id(device: UInt64(st.st_dev), number: UInt64(st.st_ino)))
        XCTAssertNoThrow(try table.inode(symlink), "a detached node stays until the kernel forgets it")
        let (againFD, _) = try pathFD(directory)
        let again = table.remember(fd: againFD, attributes: symlinkStat)
        XCTAssertNotEqual(again, symlink)
        XCTAssertTrue(isOpen(againFD), "the new node keeps its own descriptor")
    }

    func testInFlightRequestKeepsDescriptorAfterForget() throws {
        let table = try makeTable()
        close(try Syscall.open(directory + "/f", O_CREAT | O_WRONLY, 0o644))
        let (fd, st) = try pathFD(directory + "/f")
        let id = table.remember(fd: fd, attributes: st)
        var held: Inode? = try table.inode(id)
        table.forget(id, count: 1)
        XCTAssertTrue(isOpen(fd), "a request still holding the inode keeps its descriptor")
        XCTAssertEqual(held?.fd, fd)
        held = nil
        XCTAssertFalse(isOpen(fd))
    }

    func testHandleBoxRoundTrip() {
        final class Box { let value = 7 }
        let fh = HandleBox.store(Box())
        XCTAssertEqual(HandleBox.borrow(fh, as: Box.self)?.value, 7)
        XCTAssertNil(HandleBox.borrow(0, as: Box.self))
        XCTAssertEqual(HandleBox.release(fh, as: Box.self)?.value, 7)
    }
}

final class MountValidationTests: XCTestCase {
    var directory = ""

    override func setUpWithError() throws {
        directory = try TemporaryDirectory("custody-mv").path
        XCTAssertEqual(mkdir(directory + "/backing", 0o755), 0)
        XCTAssertEqual(mkdir(directory + "/mnt", 0o755), 0)
    }

    override func tearDown() {
        TemporaryDirectory.removeTree(directory)
    }

    private func validate(_ backing: String, _ mountPoint: String, _ options: MountOptions = MountOptions()) -> MountError? {
        do {
            _ = try FUSEMount(backing: backing, mountPoint: mountPoint, options: options)
            return nil
        } catch {
            return error
        }
    }

    func testRefusesBadPathsWithClearErrors() throws {
        let b = directory + "/backing", m = directory + "/mnt"
        XCTAssertEqual(validate(directory + "/nope", m), .backingMissing(directory + "/nope"))
        close(try Syscall.open(directory + "/file", O_CREAT | O_WRONLY, 0o644))
        XCTAssertEqual(validate(directory + "/file", m), .backingNotDirectory(directory + "/file"))
        XCTAssertEqual(validate(b, directory + "/missing"), .mountPointMissing(directory + "/missing"))
        XCTAssertEqual(validate(b, directory + "/file"), .mountPointNotDirectory(directory + "/file"))
        XCTAssertEqual(mkdir(b + "/inner", 0o755), 0)
        let inside = resolvedPath(b + "/inner") ?? ""
        XCTAssertEqual(validate(b, b + "/inner"), .mountPointInsideBacking(mountPoint: inside, backing: resolvedPath(b) ?? ""))
        XCTAssertEqual(validate(b, b), .mountPointInsideBacking(mountPoint: resolvedPath(b) ?? "", backing: resolvedPath(b) ?? ""))
        close(try Syscall.open(m + "/occupant", O_CREAT | O_WRONLY, 0o644))
        XCTAssertEqual(validate(b, m), .mountPointNotEmpty(resolvedPath(m) ?? ""))
        var options = MountOptions()
        options.allowNonEmpty = true
        XCTAssertNil(validate(b, m, options))
        XCTAssertTrue(MountError.mountPointNotEmpty("/x").description.contains("--allow-nonempty"))
    }

    func testRefusesAnExistingMountPoint() {
        XCTAssertEqual(validate(directory + "/backing", "/proc"), .alreadyMounted("/proc", type: "proc"))
    }
}
