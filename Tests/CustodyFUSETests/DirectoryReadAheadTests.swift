@testable import CustodyFUSE
import Synchronization
import XCTest

final class DirectoryReadAheadTests: XCTestCase {
    final class Recorder: Sendable {
        let batches = Mutex<[[UInt64]]>([])
        var all: [[UInt64]] { batches.withLock { $0 } }
    }

    private func makeReadAhead() -> (DirectoryReadAhead, Recorder) {
        let fetched = Recorder()
        let readAhead = DirectoryReadAhead { ids in fetched.batches.withLock { $0.append(ids) } }
        return (readAhead, fetched)
    }

    func testASweepInListingOrderFetchesTheNextFilesOnce() {
        let (readAhead, fetched) = makeReadAhead()
        let window = DirectoryReadAhead.window
        let files = (100..<140).map(UInt64.init)
        readAhead.listed(Array(files[0..<25]), in: 7, fromStart: true)
        readAhead.listed(Array(files[25...]), in: 7, fromStart: false)

        // The first file of the listing starts a sweep: the next `window` files.
        XCTAssertEqual(readAhead.opened(100, in: 7), Array(files[1...window]))
        // The next one: only the one file not asked for yet.
        XCTAssertEqual(readAhead.opened(101, in: 7), [files[window + 1]])
        // A jump is not a sweep; the file after it is again.
        XCTAssertEqual(readAhead.opened(130, in: 7), [])
        XCTAssertEqual(readAhead.opened(131, in: 7), Array(files[(window + 2)...].filter { $0 > 131 && $0 <= 131 + UInt64(window) }))
        // Near the end: only what is left; at the end, nothing.
        XCTAssertEqual(readAhead.opened(139, in: 7), [])
        // Unknown directories and files fetch nothing.
        XCTAssertEqual(readAhead.opened(100, in: 8), [])
        XCTAssertEqual(readAhead.opened(999, in: 7), [])

        readAhead.drain()
        XCTAssertEqual(fetched.all, [Array(files[1...window]), [files[window + 1]],
                                                 Array((132...(131 + UInt64(window))).filter { $0 < 140 })])
    }

    func testOpensAnywhereInALargeListingAndRepeatedIDs() {
        let (readAhead, _) = makeReadAhead()
        let window = UInt64(DirectoryReadAhead.window)
        readAhead.listed(Array(0..<UInt64(DirectoryReadAhead.maxFiles)), in: 3, fromStart: true)
        for start in [UInt64(7), 40_000, 65_000] {
            XCTAssertEqual(readAhead.opened(start, in: 3), [], "a jump is not a sweep")
            XCTAssertEqual(readAhead.opened(start + 1, in: 3), Array((start + 2)...(start + 1 + window)))
        }
        // A file listed twice (hard links share a node ID) is where it first appears.
        readAhead.listed([4, 5, 4, 6], in: 9, fromStart: true)
        XCTAssertEqual(readAhead.opened(5, in: 9), [])
        XCTAssertEqual(readAhead.opened(6, in: 9), [])
        XCTAssertEqual(readAhead.opened(4, in: 9), [5, 4, 6], "found at position 0: the start of a sweep")
    }

    func testAListingFromTheStartReplacesTheOldOne() {
        let (readAhead, _) = makeReadAhead()
        readAhead.listed([1, 2, 3], in: 7, fromStart: true)
        XCTAssertEqual(readAhead.opened(1, in: 7), [2, 3])
        readAhead.listed([5, 6, 1, 2], in: 7, fromStart: true)
        XCTAssertEqual(readAhead.opened(5, in: 7), [6, 1, 2], "a new listing is fetched afresh, in its own order")
    }

    func testOldListingsGoOnceTheFileLimitIsReached() {
        let (readAhead, _) = makeReadAhead()
        let perDirectory = 1000
        let directories = DirectoryReadAhead.maxFiles / perDirectory + 2
        for directory in 0..<directories {
            let first = UInt64(directory * perDirectory)
            readAhead.listed(Array(first..<(first + UInt64(perDirectory))), in: UInt64(directory), fromStart: true)
        }
        XCTAssertEqual(readAhead.opened(0, in: 0), [], "the oldest listing was dropped")
        let last = UInt64((directories - 1) * perDirectory)
        XCTAssertEqual(readAhead.opened(last, in: UInt64(directories - 1)).count, DirectoryReadAhead.window)
        // One listing larger than the limit keeps only the limit.
        readAhead.listed(Array(0..<UInt64(DirectoryReadAhead.maxFiles + 10)), in: 1_000_000, fromStart: true)
        XCTAssertEqual(readAhead.opened(UInt64(DirectoryReadAhead.maxFiles + 5), in: 1_000_000), [])
        XCTAssertEqual(readAhead.opened(0, in: 1_000_000).count, DirectoryReadAhead.window)
    }
}
