// swift-tools-version:6.1
import PackageDescription

// A file-provider flow on Linux, written as the iOS code that uses the Intune App SDK would be:
// it depends on the client package alone (`../../Client`), as a developer's package would.
let package = Package(
    name: "file-provider-example",
    dependencies: [.package(path: "../../Client")],
    targets: [
        .executableTarget(name: "file-provider-example", dependencies: [.product(name: "CustodyClient", package: "Client")]),
    ]
)
