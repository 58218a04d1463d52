#!/bin/bash
# The Ansible collection (ansible/, custody.protection): ansible-test sanity and unit tests, then
# a fleet of three custodyd instances on this machine (each with its own state, socket and mount,
# reached with ansible_connection=local) driven by tests/playbook/fleet.yml: enroll on all, write
# files as two identities, wipe one everywhere, check per host that exactly its files are gone;
# then identity.yml (one identity carried to the other two hosts, sealed), then converge.yml twice
# (the second run changes nothing) and once more in check mode.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "${1:-$ROOT/.build/debug}" && pwd)
PYTHON_VERSION=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WORK=$(mktemp -d /tmp/custody-ansible.XXXXXX)
PIDS=()
MOUNTS=()

cleanup() {
    local status=$?
    for mount in "${MOUNTS[@]}"; do fusermount3 -u "$mount" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ $status -ne 0 ]; then
        for log in "$WORK"/host*/log; do [ -f "$log" ] && { echo "== $log"; tail -20 "$log"; }; done
    fi
    rm -rf "$WORK"
    exit $status
}
trap cleanup EXIT

fail() { echo "ansible-test: $*" >&2; exit 1; }

# The collection where Ansible and ansible-test look for it.
COLLECTION=$WORK/collections/ansible_collections/custody/protection
mkdir -p "$(dirname "$COLLECTION")"
cp -r "$ROOT/ansible" "$COLLECTION"
rm -rf "$COLLECTION/tests/output"

# ansible-test puts pip into each sanity virtual environment with a bootstrap script it downloads
# from ci-files.testing.ansible.com; where that cannot be reached, this stand-in does the same
# from the interpreter's bundled pip (ensurepip) and the package index.
export HOME=$WORK/home
mkdir -p "$HOME/.ansible/test/cache"
PIP_VERSION=24.2 # the pip that ansible-core 2.19's ansible-test installs
cat > "$HOME/.ansible/test/cache/get_pip_${PIP_VERSION//./_}.py" <<'PY'
import subprocess
import sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
arguments = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", "--quiet"] + arguments))
PY

(cd "$COLLECTION" && ansible-test sanity --local --python "$PYTHON_VERSION" --requirements 2>&1 | grep -v "^Installing\|locale\|^Using cached\|^Collecting\|^  Downloading\|━━\|^Successfully installed") \
    || fail "sanity failed"
(cd "$COLLECTION" && ansible-test units --local --python "$PYTHON_VERSION" --requirements 2>&1 | grep -E "passed|failed|error|FATAL") \
    || fail "unit tests failed"

# Three hosts: a daemon each.
HOSTS=(host1 host2 host3)
for host in "${HOSTS[@]}"; do
    mkdir -p "$WORK/$host/backing" "$WORK/$host/mnt"
    "$BIN/custodyd" --state "$WORK/$host/state" --socket "$WORK/$host/control.sock" --no-sessions --multi-identity \
        "$WORK/$host/backing" "$WORK/$host/mnt" > "$WORK/$host/log" 2>&1 &
    PIDS+=($!)
    MOUNTS+=("$WORK/$host/mnt")
done
for host in "${HOSTS[@]}"; do
    for _ in $(seq 100); do
        grep -q "ready" "$WORK/$host/log" 2>/dev/null && break
        sleep 0.1
    done
    grep -q "ready" "$WORK/$host/log" || fail "$host's daemon did not start"
done

{
    echo "[custody]"
    for host in "${HOSTS[@]}"; do
        echo "$host custody_socket=$WORK/$host/control.sock custody_mount=$WORK/$host/mnt custody_exchange=$WORK/exchange"
    done
    echo "[custody:vars]"
    echo "ansible_connection=local"
    echo "ansible_python_interpreter=$(command -v python3)"
    echo "custodyctl=$BIN/custodyctl"
} > "$WORK/inventory"

# The passphrase comes from a vault, as it would on a fleet.
echo "test vault password" > "$WORK/vault-password"
echo "alice_passphrase: correct horse battery staple" > "$WORK/secrets.yml"
ansible-vault encrypt --vault-password-file "$WORK/vault-password" "$WORK/secrets.yml" > /dev/null
grep -q '^\$ANSIBLE_VAULT' "$WORK/secrets.yml" || fail "the secrets file is not encrypted"

export ANSIBLE_COLLECTIONS_PATH=$WORK/collections ANSIBLE_HOST_KEY_CHECKING=false ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_LOCAL_TEMP=$WORK/ansible-tmp ANSIBLE_REMOTE_TEMP=$WORK/ansible-tmp ANSIBLE_ASYNC_DIR=$WORK/ansible-async
playbook() {
    ansible-playbook -i "$WORK/inventory" -e "@$WORK/secrets.yml" --vault-password-file "$WORK/vault-password" "$@"
}

