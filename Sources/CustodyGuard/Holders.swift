import CLinux

/// The processes that hold managed data, and their threads: the guard thread's own table (no
/// lock). A process holds the identities whose files it read, and so does every process it starts
/// afterwards; the table follows forks, executions and exits from the kernel's process events.
struct ProcessHolders {
    struct Holder: Equatable, Sendable {
        var identities: Set<String>
        var threads: Set<Int32>
        /// When it started holding (clock ticks since boot), to tell its later children.
        var since: UInt64
    }

    private(set) var processes: [Int32: Holder] = [:]
    /// Counts changes of which processes hold what (not of their threads): what is worth saving.
    private(set) var membership: UInt64 = 0
    /// Every thread of every holder, with its process.
    private var owners: [Int32: Int32] = [:]

    var isEmpty: Bool { processes.isEmpty }

    /// The process of thread `tid` and what it holds; nil for a thread of a process that holds nothing.
    func holder(ofThread tid: Int32) -> (process: Int32, holder: Holder)? {
        guard let process = owners[tid], let holder = processes[process] else { return nil }
        return (process, holder)
    }

    /// `process` (with `threads`) holds `identities` from now on, besides what it held.
    mutating func hold(_ process: Int32, identities: Set<String>, threads: [Int32], since: UInt64) {
        var holder = processes[process] ?? Holder(identities: [], threads: [], since: since)
        if processes[process] == nil || !identities.isSubset(of: holder.identities) { membership &+= 1 }
        holder.identities.formUnion(identities)
        for thread in threads + [process] {
            holder.threads.insert(thread)
            owners[thread] = process
        }
        processes[process] = holder
    }

    /// Follows one process event.
    mutating func apply(_ event: clinux_process_event) {
        switch Int(event.what) {
        case CLINUX_PROCESS_FORK:
            if event.pid != event.tgid {
                // A new thread of a holder.
                guard processes[event.tgid] != nil else { return }
                processes[event.tgid]?.threads.insert(event.pid)
                owners[event.pid] = event.tgid
            } else if let parent = processes[event.parent_tgid] {
                // A new process started by a holder holds what its parent holds.
                processes[event.tgid] = Holder(identities: parent.identities, threads: [event.pid], since: parent.since)
                owners[event.pid] = event.tgid
                membership &+= 1
            }
        case CLINUX_PROCESS_EXEC:
            // After an execution the process has one thread, whose ID is the process's.
            guard var holder = processes[event.tgid] else { return }
            for thread in holder.threads where thread != event.tgid { owners.removeValue(forKey: thread) }
            holder.threads = [event.tgid]
            owners[event.tgid] = event.tgid
            processes[event.tgid] = holder
        case CLINUX_PROCESS_EXIT:
            remove(thread: event.pid, of: event.tgid)
        default:
            break
        }
    }

    /// `process` holds nothing any more (nor do its threads).
    mutating func drop(_ process: Int32) {
        guard let holder = processes.removeValue(forKey: process) else { return }
        membership &+= 1
        for thread in holder.threads { owners.removeValue(forKey: thread) }
    }

    mutating func remove(thread: Int32, of process: Int32) {
        owners.removeValue(forKey: thread)
        guard var holder = processes[process] else { return }
        holder.threads.remove(thread)
        if holder.threads.isEmpty {
            processes.removeValue(forKey: process)
            membership &+= 1
        } else {
            processes[process] = holder
        }
    }

    /// After events were lost: each holder's threads as the system shows them now (`threads`
    /// answers nil for a process that is gone), and the processes started since by a holder
    /// (`children`: process, parent, start time).
    mutating func resynchronize(threads: (Int32) -> [Int32]?, children: [(process: Int32, parent: Int32, start: UInt64)]) {
        membership &+= 1
        for (process, holder) in processes {
            for thread in holder.threads { owners.removeValue(forKey: thread) }
            guard let current = threads(process), !current.isEmpty else {
                processes.removeValue(forKey: process)
                continue
            }
            processes[process]?.threads = Set(current)
            for thread in current { owners[thread] = process }
        }
        // Descendants, parents before children.
        var added = true
        while added {
            added = false
            for child in children where processes[child.process] == nil {
                guard let parent = processes[child.parent], child.start >= parent.since else { continue }
                let current = threads(child.process) ?? [child.process]
                hold(child.process, identities: parent.identities, threads: current, since: parent.since)
                added = true
            }
        }
    }
}
