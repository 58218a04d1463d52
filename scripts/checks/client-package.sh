#!/usr/bin/env bash
# The client library is a package of its own (Client/): a program that depends on it builds with
# nothing else fetched or compiled (no server library, no dependency at all), and it gets the
# client's typed errors. A throwaway package outside the repository depends on Client/ by path,
# builds offline, and runs against a socket that is not there.
# Usage: client-package.sh [SWIFT]
set -euo pipefail
cd "$(dirname "$0")/../.."
swift=${1:-swift}
root=$(pwd)
work=$(mktemp -d /tmp/custody-client-consumer.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "client-package: FAIL: $*" >&2; exit 1; }

mkdir -p "$work/Sources/probe"
cat > "$work/Package.swift" <<SWIFT
// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "probe",
    dependencies: [.package(path: "$root/Client")],
    targets: [.executableTarget(name: "probe", dependencies: [.product(name: "CustodyClient", package: "Client")])]
)
SWIFT
cat > "$work/Sources/probe/main.swift" <<'SWIFT'
import CustodyClient
import Glibc

// Asks a daemon that is not there: the answer is the client's typed error, not a crash.
let manager = FileProtectionManager(client: ControlClient(socketPath: CommandLine.arguments[1]))
do {
    _ = try await manager.isFileEncrypted("/tmp/anything")
    print("an answer from no daemon")
    exit(1)
} catch {
    guard case .cannotConnect(let path, let errno) = error, path == CommandLine.arguments[1], errno == ENOENT else {
        print("another error: \(error)")
        exit(1)
    }
    print("typed error: \(error)")
}
SWIFT

start=$(date +%s.%N)
"$swift" build --package-path "$work" --disable-automatic-resolution > "$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; fail "the consumer package does not build"; }
seconds=$(echo "$(date +%s.%N) - $start" | bc)
# Nothing fetched: no checkout, no pin.
if [ -d "$work/.build/checkouts" ] && [ -n "$(ls -A "$work/.build/checkouts")" ]; then
    fail "building against Client/ fetched: $(ls "$work/.build/checkouts" | tr '\n' ' ')"
fi
if [ -f "$work/Package.resolved" ] && grep -q '"identity"' "$work/Package.resolved"; then
    fail "Package.resolved pins packages: $(grep '"identity"' "$work/Package.resolved" | tr -d ' \n')"
fi
# Nothing of the daemon compiled: only the client's modules and the probe.
modules=$(find "$work/.build/debug/Modules" -maxdepth 1 -name '*.swiftmodule' -printf '%f\n' 2>/dev/null | sort | tr '\n' ' ')
[ "$modules" = "CustodyAPI.swiftmodule CustodyClient.swiftmodule probe.swiftmodule " ] || fail "modules built: $modules"
output=$("$work/.build/debug/probe" "$work/no-such.sock") || fail "the probe failed: $output"
echo "client-package: a program using CustodyClient built in ${seconds%.*} s with nothing fetched; $output"
