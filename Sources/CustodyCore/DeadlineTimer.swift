import CustodySystem
import Glibc

/// Completes locks when their grace period ends, even when no request arrives: a thread that
/// sleeps until the engine's next deadline (or until a new lock request wakes it).
final class DeadlineTimer: @unchecked Sendable {
    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var running = true
    private var thread: pthread_t?
    private weak var engine: Engine?

    init(engine: Engine) {
        self.engine = engine
        pthread_mutex_init(&mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(&condition, &attributes)
        pthread_condattr_destroy(&attributes)
        thread = try? DaemonThread.start("custody-timer") { [self] in loop() }
    }

    /// Wakes the thread to look at the deadlines again.
    func poke() {
        pthread_mutex_lock(&mutex)
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
    }

    func stop() {
        pthread_mutex_lock(&mutex)
        running = false
        pthread_cond_signal(&condition)
        pthread_mutex_unlock(&mutex)
        if let thread { pthread_join(thread, nil) }
        thread = nil
    }

    private func loop() {
        pthread_mutex_lock(&mutex)
        while running {
            pthread_mutex_unlock(&mutex)
            engine?.processDeadlines()
            let next = engine?.nextDeadline()
            pthread_mutex_lock(&mutex)
            guard running else { break }
            // The engine's clock is monotonic seconds, like CLOCK_MONOTONIC; wait at most 60 s.
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let current = Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
            let wake = min(next ?? current + 60, current + 60)
            var until = timespec(tv_sec: Int(wake), tv_nsec: Int((wake - wake.rounded(.down)) * 1e9))
            if wake > current { pthread_cond_timedwait(&condition, &mutex, &until) }
        }
        pthread_mutex_unlock(&mutex)
    }
}
