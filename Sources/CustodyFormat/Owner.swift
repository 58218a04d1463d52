import CustodySystem

/// A file's owner identity: the canonical form used to match (case-folded) and the spelling to show.
public struct Owner: Equatable, Hashable, Sendable, CustomStringConvertible {
    /// Longest UTF-8 encoding of either form that the header holds.
    public static let maxLength = 180

    public let canonical: String
    public let display: String

    /// An owner from the spelling a caller used; the canonical form is its lowercase.
    public init(_ display: String) throws(FormatError) {
        let trimmed = display.trimmingWhitespace()
        try self.init(canonical: trimmed.foldedIdentity(), display: trimmed)
    }

    /// An owner with both forms given (as read from a header).
    public init(canonical: String, display: String) throws(FormatError) {
        try Self.validate(canonical, as: "canonical form")
        try Self.validate(display, as: "display form")
        self.canonical = canonical
        self.display = display
    }

    private static func validate(_ value: String, as name: String) throws(FormatError) {
        if value.isEmpty { throw .invalidOwner("the \(name) is empty") }
        if value.utf8.count > maxLength {
            throw .invalidOwner("the \(name) is \(value.utf8.count) bytes; at most \(maxLength)")
        }
        if value.utf8.contains(0) { throw .invalidOwner("the \(name) contains a NUL byte") }
    }

    public var description: String { display }

    /// Case-insensitive identity: two owners match when their canonical forms do.
    public func matches(_ other: Owner) -> Bool { canonical == other.canonical }
}
