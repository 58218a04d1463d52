#!/usr/bin/env bash
# Starts a software TPM 2.0 (swtpm) for a test, never the host's TPM.
# Usage: swtpm-start.sh STATE_DIR
# Keeps its state in STATE_DIR (made if missing; reusing it restarts the same TPM), listens on two
# free loopback ports, and prints "TCTI PID" once the TPM answers. The caller stops it by PID.
set -euo pipefail
dir=$(realpath -m "$1")
mkdir -p "$dir"
for _ in $(seq 1 20); do
    port=$(( 20000 + RANDOM % 20000 ))
    rm -f "$dir/swtpm.pid"
    if swtpm socket --tpm2 --tpmstate dir="$dir" --flags not-need-init,startup-clear \
        --server type=tcp,port=$port,bindaddr=127.0.0.1 --ctrl type=tcp,port=$((port + 1)),bindaddr=127.0.0.1 \
        --pid file="$dir/swtpm.pid" --log file="$dir/swtpm.log" --daemon >>"$dir/swtpm.log" 2>&1 </dev/null; then
        for _ in $(seq 1 100); do
            [ -s "$dir/swtpm.pid" ] && break
            sleep 0.02
        done
        pid=$(cat "$dir/swtpm.pid")
        # Ready once the TPM port accepts connections.
        for _ in $(seq 1 100); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
                echo "swtpm:host=127.0.0.1,port=$port $pid"
                exit 0
            fi
            sleep 0.02
        done
        kill "$pid" 2>/dev/null || true
    fi
done
echo "swtpm did not start (see $dir/swtpm.log)" >&2
exit 1
