import CustodyAPI
import CustodySystem
import Dispatch
import FoundationEssentials
import Glibc
import Synchronization

/// A long operation (a wipe, a recursive protect) run on a thread of its own, with progress that
/// any client can read (`GET /v1/jobs/{id}`) while it runs and its result after.
final class Job: @unchecked Sendable {
    enum State: String { case running, succeeded, failed }

    let id: Int
    /// The uid of the caller that started it: a user sees its own jobs, administrators all.
    let startedBy: UInt32
    /// What `GET /v1/jobs/{id}` shows: counters (files scanned, deleted, bytes freed, objects
    /// done …) as they stand, and the answer or the error once it has finished.
    private let view: Mutex<CustodyJob>
    private let failureBox = Mutex<ControlAPI.Failure?>(nil)
    /// How it failed, with the HTTP status a waiting request answers with.
    var failure: ControlAPI.Failure? { failureBox.withLock { $0 } }
    private let done = DispatchSemaphore(value: 0)

    init(id: Int, kind: String, target: String, startedBy: UInt32) {
        self.id = id
        self.startedBy = startedBy
        view = Mutex(CustodyJob(id: id, kind: kind, target: target, state: State.running.rawValue, startedAt: wallClockSeconds(), progress: [:]))
    }

    var snapshot: CustodyJob { view.withLock { $0 } }

    var isRunning: Bool { snapshot.state == State.running.rawValue }

    func update(_ counters: [String: UInt64]) {
        view.withLock { view in for (key, value) in counters { view.progress[key] = value } }
    }

    fileprivate func finish(_ outcome: Result<JSONValue, ControlAPI.Failure>) {
        view.withLock { view in
            view.finishedAt = wallClockSeconds()
            switch outcome {
            case .success(let result):
                view.state = State.succeeded.rawValue
                view.result = result
            case .failure(let failure):
                failureBox.withLock { $0 = failure }
                view.state = State.failed.rawValue
                view.error = ErrorAnswer(code: failure.code, name: failure.name, message: failure.message)
            }
        }
        done.signal()
    }

    /// Waits until the job has finished (each waiter passes the signal on to the next).
    func wait() {
        done.wait()
        done.signal()
    }
}

/// The jobs of this daemon run; finished ones are kept (the last `capacity`).
final class JobRegistry: Sendable {
    private struct State {
        var next = 1
        var jobs: [Job] = []
    }
    private let state = Mutex(State())
    let capacity = 100

    /// Starts `body` on a new thread as a job.
    func start(kind: String, target: String, startedBy: UInt32, _ body: @escaping @Sendable (Job) throws(ControlAPI.Failure) -> JSONValue) -> Job {
        let job = state.withLock { state in
            let job = Job(id: state.next, kind: kind, target: target, startedBy: startedBy)
            state.next += 1
            state.jobs.append(job)
            let finished = state.jobs.filter { !$0.isRunning }
            if finished.count > capacity, let oldest = finished.first { state.jobs.removeAll { $0 === oldest } }
            return job
        }
        let started = try? DaemonThread.start("custody-job", detached: true) {
            do throws(ControlAPI.Failure) {
                job.finish(.success(try body(job)))
            } catch {
                job.finish(.failure(error))
            }
        }
        if started == nil {
            job.finish(.failure(ControlAPI.Failure(status: 503, code: 503, name: "ServiceBusy", message: "cannot start a thread for the job")))
        }
        return job
    }

    func job(_ id: Int) -> Job? { state.withLock { $0.jobs.first { $0.id == id } } }

    /// The jobs `caller` may see: all for administrators, its own for a user.
    func visible(to caller: Caller) -> [Job] { all.filter { caller.isAdmin || $0.startedBy == caller.uid } }
    var all: [Job] { state.withLock { $0.jobs } }
}


