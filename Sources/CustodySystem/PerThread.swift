import Glibc

/// A value of each thread's own: made on the thread's first use, released when the thread ends.
/// (Swift has no thread-local storage on Linux; this is a pthread key holding a retained object.)
public final class PerThread<Value: AnyObject>: @unchecked Sendable {
    private let key: pthread_key_t
    private let make: @Sendable () -> Value

    public init(_ make: @escaping @Sendable () -> Value) {
        var key = pthread_key_t()
        // Runs at thread exit with the thread's object.
        pthread_key_create(&key) { pointer in
            if let pointer { Unmanaged<AnyObject>.fromOpaque(pointer).release() }
        }
        self.key = key
        self.make = make
    }

    /// The calling thread's value.
    @inline(__always)
    public var value: Value {
        if let pointer = pthread_getspecific(key) { return Unmanaged<Value>.fromOpaque(pointer).takeUnretainedValue() }
        let value = make()
        pthread_setspecific(key, Unmanaged.passRetained(value).toOpaque())
        return value
    }
}
