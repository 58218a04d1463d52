@testable import CustodyControl
import XCTest

final class RouteTests: XCTestCase {
    func testPatternsMatchSegmentsAndCaptureParameters() {
        let route = RouteSpec("POST", "/v1/accounts/{identity}/lock")
        XCTAssertEqual(route.match("/v1/accounts/alice@contoso.com/lock"), ["identity": "alice@contoso.com"])
        XCTAssertEqual(route.match("/v1/accounts/alice@contoso.com/lock/"), ["identity": "alice@contoso.com"])
        XCTAssertNil(route.match("/v1/accounts//lock"))
        XCTAssertNil(route.match("/v1/accounts/alice/unlock"))
        XCTAssertNil(route.match("/v1/accounts/alice"))
        XCTAssertNil(route.match("v1/accounts/alice/lock"))
        XCTAssertEqual(RouteSpec("GET", "/v1/status").match("/v1/status"), [:])
    }

    func testEveryRouteIsUniqueAndVersioned() {
        let routes = ControlAPI.routes
        XCTAssertEqual(Set(routes).count, routes.count)
        for route in routes { XCTAssertTrue(route.pattern.hasPrefix("/v1/"), "\(route)") }
    }
}
