/// `Array.withUnsafeBytes` is `rethrows`, which erases a typed error to `any Error`. These keep the
/// closure's error type, so code that throws `Errno`, `CryptoError` or `FormatError` stays typed.
extension Array {
    // Through the buffer-pointer forms, which keep a typed error: no `Result` in between, whose
    // generic payload would be handled through metadata looked up at run time on every call.
    @inlinable
    public func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try withUnsafeBufferPointer { (buffer) throws(E) -> R in try body(UnsafeRawBufferPointer(buffer)) }
    }

    @inlinable
    public mutating func withMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try withUnsafeMutableBufferPointer { (buffer) throws(E) -> R in try body(UnsafeMutableRawBufferPointer(buffer)) }
    }
}
