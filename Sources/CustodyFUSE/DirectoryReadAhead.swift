import CustodySystem
import Dispatch
import Glibc
import Synchronization

/// Read-ahead across the files of a directory.
///
/// A program that reads a directory's files one after another in listing order (`cat *`,
/// `tar c`, `grep -r`, `cp -r`, a backup) waits for the disk once per file: the kernel's
/// read-ahead never crosses from one file to the next. Once such a sweep shows — a read-only open
/// of the first regular file of a recent listing, or of the file after the one opened last — the
/// first `length` bytes of the next `window` files are asked for in the background
/// (`POSIX_FADV_WILLNEED`), so that their disk reads overlap instead of queuing one behind the
/// other. Listings that are only looked at (`ls -lR`) fetch nothing, and each file is fetched at
/// most once per listing.
///
/// What is kept: the node IDs of the regular files of recent listings, in listing order and
/// indexed by ID, at most `maxFiles` in all (about 30 bytes each; the oldest listings go first).
/// Listings are kept by count of files rather than of directories because a sweep may list a whole
/// tree before it reads any of it (`find | xargs cat`: `find` runs far ahead).
final class DirectoryReadAhead: @unchecked Sendable {
    static let window = 16
    static let length: Int64 = 128 * 1024
    static let maxFiles = 1 << 16

    private struct Listing {
        var files: [UInt64] = []
        /// Where each file first appears in `files`: an open anywhere in a large listing is found
        /// without scanning it (a random open in a directory of 65,536 files scanned them all,
        /// under the lock every open takes).
        var positions: [UInt64: Int] = [:]
        /// Position of the file opened last (-1: none yet).
        var lastOpened = -1
        /// Files before this position have been fetched (or passed).
        var fetchedUntil = 0
        /// Which listing of the directory this is (a listing from the start replaces the last one).
        var serial: UInt64
    }

    private struct State {
        var listings: [UInt64: Listing] = [:]
        /// Listings oldest first, as (directory, serial); entries of replaced listings are skipped.
        var order: [(UInt64, UInt64)] = []
        var orderStart = 0
        var files = 0
        var serial: UInt64 = 0

        mutating func evictOldest() {
            while orderStart < order.count {
                let (directory, serial) = order[orderStart]
                orderStart += 1
                if let listing = listings[directory], listing.serial == serial {
                    files -= listing.files.count
                    listings[directory] = nil
                    break
                }
            }
            if orderStart > 1024, orderStart * 2 > order.count {
                order.removeFirst(orderStart)
                orderStart = 0
            }
        }
    }

    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "custody.directory-read-ahead", qos: .utility)
    /// Fetches the first bytes of the files with these node IDs (run on `queue`).
    private let fetch: @Sendable ([UInt64]) -> Void

    init(fetch: @escaping @Sendable ([UInt64]) -> Void) {
        self.fetch = fetch
    }

    /// A listing of `directory` returned these regular files, in order; `fromStart` when it began
    /// at the first entry (the directory's record starts over).
    func listed(_ files: [UInt64], in directory: UInt64, fromStart: Bool) {
        guard !files.isEmpty || fromStart else { return }
        state.withLock { state in
            var listing: Listing
            if !fromStart, let existing = state.listings.removeValue(forKey: directory) {
                listing = existing
            } else {
                if let replaced = state.listings.removeValue(forKey: directory) { state.files -= replaced.files.count }
                state.serial += 1
                listing = Listing(serial: state.serial)
                state.order.append((directory, state.serial))
            }
            let added = files.prefix(Self.maxFiles)
            for (offset, file) in added.enumerated() where listing.positions[file] == nil {
                listing.positions[file] = listing.files.count + offset
            }
            listing.files.append(contentsOf: added)
            state.files += added.count
            state.listings[directory] = listing
            while state.files > Self.maxFiles, state.orderStart < state.order.count { state.evictOldest() }
        }
    }

    /// `file`, in `directory`, was opened for reading. Returns the node IDs handed to `fetch`
    /// (for tests); the fetch itself runs in the background.
    @discardableResult
    func opened(_ file: UInt64, in directory: UInt64) -> [UInt64] {
        let batch: [UInt64] = state.withLock { state in
            // (Taken out of the dictionary while it changes, so that its array is not copied.)
            guard var listing = state.listings.removeValue(forKey: directory) else { return [] }
            defer { state.listings[directory] = listing }
            let next = listing.lastOpened + 1
            let position: Int
            if next < listing.files.count, listing.files[next] == file {
                position = next
            } else if let found = listing.positions[file] {
                position = found
            } else {
                return []
            }
            listing.lastOpened = position
            guard position == 0 || position == next else { return [] }
            let from = max(position + 1, listing.fetchedUntil)
            let to = min(listing.files.count, position + 1 + Self.window)
            guard from < to else { return [] }
            listing.fetchedUntil = to
            return Array(listing.files[from..<to])
        }
        if !batch.isEmpty {
            let fetch = self.fetch
            queue.async { fetch(batch) }
        }
        return batch
    }

    /// Waits until the fetches asked for so far have been issued (for tests).
    func drain() { queue.sync {} }
}
