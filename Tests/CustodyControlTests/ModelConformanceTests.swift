@testable import CustodyControl
import CustodyCore
import Foundation
import XCTest
import Yams

/// The request models of the routes against docs/openapi.yaml, read by a YAML parser: for every
/// operation with a JSON body, a body the document says is valid passes the front's checks (the
/// Swift type decodes it), and a body missing a required property or carrying a property of the
/// wrong type is refused with 400. The responses are checked against the document by
/// schemathesis on a live daemon (tests/api-fuzz.sh, `response_schema_conformance`).
final class ModelConformanceTests: XCTestCase {
    var document: [String: Any] = [:]

    override func setUpWithError() throws {
        let text = try String(contentsOfFile: OpenAPITests.documentPath, encoding: .utf8)
        document = try XCTUnwrap(try Yams.load(yaml: text) as? [String: Any])
    }

    /// A schema with its `$ref` followed and, where it offers alternatives (`oneOf`), the first
    /// one's properties and requirements merged in; of `anyOf` alternatives, the first.
    func resolve(_ schema: [String: Any]) -> [String: Any] {
        if let first = (schema["anyOf"] as? [[String: Any]])?.first { return resolve(first) }
        guard let reference = schema["$ref"] as? String, reference.hasPrefix("#/") else {
            guard let first = (schema["oneOf"] as? [[String: Any]])?.first else { return schema }
            var merged = schema
            merged["oneOf"] = nil
            merged["properties"] = (schema["properties"] as? [String: Any] ?? [:]).merging(first["properties"] as? [String: Any] ?? [:]) { $1 }
            merged["required"] = (schema["required"] as? [String] ?? []) + (first["required"] as? [String] ?? [])
            return merged
        }
        var node: Any? = document
        for key in reference.dropFirst(2).split(separator: "/") { node = (node as? [String: Any])?[String(key)] }
        return resolve(node as? [String: Any] ?? [:])
    }

    /// The schema's types, `null` left out.
    func types(_ schema: [String: Any]) -> [String] {
        let listed = (schema["type"] as? String).map { [$0] } ?? schema["type"] as? [String] ?? []
        return listed.filter { $0 != "null" }
    }

    /// A value the schema accepts: its example or first enum value, else the least its type and
    /// bounds allow; an object gets its required properties (or all of them).
    func value(_ raw: [String: Any], allProperties: Bool) -> Any {
        let schema = resolve(raw)
        if let example = schema["example"] { return example }
        if let values = schema["enum"] as? [Any], let first = values.first(where: { !($0 is NSNull) }) { return first }
        if types(schema).isEmpty, schema["type"] != nil { return NSNull() } // only null allowed
        switch types(schema).first ?? "object" {
        case "string":
            if schema["format"] as? String == "byte" || schema["contentEncoding"] as? String == "base64" { return "AAAA" }
            if let pattern = schema["pattern"] as? String, pattern.hasPrefix("^/") { return "/srv" }
            return String(repeating: "a", count: max(1, schema["minLength"] as? Int ?? 1))
        case "integer": return schema["minimum"] as? Int ?? 1
        case "number": return 1.5
        case "boolean": return true
        case "array": return [value(schema["items"] as? [String: Any] ?? [:], allProperties: allProperties)]
        default:
            let properties = schema["properties"] as? [String: Any] ?? [:]
            let required = Set(schema["required"] as? [String] ?? [])
            var object: [String: Any] = [:]
            for (name, property) in properties where allProperties || required.contains(name) {
                object[name] = value(property as? [String: Any] ?? [:], allProperties: allProperties)
            }
            return object
        }
    }

    /// A value of another JSON type than the schema allows.
    func wrongValue(_ raw: [String: Any]) -> Any? {
        let allowed = Set(types(resolve(raw)))
        if allowed.isEmpty { return nil }
        if !allowed.contains("object") { return ["x": 1] }
        if !allowed.contains("string") { return "x" }
        return nil
    }

