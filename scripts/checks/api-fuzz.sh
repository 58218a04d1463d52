#!/usr/bin/env bash
# schemathesis against a live custodyd, driven by docs/openapi.yaml: a bounded run (examples,
# coverage, fuzzing and stateful phases) that must find no 5xx, no undocumented status, no answer
# that breaks the schema, 405 with Allow for methods a route does not serve, and leave the daemon,
# its control front and its mount alive and serving.
#
# It runs twice: as a non-root member of the daemon's admin group (so admin routes are reached,
# while file routes act with that user's harmless credentials), then as an ordinary user (every
# refusal such a user meets must be in the schema too). schemathesis speaks TCP, so socat, running
# as that user, bridges a loopback port to the Unix socket; the daemon sees the user's credentials
# on every connection. Every process started here is stopped by PID on exit.
#
# The schema states what the daemon enforces: a request the schema allows must not be refused
# for its content (positive_data_acceptance), and one it forbids must be (negative_data_rejection).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.build/debug}
EXAMPLES=${API_FUZZ_EXAMPLES:-40}
# A fixed seed by default, so a run is repeatable; API_FUZZ_SEED=$RANDOM explores further.
SEED=${API_FUZZ_SEED:-1}
fail() { echo "api-fuzz: FAIL: $*" >&2; exit 1; }

# The script pip installed beside the python3 on the PATH (make pip-deps), else any on the PATH.
SCHEMATHESIS=$(python3 -c 'import os, sys; print(os.path.join(os.path.dirname(sys.executable), "schemathesis"))')
[ -x "$SCHEMATHESIS" ] || SCHEMATHESIS=$(command -v schemathesis) || fail "schemathesis is not installed (make pip-deps)"

GROUP=custody-fuzzers ADMIN_NAME=custody-fuzz USER_NAME=custody-fuzz-user
getent group "$GROUP" >/dev/null || groupadd --system "$GROUP"
id "$ADMIN_NAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin -G "$GROUP" "$ADMIN_NAME"
id "$USER_NAME" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$USER_NAME"

WORK=$(mktemp -d /tmp/custody-api-fuzz.XXXXXX)
chmod 0755 "$WORK"
mkdir -p "$WORK/backing" "$WORK/mnt"
DAEMON= BRIDGE=
cleanup() {
    [ -n "$BRIDGE" ] && kill "$BRIDGE" 2>/dev/null && wait "$BRIDGE" 2>/dev/null || true
    if mountpoint -q "$WORK/mnt"; then fusermount3 -u "$WORK/mnt" || fusermount3 -uz "$WORK/mnt" || true; fi
    if [ -n "$DAEMON" ]; then
        for _ in $(seq 100); do kill -0 "$DAEMON" 2>/dev/null || break; sleep 0.1; done
        kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/custodyd" --state "$WORK/state" --socket "$WORK/control.sock" --socket-mode 0666 --admin-group "$GROUP" \
    --multi-identity --lock-grace-period 0 "$WORK/backing" "$WORK/mnt" 2>"$WORK/custodyd.log" &
DAEMON=$!
for _ in $(seq 150); do mountpoint -q "$WORK/mnt" && [ -S "$WORK/control.sock" ] && break; sleep 0.1; done
mountpoint -q "$WORK/mnt" || fail "custodyd did not mount: $(cat "$WORK/custodyd.log")"

# A plain file in the mount, read back at the end.
echo "before the fuzzer" > "$WORK/mnt/canary"

# Runs schemathesis as user $1 through a bridge of its own.
fuzz_as() {
    local who=$1
    # A free loopback port for the bridge.
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    setpriv --reuid="$who" --regid="$who" --init-groups \
        socat "TCP-LISTEN:$PORT,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$WORK/control.sock" &
    BRIDGE=$!
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/v1/status" >/dev/null && break; sleep 0.1; done
    curl -sf "http://127.0.0.1:$PORT/v1/status" >/dev/null || fail "the bridge does not answer"
    echo "api-fuzz: schemathesis as $who, $EXAMPLES examples per operation, seed $SEED"
    local status=0
    timeout 300 "$SCHEMATHESIS" --config-file scripts/checks/schemathesis.toml run docs/openapi.yaml \
        --url "http://127.0.0.1:$PORT" --checks all \
        --phases examples,coverage,fuzzing,stateful --max-examples "$EXAMPLES" --seed "$SEED" \
        --continue-on-failure --no-color >"$WORK/schemathesis-$who.log" 2>&1 || status=$?
    kill "$BRIDGE" 2>/dev/null && wait "$BRIDGE" 2>/dev/null || true
    BRIDGE=
    if [ "$status" != 0 ]; then
        cat "$WORK/schemathesis-$who.log"
        echo "api-fuzz: schemathesis as $who found failures (exit $status; replay with API_FUZZ_SEED=$SEED)" >&2
        FAILED="$FAILED $who"
    fi
    grep -E "passed|failed|error" "$WORK/schemathesis-$who.log" | tail -1
}
FAILED=
fuzz_as "$USER_NAME"
fuzz_as "$ADMIN_NAME"
[ -z "$FAILED" ] || fail "schemathesis found failures as:$FAILED"

# Everything is still there: the daemon, the front it started (never restarted), the mount.
kill -0 "$DAEMON" 2>/dev/null || fail "the daemon died: $(cat "$WORK/custodyd.log")"
if grep -q "control front (pid" "$WORK/custodyd.log"; then fail "the control front died: $(cat "$WORK/custodyd.log")"; fi
code=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$WORK/control.sock" http://localhost/v1/status)
[ "$code" = 200 ] || fail "status answers $code after the run"
mountpoint -q "$WORK/mnt" || fail "the mount is gone"
# Read and written as one unmanaged identity, not as root: the fuzzer may have enrolled accounts
# for root's uid, whose processes then act as them, with policies that refuse plain data or keys
# that are locked (a root `cat` of the canary is then refused, rightly).
as_unmanaged() { "$BIN/custodyctl" run --socket "$WORK/control.sock" --identity canary@unmanaged.example -- "$@"; }
# The fuzzer is an administrator: it may give the mount's files an owner (the mount point is in
# the status), whose policy then decides who reads them, and wipe that owner, which deletes them.
# Gone is fine after a wipe, unreadable only with an owner; changed never.
if [ -e "$WORK/mnt/canary" ]; then
    if content=$(as_unmanaged cat "$WORK/mnt/canary" 2>&1); then
        [ "$content" = "before the fuzzer" ] || fail "the canary file changed: $content"
    else
        info=$(curl -s --unix-socket "$WORK/control.sock" -X POST --data-binary "{\"path\": \"$WORK/mnt/canary\"}" http://localhost/v1/files/info)
        echo "$info" | grep -q '"owner":"' || fail "the canary cannot be read ($content) and has no owner: $info"
        echo "api-fuzz: the canary was given an owner whose policy keeps it from others: $info"
    fi
else
    grep -q "wipeFinished" "$WORK/custodyd.log" || fail "the canary file is gone and no wipe explains it"
fi
"$BIN/custodyctl" run --socket "$WORK/control.sock" --identity canary@unmanaged.example -- sh -c \
    'echo "after the fuzzer" > "$0/canary2" && [ "$(cat "$0/canary2")" = "after the fuzzer" ]' "$WORK/mnt" || fail "the mount does not write"
echo "api-fuzz: 1 passed, 0 failed"