playbook "$COLLECTION/tests/playbook/fleet.yml" > "$WORK/fleet.out" 2>&1 || { cat "$WORK/fleet.out"; fail "fleet.yml failed"; }
grep -q "correct horse" "$WORK/fleet.out" && fail "the passphrase reached the output"

# Per host: exactly Bob's files are gone, Alice's are there and read back.
for host in "${HOSTS[@]}"; do
    # Counted through the mount: the backing store keeps the identities' names encrypted.
    bob=$(find "$WORK/$host/mnt" -path '*bob*' -type f | wc -l)
    alice=$(find "$WORK/$host/mnt/alice" -type f -name 'file*' | wc -l)
    [ "$bob" = 0 ] || fail "$host still has $bob of Bob's files"
    [ "$alice" = 3 ] || fail "$host has $alice of Alice's 3 files"
    content=$("$BIN/custodyctl" run --socket "$WORK/$host/control.sock" --identity alice@contoso.com -- cat "$WORK/$host/mnt/alice/file2.txt")
    [ "$content" = "alice on $host 2" ] || fail "$host: Alice's file reads '$content'"
    grep -rq "alice on" "$WORK/$host/backing" && fail "$host: Alice's file is stored in clear"
    find "$WORK/$host/backing" -name 'file*' | grep -q . && fail "$host: Alice's names are stored in clear"
done

# One identity on three hosts: its keys carried sealed, a file encrypted on each read on the
# others; the second run imports nothing.
mkdir -p "$WORK/exchange"
for run in 1 2; do
    extra=(); [ $run = 2 ] && extra=(-e second_run=true)
    playbook "$COLLECTION/tests/playbook/identity.yml" "${extra[@]}" > "$WORK/identity$run.out" 2>&1 \
        || { cat "$WORK/identity$run.out"; fail "identity.yml (run $run) failed"; }
done
grep -rq "dana on" "$WORK/exchange"/host?.txt && fail "an exported file of Dana's is in clear"

# Idempotence: the second run of the desired state changes nothing, nor does a check run.
playbook "$COLLECTION/tests/playbook/converge.yml" > "$WORK/converge1.out" 2>&1 || { cat "$WORK/converge1.out"; fail "converge.yml failed"; }
grep -Eq "host1 +: ok=5 +changed=[1-9]" "$WORK/converge1.out" || { cat "$WORK/converge1.out"; fail "the first converge changed nothing"; }
for mode in "" "--check --diff"; do
    # shellcheck disable=SC2086
    playbook "$COLLECTION/tests/playbook/converge.yml" $mode > "$WORK/converge2.out" 2>&1 || { cat "$WORK/converge2.out"; fail "converge.yml $mode failed"; }
    for host in "${HOSTS[@]}"; do
        grep -Eq "^$host +: ok=5 +changed=0 " "$WORK/converge2.out" || { cat "$WORK/converge2.out"; fail "converge.yml $mode changed $host again"; }
    done
done

# The role: binaries, a configuration custodyd accepts, and nothing to do the second time.
mkdir -p "$WORK/role/prefix/bin"
for run in 1 2; do
    ansible-playbook -i localhost, -c local -e "work=$WORK/role bin_dir=$BIN ansible_python_interpreter=$(command -v python3)" \
        "$COLLECTION/tests/playbook/role.yml" > "$WORK/role$run.out" 2>&1 || { cat "$WORK/role$run.out"; fail "role.yml failed"; }
done
grep -Eq "localhost +: ok=[0-9]+ +changed=[1-9]" "$WORK/role1.out" || { cat "$WORK/role1.out"; fail "the role changed nothing"; }
grep -Eq "localhost +: ok=[0-9]+ +changed=0 " "$WORK/role2.out" || { cat "$WORK/role2.out"; fail "the role changed things again"; }
"$BIN/custodyd" --check-config "$WORK/role/etc/custody.toml" > /dev/null || fail "the role's configuration is refused"
grep -q 'metrics-listen = "127.0.0.1:9464"' "$WORK/role/etc/custody.toml" || fail "no metrics-listen in the role's configuration"
[ "$(grep -c '^\[\[account\]\]' "$WORK/role/etc/custody.toml")" = 2 ] || fail "the role's configuration does not declare the two accounts"
grep -q '^saveToLocations = \["AccountDocument"\]' "$WORK/role/etc/custody.toml" || fail "the role's configuration has no account policy"
cmp -s "$BIN/custodyd" "$WORK/role/prefix/bin/custodyd" || fail "custodyd was not installed"

echo "ansible-test: sanity, units and a playbook over ${#HOSTS[@]} hosts passed"
