import FoundationEssentials

/// Request bodies decoded strictly: a key that the document's type does not read is refused, not
/// ignored, so that a misspelt field ("saveToLocation") cannot be taken as its absence ("every
/// location"). The body is decoded as its type asks for it, field by field, and every key each of
/// its objects holds is checked against the keys the type asked that object for, present or not;
/// the refusal names the key and, when one is close, the key it resembles.
public enum StrictJSON {
    /// A key no field reads.
    public struct UnknownKey: Error, Equatable, CustomStringConvertible {
        /// Where it is, dotted (`policy.saveToLocation`, `locations[2].kind`).
        public let path: String
        /// The key the type reads there that it resembles, if one is close.
        public let suggestion: String?

        public init(path: String, suggestion: String?) {
            self.path = path
            self.suggestion = suggestion
        }

        public var description: String {
            "unknown field \(path)" + (suggestion.map { " (did you mean \($0)?)" } ?? "")
        }
    }

    /// Decodes `type` from the JSON `bytes`; throws `UnknownKey` for a key it does not read, and
    /// `DecodingError` as `JSONDecoder` does for the rest.
    public static func decode<T: Decodable>(_ type: T.Type, from bytes: [UInt8]) throws -> T {
        let value = try JSONDecoder().decode(JSONValue.self, from: Data(bytes))
        let asked = AskedKeys()
        let decoded = try T(from: ValueDecoder(value: value, codingPath: [], asked: asked))
        if let unknown = asked.firstUnknown(in: value, at: "") { throw unknown }
        return decoded
    }
}

/// The keys a decoding asked each object for, by the object's path.
private final class AskedKeys {
    struct Object {
        var keys: Set<String> = []
        /// The type took every key as data (a dictionary): none is unknown.
        var takesAll = false
    }
    var objects: [String: Object] = [:]

    static func path(_ codingPath: [CodingKey]) -> String {
        codingPath.map { $0.intValue.map { "[\($0)]" } ?? "." + $0.stringValue }.joined()
    }

    func asked(_ key: String, at codingPath: [CodingKey]) { objects[Self.path(codingPath), default: Object()].keys.insert(key) }
    func tookAll(at codingPath: [CodingKey]) { objects[Self.path(codingPath), default: Object()].takesAll = true }
    func visited(_ codingPath: [CodingKey]) { _ = objects[Self.path(codingPath), default: Object()] }

    /// The first key of `value` (walked in key order) that its object's decoding did not ask for.
    /// An object the decoding never opened as one (a field kept as raw JSON) is not looked into.
    func firstUnknown(in value: JSONValue, at path: String) -> StrictJSON.UnknownKey? {
        switch value {
        case .object(let members):
            guard let object = objects[path] else { return nil }
            for key in members.keys.sorted() {
                let childPath = path + "." + key
                if !object.takesAll, !object.keys.contains(key) {
                    return StrictJSON.UnknownKey(path: String(childPath.dropFirst()), suggestion: Spelling.closest(to: key, in: object.keys))
                }
                if let member = members[key], let unknown = firstUnknown(in: member, at: childPath) { return unknown }
            }
            return nil
        case .array(let elements):
            for (index, element) in elements.enumerated() {
                if let unknown = firstUnknown(in: element, at: path + "[\(index)]") { return unknown }
            }
            return nil
        default:
            return nil
        }
    }
}

private struct IndexKey: CodingKey {
    let intValue: Int?
    var stringValue: String { "\(intValue ?? 0)" }
    init(_ index: Int) { intValue = index }
    init?(stringValue: String) { return nil }
    init?(intValue: Int) { self.intValue = intValue }
}

private struct ValueDecoder: Decoder {
    let value: JSONValue
    let codingPath: [CodingKey]
    let asked: AskedKeys
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func mismatch(_ type: Any.Type, _ what: String) -> DecodingError {
        .typeMismatch(type, DecodingError.Context(codingPath: codingPath, debugDescription: "expected \(what)"))
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .object(let members) = value else { throw mismatch([String: Any].self, "an object") }
        asked.visited(codingPath)
        return KeyedDecodingContainer(KeyedValues<Key>(members: members, codingPath: codingPath, asked: asked))
    }

    func unkeyedContainer() throws -> UnkeyedDecodingContainer {
        guard case .array(let elements) = value else { throw mismatch([Any].self, "an array") }
        return UnkeyedValues(elements: elements, codingPath: codingPath, asked: asked)
    }

    func singleValueContainer() throws -> SingleValueDecodingContainer { SingleValue(decoder: self) }
}

