// swift-tools-version:6.1
import PackageDescription

// The client library on its own: what a program needs to speak to custodyd over its control
// socket, and nothing of the daemon (no FUSE, no crypto, no server libraries). A developer depends
// on this folder (`.package(path: "…/Client")`); the daemon's package depends on it too.
let package = Package(
    name: "CustodyClient",
    products: [
        .library(name: "CustodyClient", targets: ["CustodyClient", "CustodyAPI"]),
        .library(name: "CustodyAPI", targets: ["CustodyAPI"]),
    ],
    targets: [
        // The control API's routes and documents, shared by the daemon, the client library and
        // custodyctl (no dependencies: a client depends on nothing else to speak it).
        .target(name: "CustodyAPI"),
        // The client library: the SDK's managers over the control socket (no crypto, no FUSE).
        .target(name: "CustodyClient", dependencies: ["CustodyAPI"]),
        .testTarget(name: "CustodyClientTests", dependencies: ["CustodyClient", "CustodyAPI"]),
    ]
)