    /// Operations with a JSON request body: method, path, body schema.
    func operationsWithBodies() -> [(String, String, [String: Any])] {
        var found: [(String, String, [String: Any])] = []
        for (path, item) in document["paths"] as? [String: Any] ?? [:] {
            for (method, operation) in item as? [String: Any] ?? [:] {
                guard let operation = operation as? [String: Any], let reference = operation["requestBody"] as? [String: Any],
                      case let body = resolve(reference),
                      let content = body["content"] as? [String: Any], let json = content["application/json"] as? [String: Any],
                      let schema = json["schema"] as? [String: Any] else { continue }
                found.append((method.uppercased(), path, resolve(schema)))
            }
        }
        return found.sorted { "\($0.0) \($0.1)" < "\($1.0) \($1.1)" }
    }

    func status(_ method: String, _ path: String, _ body: Any) -> Int {
        let concrete = path.replacingOccurrences(of: "{identity}", with: "a@b").replacingOccurrences(of: "{pid}", with: "1")
            .replacingOccurrences(of: "{id}", with: "1")
        guard let bytes = try? JSONSerialization.data(withJSONObject: body, options: [.fragmentsAllowed]) else { return -1 }
        do {
            try ControlAPI.check(HTTPRequest(method: method, path: concrete, query: [:], headers: [:], body: Array(bytes)))
            return 200
        } catch {
            return error.status
        }
    }

    func testEveryDocumentedBodyIsAcceptedAndItsViolationsRefused() throws {
        let operations = operationsWithBodies()
        XCTAssertEqual(operations.count, 28, "the document's request bodies were found")
        for (method, path, schema) in operations {
            let name = "\(method) \(path)"
            let minimal = value(schema, allProperties: false), full = value(schema, allProperties: true)
            XCTAssertEqual(status(method, path, minimal), 200, "\(name): the document's least body \(minimal) is refused")
            XCTAssertEqual(status(method, path, full), 200, "\(name): the document's fullest body \(full) is refused")
            guard let object = full as? [String: Any] else { continue }
            let properties = schema["properties"] as? [String: Any] ?? [:]
            for required in schema["required"] as? [String] ?? [] {
                var missing = object
                missing[required] = nil
                XCTAssertEqual(status(method, path, missing), 400, "\(name): accepted without the required \(required)")
            }
            for (property, propertySchema) in properties {
                guard let wrong = wrongValue(propertySchema as? [String: Any] ?? [:]) else { continue }
                var damaged = object
                damaged[property] = wrong
                XCTAssertEqual(status(method, path, damaged), 400, "\(name): accepted \(property) = \(wrong)")
            }
            XCTAssertEqual(status(method, path, [1, 2]), 400, "\(name): accepted an array for an object")
            // A field the document does not name is refused, as the document says.
            XCTAssertEqual(schema["additionalProperties"] as? Bool, false, "\(name): the document does not say unknown fields are refused")
            var unknown = object
            unknown["notAField"] = true
            XCTAssertEqual(status(method, path, unknown), 400, "\(name): accepted an unknown field")
        }
    }

    /// The other way: every field the Swift policy writes (all of them set) is in the document.
    func testThePolicyTheDaemonWritesIsTheDocumentsPolicy() throws {
        var policy = Policy()
        policy.saveToLocations = ["LocalDrive"]
        policy.openFromLocations = ["LocalDrive"]
        policy.transferExemptExecutables = ["/usr/bin/true"]
        policy.transferExemptUids = [1]
        policy.lockOnSessionLock = true
        policy.lockOnSuspend = false
        policy.lockOnLogout = true
        let written = try XCTUnwrap(try JSONSerialization.jsonObject(with: JSONEncoder().encode(policy)) as? [String: Any])
        let schema = resolve(["$ref": "#/components/schemas/Policy"])
        let documented = Set((schema["properties"] as? [String: Any] ?? [:]).keys)
        XCTAssertEqual(Set(written.keys).subtracting(documented).sorted(), [], "written but not documented")
        // And it reads back what it wrote.
        XCTAssertEqual(status("PUT", "/v1/accounts/{identity}/policy", written), 200)
    }
}
