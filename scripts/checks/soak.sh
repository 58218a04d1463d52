#!/usr/bin/env bash
# `make soak` (not in `make test`): the test classes that mount, serve and end mounts, run again
# and again, each round in fresh temporary directories and state, to find what fails one run in
# many. A failure is reported with its test, its assertions and the round's whole log; after each
# round nothing of it may be left (no custody mount, no custodyd). A flake is a bug to fix, not a
# round to retry.
#
# Usage: soak.sh [ROUNDS]   ROUNDS defaults to SOAK_ROUNDS or 20.
# SOAK_CLASSES: a --filter regex of the classes (default below); CUSTODY_STRESS_ROUNDS: the
# unmount stress test's rounds per soak round (default 20, so 20 soak rounds end 400 mounts).
set -uo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-${SOAK_ROUNDS:-20}}
classes=${SOAK_CLASSES:-'IntegrationTests\.(DaemonLifecycleTests|RequestRingTests|UnmountStressTests|FairnessTests|PassthroughOperationTests|ProtectedMountTests|RandomizedOperationTests|WorkloadTests|MultiUserTests|LockMountTests|SetIDBitTests|SpeedFeatureTests|GuardTests|LocationTests|EncryptedNameTests|FormatUpgradeTests|WipeTests)'}
export CI=true
export CUSTODY_STRESS_ROUNDS=${CUSTODY_STRESS_ROUNDS:-20}
logs=.build/soak/$(date +%Y%m%d-%H%M%S)
mkdir -p "$logs"

swift build --build-tests >"$logs/build.log" 2>&1 || { echo "soak: the build failed: $logs/build.log" >&2; exit 1; }

# custody mounts and daemons that exist now, to tell a round's leftovers from what was there.
custody_mounts() { awk '$3 == "fuse.custody" { print $2 }' /proc/mounts | sort; }
daemons() { pgrep -x custodyd | sort || true; }
mounts_before=$(custody_mounts)
daemons_before=$(daemons)

failed=0
started=$(date +%s)
for round in $(seq 1 "$rounds"); do
    log="$logs/round-$round.log"
    round_start=$(date +%s)
    if swift test --skip-build --disable-swift-testing --filter "$classes" >"$log" 2>&1; then
        outcome=passed
    else
        outcome=FAILED
        failed=$((failed + 1))
    fi
    left=$(comm -13 <(echo "$mounts_before") <(custody_mounts))
    running=$(comm -13 <(echo "$daemons_before") <(daemons))
    if [ -n "$left" ] || [ -n "$running" ]; then
        [ "$outcome" = passed ] && failed=$((failed + 1))
        outcome="FAILED (left behind: mounts [$left] daemons [$running])"
    fi
    tests=$(grep -cE "^Test Case .* (passed|failed) \(" "$log" || true)
    echo "soak round $round/$rounds: $outcome, $tests tests, $(( $(date +%s) - round_start )) s"
    if [ "$outcome" != passed ]; then
        grep -E "^Test Case .* failed \(|error: " "$log" | head -40 | sed 's/^/    /'
        echo "    log: $log"
    fi
done
echo "soak: $((rounds - failed)) of $rounds rounds passed in $(( ($(date +%s) - started) / 60 )) min (classes: $classes; logs: $logs)"
[ "$failed" -eq 0 ]
