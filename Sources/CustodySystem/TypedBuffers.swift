/// `Array.withUnsafeBytes` is `rethrows`, which erases a typed error to `any Error`. These keep the
/// closure's error type, so code that throws `Errno`, `CryptoError` or `FormatError` stays typed.
extension Array {
    @inlinable
    public func withBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let result: Result<R, E> = withUnsafeBytes { bytes in
            do throws(E) { return .success(try body(bytes)) } catch { return .failure(error) }
        }
        return try result.get()
    }

    @inlinable
    public mutating func withMutableBytes<R, E: Error>(_ body: (UnsafeMutableRawBufferPointer) throws(E) -> R) throws(E) -> R {
        let result: Result<R, E> = withUnsafeMutableBytes { bytes in
            do throws(E) { return .success(try body(bytes)) } catch { return .failure(error) }
        }
        return try result.get()
    }
}