private struct KeyedValues<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let members: [String: JSONValue]
    let codingPath: [CodingKey]
    let asked: AskedKeys

    var allKeys: [Key] {
        asked.tookAll(at: codingPath)
        return members.keys.compactMap { Key(stringValue: $0) }
    }

    func contains(_ key: Key) -> Bool {
        asked.asked(key.stringValue, at: codingPath)
        return members[key.stringValue] != nil
    }

    func child(_ key: Key) throws -> ValueDecoder {
        asked.asked(key.stringValue, at: codingPath)
        guard let value = members[key.stringValue] else {
            throw DecodingError.keyNotFound(key, DecodingError.Context(codingPath: codingPath, debugDescription: "missing field \(key.stringValue)"))
        }
        return ValueDecoder(value: value, codingPath: codingPath + [key], asked: asked)
    }

    func decodeNil(forKey key: Key) throws -> Bool { try child(key).value == .null }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try T(from: child(key)) }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try Bool(from: child(key)) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try String(from: child(key)) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try Double(from: child(key)) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try Float(from: child(key)) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try Int(from: child(key)) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try Int8(from: child(key)) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try Int16(from: child(key)) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try Int32(from: child(key)) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try Int64(from: child(key)) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try UInt(from: child(key)) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try UInt8(from: child(key)) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try UInt16(from: child(key)) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try UInt32(from: child(key)) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try UInt64(from: child(key)) }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try child(key).container(keyedBy: type)
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> UnkeyedDecodingContainer { try child(key).unkeyedContainer() }
    func superDecoder() throws -> Decoder {
        ValueDecoder(value: .object(members), codingPath: codingPath, asked: asked)
    }
    func superDecoder(forKey key: Key) throws -> Decoder { try child(key) }
}

private struct UnkeyedValues: UnkeyedDecodingContainer {
    let elements: [JSONValue]
    let codingPath: [CodingKey]
    let asked: AskedKeys
    var currentIndex = 0

    init(elements: [JSONValue], codingPath: [CodingKey], asked: AskedKeys) {
        self.elements = elements
        self.codingPath = codingPath
        self.asked = asked
    }

    var count: Int? { elements.count }
    var isAtEnd: Bool { currentIndex >= elements.count }

    mutating func next() throws -> ValueDecoder {
        guard currentIndex < elements.count else {
            throw DecodingError.valueNotFound(Any.self, DecodingError.Context(codingPath: codingPath, debugDescription: "the array has no more elements"))
        }
        defer { currentIndex += 1 }
        return ValueDecoder(value: elements[currentIndex], codingPath: codingPath + [IndexKey(currentIndex)], asked: asked)
    }

    mutating func decodeNil() throws -> Bool {
        guard currentIndex < elements.count, elements[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: next()) }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next().container(keyedBy: type)
    }
    mutating func nestedUnkeyedContainer() throws -> UnkeyedDecodingContainer { try next().unkeyedContainer() }
    mutating func superDecoder() throws -> Decoder { try next() }
}

private struct SingleValue: SingleValueDecodingContainer {
    let decoder: ValueDecoder
    var codingPath: [CodingKey] { decoder.codingPath }

    func decodeNil() -> Bool { decoder.value == .null }

    func decode(_ type: Bool.Type) throws -> Bool {
        guard case .bool(let value) = decoder.value else { throw decoder.mismatch(type, "true or false") }
        return value
    }

    func decode(_ type: String.Type) throws -> String {
        guard case .string(let value) = decoder.value else { throw decoder.mismatch(type, "a string") }
        return value
    }

    func decode(_ type: Double.Type) throws -> Double {
        guard case .number(let value) = decoder.value else { throw decoder.mismatch(type, "a number") }
        return value
    }

    func decode(_ type: Float.Type) throws -> Float { Float(try decode(Double.self)) }

    func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        guard case .number(let value) = decoder.value, value == value.rounded(), let exact = I(exactly: value) else {
            throw decoder.mismatch(type, "an integer from \(I.min) to \(I.max)")
        }
        return exact
    }

    func decode(_ type: Int.Type) throws -> Int { try integer(type) }
    func decode(_ type: Int8.Type) throws -> Int8 { try integer(type) }
    func decode(_ type: Int16.Type) throws -> Int16 { try integer(type) }
    func decode(_ type: Int32.Type) throws -> Int32 { try integer(type) }
    func decode(_ type: Int64.Type) throws -> Int64 { try integer(type) }
    func decode(_ type: UInt.Type) throws -> UInt { try integer(type) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try integer(type) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try integer(type) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try integer(type) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try integer(type) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try T(from: decoder) }
}
