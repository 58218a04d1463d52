// swift-tools-version:6.1
import PackageDescription

// The client package's products (`Client/`), as the daemon's targets name them.
let api: Target.Dependency = .product(name: "CustodyAPI", package: "Client")
let client: Target.Dependency = .product(name: "CustodyClient", package: "Client")

let package = Package(
    name: "Custody",
    products: [
        .executable(name: "custodyd", targets: ["custodyd"]),
        .executable(name: "custodyctl", targets: ["custodyctl"]),
    ],
    dependencies: [
        // The client library and the control API's documents, a package of their own (`Client/`)
        // so that a program using them builds without anything the daemon needs.
        .package(path: "Client"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/LebJe/TOMLKit", from: "0.6.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        // Tests only: reads docs/openapi.yaml to check the routes' models against it.
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
    ],
    targets: [
        // System-library and C shims.
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        .target(name: "CLinux"),
        // The system's libcrypto (OpenSSL 3, libssl-dev) through EVP: AES-256-GCM with keyed
        // contexts reused per thread, SHA-256, random numbers.
        .target(name: "COpenSSL", linkerSettings: [.linkedLibrary("crypto")]),
        // FUSE over io_uring for a libfuse 3.14 session (liburing-dev): per-CPU request rings.
        .target(name: "CFuseRing", linkerSettings: [.linkedLibrary("uring"), .linkedLibrary("fuse3")]),
        // tpm2-tss (ESAPI) calls for sealing a secret to a TPM 2.0 (libtss2-dev).
        .target(name: "CTPM", linkerSettings: [.linkedLibrary("tss2-esys"), .linkedLibrary("tss2-tctildr"),
                                               .linkedLibrary("tss2-mu"), .linkedLibrary("tss2-rc")]),

        // Typed wrappers over the syscalls (Errno, *at calls, xattrs, mount table).
        .target(name: "CustodySystem", dependencies: ["CLinux"]),
        // AEAD, key wrap, KDFs, X25519, secure memory.
        .target(name: "CustodyCrypto", dependencies: ["COpenSSL", "CSodium", "CustodySystem"]),
        // The self-describing file format: header codec, block math, random-access protected files.
        .target(name: "CustodyFormat", dependencies: ["CustodyCrypto", "CustodySystem"]),
        // The machine's TPM 2.0: sealing and unsealing the machine key (the engine sees it as a MachineKeySealer).
        .target(name: "CustodyTPM", dependencies: ["CTPM", "CustodyCrypto"]),
        // The engine: accounts, policy, identity resolution, keybags, locks, events. No FUSE, no HTTP.
        .target(name: "CustodyCore", dependencies: ["CustodyFormat", "CustodyCrypto", "CustodySystem"]),
        // The control socket: HTTP/1.1 + JSON over a Unix socket (docs/api.md); the front that faces
        // clients speaks HTTP with SwiftNIO (NIOHTTP1).
        .target(name: "CustodyControl", dependencies: ["CLinux", api, "CustodyCore", "CustodyFormat", "CustodyCrypto", "CustodySystem",
                                                       .product(name: "NIOCore", package: "swift-nio"),
                                                       .product(name: "NIOPosix", package: "swift-nio"),
                                                       .product(name: "NIOEmbedded", package: "swift-nio"),
                                                       .product(name: "NIOHTTP1", package: "swift-nio")]),
        // What the daemon counts (requests, bytes, locks, jobs, tampering), rendered in the
        // Prometheus text format (swift-prometheus).
        .target(name: "CustodyMetrics", dependencies: ["CustodyCore", "CustodySystem", .product(name: "Prometheus", package: "swift-prometheus")]),
        // The low-level FUSE front end: inodes, handles, the passthrough.
        .target(name: "CustodyFUSE", dependencies: ["CFuse3", "CFuseRing", "CustodyCore", "CustodyFormat", "CustodyCrypto", "CustodySystem", "CustodyMetrics",
                                                   .product(name: "Logging", package: "swift-log")]),

        // The guard: every process that read a managed identity's data saves only where that
        // identity's policy allows (fanotify permission events, process events).
        .target(name: "CustodyGuard", dependencies: ["CLinux", "CustodyCore", "CustodySystem"]),

        // Login sessions (systemd-logind over D-Bus, sd-bus) driving the engine's locks.
        .target(name: "CustodySessions", dependencies: ["CSystemd", "CustodyCore", "CustodySystem"]),

        // The daemon's configuration file (custody.toml): typed, checked, with line numbers in errors.
        .target(name: "CustodyConfig", dependencies: [api, "CustodyCore", "CustodyFormat", "CustodySystem", .product(name: "TOMLKit", package: "TOMLKit")]),

        .executableTarget(name: "custodyctl", dependencies: [
            "CLinux", "CSystemd", api, client, "CustodyCrypto", "CustodySystem",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
        ]),
        .executableTarget(name: "custodyd", dependencies: [
            "CustodyFUSE", "CustodyGuard", "CustodyControl", "CustodyCore", "CustodyFormat", "CustodySystem", "CustodyConfig", "CustodyCrypto", "CustodySessions", "CustodyTPM", "CustodyMetrics",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ]),

        // What the tests share (as swift-nio's NIOTestUtils): temporary directories, one
        // `eventually`, a seeded generator, a process table the test controls. Not a product.
        .target(name: "CustodyTestSupport", dependencies: ["CustodyCore", "CustodySystem"]),

        // libFuzzer target for the format (see `make fuzz`); an ordinary build replays inputs.
        .executableTarget(name: "custody-fuzz", dependencies: ["CustodyFormat", "CustodyCrypto"]),
        // libFuzzer target for the control plane's input (see `make fuzz-http`); an ordinary build replays inputs.
        .executableTarget(name: "custody-fuzz-http", dependencies: ["CustodyControl"]),
        // Throughput of the format (see `make bench-format`).
        .executableTarget(name: "custody-format-bench", dependencies: ["CustodyFormat", "CustodyCrypto", "CustodySystem"]),

        .testTarget(name: "CustodySystemTests", dependencies: ["CustodyTestSupport", "CustodySystem"]),
        .testTarget(name: "CustodyCryptoTests", dependencies: ["CustodyTestSupport", "CustodyCrypto", "CustodySystem"]),
        .testTarget(name: "CustodyFormatTests", dependencies: ["CustodyTestSupport", "CustodyFormat", "CustodyCrypto", "CustodySystem"],
                    exclude: ["Fixtures"]),
        .testTarget(name: "CustodyCoreTests", dependencies: ["CustodyTestSupport", "CustodyCore", "CustodyFormat", "CustodyCrypto", "CustodySystem"]),
        .testTarget(name: "CustodyFUSETests", dependencies: ["CustodyTestSupport", "CustodyFUSE", "CustodySystem"]),
        .testTarget(name: "IntegrationTests", dependencies: ["CustodyTestSupport", "CustodyCore", "CustodyFormat", "CustodySystem", client, "CustodyTPM"]),
        .testTarget(name: "CustodyControlTests", dependencies: ["CustodyTestSupport", "CustodyControl", api, "CustodyCore", client, "CLinux",
                                                                .product(name: "NIOCore", package: "swift-nio"),
                                                                .product(name: "NIOEmbedded", package: "swift-nio"),
                                                                .product(name: "NIOHTTP1", package: "swift-nio"),
                                                                .product(name: "Yams", package: "Yams")]),
        .testTarget(name: "CustodyTPMTests", dependencies: ["CustodyTestSupport", "CustodyTPM", "CustodyCrypto"]),
        .testTarget(name: "CustodyGuardTests", dependencies: ["CustodyTestSupport", "CustodyGuard", "CustodyCore", "CustodySystem", "CLinux"]),
        .testTarget(name: "CustodySessionsTests", dependencies: ["CustodyTestSupport", "CustodySessions", "CustodyCore"]),
        .testTarget(name: "CustodyMetricsTests", dependencies: ["CustodyTestSupport", "CustodyMetrics", "CustodyCore"]),
        .testTarget(name: "CustodyConfigTests", dependencies: ["CustodyTestSupport", "CustodyConfig", "CustodyCore", "CustodyFormat"]),
    ]
)
