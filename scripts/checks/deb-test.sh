#!/usr/bin/env bash
# `make deb`, then: lintian reports no error; dpkg installs it into this machine; the installed
# custodyd mounts a temporary directory, encrypts a managed identity's file and answers
# custodyctl; `dpkg --purge` leaves none of the package's files, its state or its configuration
# behind. Stops what it started by PID; removes the custody-admin group if it made it.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "deb-test: FAIL: $*" >&2; exit 1; }
work=$(mktemp -d /tmp/custody-deb-test.XXXXXX)
daemon=
had_group=$(getent group custody-admin >/dev/null && echo yes || echo no)
cleanup() {
    if mountpoint -q "$work/mnt" 2>/dev/null; then fusermount3 -u "$work/mnt" || fusermount3 -uz "$work/mnt"; fi
    if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
    if dpkg -s custody >/dev/null 2>&1; then dpkg --purge custody >/dev/null || true; fi
    if [ "$had_group" = no ] && getent group custody-admin >/dev/null; then groupdel custody-admin || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

deb=$(make --no-print-directory deb | tail -1)
[ -f "$deb" ] || fail "make deb made no package"
lintian --fail-on error --tag-display-limit 0 "$deb" > "$work/lintian.txt" 2>&1 || fail "lintian: $(cat "$work/lintian.txt")"

dpkg -i "$deb" > "$work/dpkg.txt" 2>&1 || fail "dpkg -i: $(cat "$work/dpkg.txt")"
dpkg -L custody | sort > "$work/files.txt"
for path in /usr/bin/custodyd /usr/bin/custodyctl /usr/lib/systemd/system/custodyd.service /etc/custody/custody.toml \
            /usr/share/man/man1/custodyctl.1.gz /usr/share/doc/custody/copyright; do
    [ -e "$path" ] || fail "$path was not installed"
done
[ "$(stat -c %a /var/lib/custody)" = 700 ] || fail "/var/lib/custody is not 0700 after install"
getent group custody-admin >/dev/null || fail "the postinst made no custody-admin group"
man -w custodyctl | grep -q "^/usr/share/man/man1/custodyctl.1.gz$" || fail "man custodyctl does not find the packaged page"

# The installed daemon, on a mount of the test's own.
mkdir -p "$work/backing" "$work/mnt"
install -d -m 0700 "$work/state"
/usr/bin/custodyd --state "$work/state" --socket "$work/control.sock" --default-identity "0=alice@contoso.com" \
    "$work/backing" "$work/mnt" 2>"$work/custodyd.log" &
daemon=$!
for _ in $(seq 1 150); do mountpoint -q "$work/mnt" && break; sleep 0.1; done
mountpoint -q "$work/mnt" || fail "the installed custodyd did not mount: $(cat "$work/custodyd.log")"
ctl() { /usr/bin/custodyctl --socket "$work/control.sock" "$@"; }
ctl enroll alice-oid alice@contoso.com >/dev/null || fail "custodyctl enroll"
echo "quarterly numbers" > "$work/mnt/report.txt"
[ "$(cat "$work/mnt/report.txt")" = "quarterly numbers" ] || fail "the file does not read back"
! grep -rq quarterly "$work/backing" || fail "the file is stored in clear"
[ ! -e "$work/backing/report.txt" ] || fail "the file's name is stored in clear"
ctl info "$work/mnt/report.txt" | grep -q "encrypted: yes" || fail "custodyctl info does not say encrypted"
fusermount3 -u "$work/mnt"
wait "$daemon" || fail "custodyd exited with an error: $(cat "$work/custodyd.log")"
daemon=

dpkg --purge custody > "$work/dpkg.txt" 2>&1 || fail "dpkg --purge: $(cat "$work/dpkg.txt")"
! dpkg -s custody >/dev/null 2>&1 || fail "the package is still known to dpkg"
while read -r path; do
    [ -d "$path" ] && continue
    [ ! -e "$path" ] || fail "$path is left after purge"
done < "$work/files.txt"
[ ! -e /var/lib/custody ] || fail "/var/lib/custody is left after purge"
[ ! -e /etc/custody ] || fail "/etc/custody is left after purge"
echo "deb-test: OK ($(basename "$deb"), lintian clean of errors, installed, ran, purged)"
