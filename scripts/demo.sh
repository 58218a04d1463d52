#!/usr/bin/env bash
# `make run`: Custody in the foreground on a demo directory. DIR/Work is mounted from DIR/backing;
# on the first run a demo managed account is enrolled (class complete, no passphrase) and the
# invoking user's processes act as it, so what that user writes in Work/ is owned by it and
# encrypted. Later runs reuse DIR/state. Ctrl-C (or fusermount3 -u DIR/Work) stops it.
# Usage: demo.sh BIN_DIR DIR
set -euo pipefail
bin=$(realpath "$1")
dir=$(realpath -m "$2")
account=demo@contoso.com
socket=$dir/control.sock
# The user who ran `make run` (through sudo, or directly).
user_uid=${SUDO_UID:-$(id -u)}
user_gid=${SUDO_GID:-$(id -g)}

mkdir -p "$dir/backing" "$dir/Work" "$dir/state"
chmod 700 "$dir/state"
# Work/ is the invoking user's working directory.
[ "$(id -u)" != 0 ] || chown "$user_uid:$user_gid" "$dir/backing"
if grep -q " $dir/Work " /proc/self/mountinfo; then fusermount3 -uz "$dir/Work"; fi
options=(--state "$dir/state" --socket "$socket" --lock-grace-period 2 --default-identity "$user_uid=$account")
# A user other than the daemon's own reaches the mount only with allow_other.
[ "$user_uid" = "$(id -u)" ] || options+=(--allow-other)

"$bin/custodyd" "${options[@]}" "$dir/backing" "$dir/Work" 2>"$dir/custodyd.log" &
daemon=$!
stop() {
    trap - INT TERM EXIT
    if grep -q " $dir/Work " /proc/self/mountinfo; then fusermount3 -u "$dir/Work" || fusermount3 -uz "$dir/Work"; fi
    wait "$daemon" 2>/dev/null || true
}
trap stop INT TERM EXIT

ctl() { "$bin/custodyctl" --socket "$socket" "$@"; }
for _ in $(seq 1 150); do
    ctl status >/dev/null 2>&1 && break
    kill -0 "$daemon" 2>/dev/null || { cat "$dir/custodyd.log" >&2; exit 1; }
    sleep 0.1
done
as_user() { if [ "$user_uid" = "$(id -u)" ]; then "$@"; else setpriv --reuid="$user_uid" --regid="$user_gid" --clear-groups "$@"; fi; }

if ! ctl accounts "$account" >/dev/null 2>&1; then
    ctl enroll demo-oid "$account" --level complete --uid "$user_uid" >/dev/null
    as_user sh -c "echo 'quarterly numbers: managed by $account, encrypted on disk' > '$dir/Work/report.txt'" ||
        echo "(could not write $dir/Work/report.txt as uid $user_uid)" >&2
    echo "Enrolled the demo account $account (class complete, no passphrase): the files uid $user_uid writes in Work/ are its."
else
    echo "Reusing the demo state in $dir (account $account)."
fi
cat <<HINTS

Custody demo: $dir/Work is protected; its files are stored in $dir/backing.
Try, from another terminal (as uid $user_uid, or root):

  export PATH="$bin:\$PATH" CUSTODY_SOCKET=$socket
  custodyctl info $dir/Work/report.txt          # owner $account (managed), encrypted, class complete
  grep -rl quarterly $dir/backing               # nothing: not on disk in clear, nor its name
  custodyctl lock $account; sleep 3; cat $dir/Work/report.txt    # Permission denied: locked
  custodyctl unlock $account                    # readable again
  sudo custodyctl --socket $socket wipe $account   # an administrator's selective wipe: keys first, then its files

The daemon's log is $dir/custodyd.log. Press Ctrl-C here to unmount and stop.
HINTS
wait "$daemon"
