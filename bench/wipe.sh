#!/usr/bin/env bash
# Selective wipe on a tree of mixed files: FILES files in DIRS directories, a third owned by the
# wiped identity (encrypted), a third by another managed identity, a third with no owner.
# Prints the time until the keys were destroyed and the whole wipe's time, and checks the result.
# Usage: bench/wipe.sh [FILES]   (release binaries from `make release`)
set -euo pipefail
FILES=${1:-20000}
DIRS=200
BIN=${BIN:-.build/release}
ROOT=$(mktemp -d /tmp/custody-wipe-bench.XXXXXX)
SOCK=$ROOT/control.sock
mkdir -p "$ROOT/backing" "$ROOT/mnt" "$ROOT/state"; chmod 700 "$ROOT/state"
"$BIN/custodyd" --state "$ROOT/state" --socket "$SOCK" --multi-identity "$ROOT/backing" "$ROOT/mnt" 2>"$ROOT/log" &
DAEMON=$!
cleanup() {
    fusermount3 -u "$ROOT/mnt" 2>/dev/null || true
    wait "$DAEMON" 2>/dev/null || true
    rm -rf "$ROOT"
}
trap cleanup EXIT
for _ in $(seq 100); do grep -q " $ROOT/mnt " /proc/self/mountinfo && break; sleep 0.05; done
export CUSTODY_SOCKET=$SOCK
ctl() { "$BIN/custodyctl" "$@"; }
ctl enroll wiped-oid wiped@contoso.com --level untilFirstAuth >/dev/null
ctl enroll kept-oid kept@contoso.com --level untilFirstAuth >/dev/null

per=$((FILES / 3))
make_files() {  # prefix count: files of 1–8 KiB spread over the directories
    local prefix=$1 count=$2
    for ((i = 0; i < count; i++)); do
        d=$((i % DIRS))
        head -c $(( (i % 8 + 1) * 1024 )) /dev/urandom > "$ROOT/mnt/d$d/$prefix$i"
    done
}
for ((d = 0; d < DIRS; d++)); do mkdir -p "$ROOT/mnt/d$d"; done
start=$(date +%s.%N)
export -f make_files; export ROOT DIRS
ctl run --identity wiped@contoso.com -- bash -c "make_files w $per"
ctl run --identity kept@contoso.com -- bash -c "make_files k $per"
make_files p $((FILES - 2 * per))
echo "created $FILES files in $(echo "$(date +%s.%N) - $start" | bc) s"
sync; echo 3 > /proc/sys/vm/drop_caches

start=$(date +%s.%N)
result=$(ctl wipe wiped@contoso.com --json)
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
echo "$result"
echo "wipe of $per of $FILES files: $elapsed s (as seen by custodyctl)"
left_wiped=$(find "$ROOT/mnt" -name 'w*' -type f | wc -l)
left_kept=$(find "$ROOT/mnt" -name 'k*' -type f | wc -l)
left_plain=$(find "$ROOT/mnt" -name 'p*' -type f | wc -l)
echo "left: wiped identity $left_wiped, other identity $left_kept, no owner $left_plain"
[ "$left_wiped" = 0 ] && [ "$left_kept" = "$per" ] && [ "$left_plain" = $((FILES - 2 * per)) ]
