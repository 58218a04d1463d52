@testable import CustodySystem
import Glibc
import XCTest

final class FileMappingTests: XCTestCase {
    var path = ""
    var fd: Int32 = -1
    let page = Int(sysconf(Int32(_SC_PAGESIZE)))

    override func setUpWithError() throws {
        var template = Array("/tmp/custody-map.XXXXXX".utf8CString)
        fd = mkstemp(&template)
        XCTAssertGreaterThanOrEqual(fd, 0)
        path = String(cString: template)
    }

    override func tearDown() {
        close(fd)
        unlink(path)
    }

    func write(_ bytes: [UInt8], at offset: Int) throws {
        try bytes.withUnsafeBytes { try Syscall.pwriteAll(fd, $0.baseAddress!, $0.count, Int64(offset)) }
    }

    func pattern(_ count: Int, seed: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ seed) } }

    /// Copies mapped bytes under the guard (nil if the copy faulted or the range is not mapped).
    func copy(_ mapping: FileMapping, from offset: Int, count: Int) -> [UInt8]? {
        guard mapping.contains(offset: offset, count: count) else { return nil }
        var out = [UInt8](repeating: 0xEE, count: count)
        let copied = out.withUnsafeMutableBytes { buffer in
            var job = CopyJob(destination: buffer.baseAddress!, source: mapping.base + offset, count: count)
            return FileMapping.guarded(copyJob, &job)
        }
        return copied ? out : nil
    }

    func testCopiesWhatTheFileHolds() throws {
        let content = pattern(3 * page + 100, seed: 1)
        try write(content, at: 0)
        let mapping = try FileMapping(fd: fd, length: 8 * page)
        XCTAssertEqual(copy(mapping, from: 0, count: content.count), content)
        XCTAssertEqual(copy(mapping, from: page - 10, count: 30), Array(content[(page - 10)..<(page + 20)]))
        // A write through the descriptor is visible: the mapping is the page cache.
        try write([1, 2, 3], at: 5)
        XCTAssertEqual(copy(mapping, from: 4, count: 5), [content[4], 1, 2, 3, content[8]])
        // Ranges outside the mapping are refused, not read.
        XCTAssertNil(copy(mapping, from: 8 * page - 1, count: 2))
        XCTAssertNil(copy(mapping, from: -1, count: 1))
    }

    func testAFileCutUnderneathFailsTheCopyInsteadOfKillingTheProcess() throws {
        let content = pattern(4 * page, seed: 2)
        try write(content, at: 0)
        let mapping = try FileMapping(fd: fd, length: 4 * page)
        XCTAssertEqual(copy(mapping, from: 3 * page, count: page), Array(content[(3 * page)...]))

        // Another descriptor cuts the file to one page: whole pages past the end raise SIGBUS.
        let other = open(path, O_RDWR)
        XCTAssertGreaterThanOrEqual(other, 0)
        defer { close(other) }
        XCTAssertEqual(ftruncate(other, off_t(page)), 0)
        XCTAssertNil(copy(mapping, from: 2 * page, count: 16))
        // Again (SIGBUS must not be left blocked by the first jump out of the handler), and a copy
        // that starts inside the file and runs past it.
        XCTAssertNil(copy(mapping, from: 3 * page, count: 16))
        XCTAssertNil(copy(mapping, from: page - 8, count: page))
        var blocked = sigset_t()
        XCTAssertEqual(pthread_sigmask(SIG_BLOCK, nil, &blocked), 0)
        XCTAssertEqual(sigismember(&blocked, SIGBUS), 0)
        // What is left still copies; so does what the file grows back into.
        XCTAssertEqual(copy(mapping, from: 0, count: 64), Array(content[0..<64]))
        let grown = pattern(2 * page, seed: 3)
        try write(grown, at: 2 * page)
        XCTAssertEqual(copy(mapping, from: 2 * page, count: 2 * page), grown)

        // Every thread is guarded, not only the first one to copy.
        XCTAssertEqual(ftruncate(other, 0), 0)
        let failures = UnsafeMutablePointer<Int>.allocate(capacity: 1)
        failures.initialize(to: 0)
        defer { failures.deallocate() }
        var threads: [pthread_t] = []
        for _ in 0..<4 {
            let context = UnsafeMutableRawPointer(Unmanaged.passRetained(Box((mapping, failures))).toOpaque())
            var thread = pthread_t()
            XCTAssertEqual(pthread_create(&thread, nil, { raw in
                let box = Unmanaged<Box<(FileMapping, UnsafeMutablePointer<Int>)>>.fromOpaque(raw!).takeRetainedValue()
                var byte: UInt8 = 0
                for offset in stride(from: 0, to: box.value.0.length, by: 512) {
                    var job = CopyJob(destination: &byte, source: box.value.0.base + offset, count: 1)
                    if FileMapping.guarded(copyJob, &job) { box.value.1.pointee += 1 }
                }
                return nil
            }, context), 0)
            threads.append(thread)
        }
        for thread in threads { pthread_join(thread, nil) }
        XCTAssertEqual(failures.pointee, 0, "copies from an empty file succeeded")
    }

    func testUnmappableDescriptorsAreAnError() throws {
        let writeOnly = open(path, O_WRONLY)
        defer { close(writeOnly) }
        XCTAssertThrowsError(try FileMapping(fd: writeOnly, length: page)) { XCTAssertEqual($0 as? Errno, Errno(EACCES)) }
        XCTAssertThrowsError(try FileMapping(fd: fd, length: 0))
    }
}

struct CopyJob {
    let destination: UnsafeMutableRawPointer
    let source: UnsafeRawPointer
    let count: Int
}

let copyJob: @convention(c) (UnsafeMutableRawPointer?) -> Void = { raw in
    let job = raw!.assumingMemoryBound(to: CopyJob.self).pointee
    memcpy(job.destination, job.source, job.count)
}

final class Box<Value> {
    let value: Value
    init(_ value: Value) { self.value = value }
}
