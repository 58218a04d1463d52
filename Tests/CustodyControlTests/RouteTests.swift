import CustodyAPI
@testable import CustodyControl
import Foundation
import XCTest

final class RouteTests: XCTestCase {
    func testPatternsMatchSegmentsAndCaptureParameters() {
        let route = Endpoint("POST", "/v1/accounts/{identity}/lock")
        XCTAssertEqual(route.match("/v1/accounts/alice@contoso.com/lock"), ["identity": "alice@contoso.com"])
        XCTAssertEqual(route.match("/v1/accounts/alice@contoso.com/lock/"), ["identity": "alice@contoso.com"])
        XCTAssertNil(route.match("/v1/accounts//lock"))
        XCTAssertNil(route.match("/v1/accounts/alice/unlock"))
        XCTAssertNil(route.match("/v1/accounts/alice"))
        XCTAssertNil(route.match("v1/accounts/alice/lock"))
        XCTAssertEqual(Endpoint("GET", "/v1/status").match("/v1/status"), [:])
    }

    /// The endpoints clients name (CustodyAPI) are the routes the daemon serves, one for one.
    func testClientsNameExactlyTheServedRoutes() {
        XCTAssertEqual(ControlAPI.routes, Endpoint.all)
    }

    func testPathsEscapeTheirParameterAndQuery() {
        XCTAssertEqual(Endpoint.lock.path("alice@contoso.com"), "/v1/accounts/alice@contoso.com/lock")
        XCTAssertEqual(Endpoint.account.path("a/b c"), "/v1/accounts/a%2Fb%20c")
        XCTAssertEqual(Endpoint.deregister.path("bob", query: [("wipe", "true"), ("wait", "false")]), "/v1/accounts/bob?wipe=true&wait=false")
        XCTAssertEqual(Endpoint.locations.path(query: [("account", "x&y")]), "/v1/locations?account=x%26y")
        XCTAssertEqual(Endpoint.status.path(), "/v1/status")
        // What a client builds, the daemon's match reads back.
        XCTAssertEqual(Endpoint.lock.match(Endpoint.lock.path("a/b é")), ["identity": "a/b é"])
    }

    func testEveryRouteIsUniqueAndVersioned() {
        let routes = ControlAPI.routes
        XCTAssertEqual(Set(routes).count, routes.count)
        for route in routes { XCTAssertTrue(route.pattern.hasPrefix("/v1/"), "\(route)") }
    }
    /// docs/api.md's route table and the served table agree, route for route, on who may call:
    /// the table a reader trusts is the one the daemon enforces.
    func testTheDocumentedRouteTableIsTheServedOne() throws {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/api.md").path
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let section = try XCTUnwrap(text.components(separatedBy: "\n## Routes\n").last)
        var documented: [String: String] = [:]
        for line in section.split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count > 3 else { continue }
            let route = cells[1].trimmingCharacters(in: CharacterSet(charactersIn: "`"))
            XCTAssertNil(documented[route], "\(route) is documented twice")
            documented[route] = cells[2]
        }
        let served = Dictionary(uniqueKeysWithValues: ControlAPI.table.map { ("\($0.endpoint)", $0.access.rawValue) })
        XCTAssertEqual(Set(documented.keys), Set(served.keys), "the same routes")
        for (route, access) in served {
            XCTAssertEqual(documented[route], access, "who may call \(route)")
        }
        // Every route that is the administrators' alone says what a refused caller may not do.
        for route in ControlAPI.table where route.access == .admin || route.access == .accountOwner {
            XCTAssertFalse(route.action.isEmpty, "\(route.endpoint) names its action")
        }
    }
}
