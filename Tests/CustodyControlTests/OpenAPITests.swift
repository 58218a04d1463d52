@testable import CustodyControl
import Foundation
import XCTest

/// docs/openapi.yaml and the served routes are the same set (the live check, that each documented
/// route answers, is in IntegrationTests/ControlAPITests).
final class OpenAPITests: XCTestCase {
    static var documentPath: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/openapi.yaml").path
    }

    /// Method and path of every operation in the document (paths at two spaces, methods at four).
    static func documentedRoutes() throws -> Set<String> {
        let text = try String(contentsOfFile: documentPath, encoding: .utf8)
        var routes = Set<String>()
        var inPaths = false
        var path: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "paths:" { inPaths = true; continue }
            if inPaths, !line.isEmpty, !line.hasPrefix(" ") { break }
            guard inPaths else { continue }
            if line.hasPrefix("  /"), !line.hasPrefix("   "), line.hasSuffix(":") {
                path = String(line.dropFirst(2).dropLast())
            } else if line.hasPrefix("    "), !line.hasPrefix("     "), let path {
                let key = line.dropFirst(4).split(separator: ":").first.map(String.init) ?? ""
                if ["get", "put", "post", "delete", "patch", "head", "options"].contains(key) { routes.insert("\(key.uppercased()) \(path)") }
            }
        }
        return routes
    }

    func testEveryServedRouteIsDocumentedAndEveryDocumentedRouteIsServed() throws {
        let documented = try Self.documentedRoutes()
        let served = Set(ControlAPI.routes.map(\.description))
        XCTAssertGreaterThan(documented.count, 20, "the document parsed")
        XCTAssertEqual(served.subtracting(documented).sorted(), [], "served but not documented")
        XCTAssertEqual(documented.subtracting(served).sorted(), [], "documented but not served")
    }

    func testTheDocumentIsOpenAPI31() throws {
        let text = try String(contentsOfFile: Self.documentPath, encoding: .utf8)
        XCTAssertTrue(text.hasPrefix("openapi: 3.1"))
    }
}
