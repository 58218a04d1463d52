#!/usr/bin/env bash
# The man pages say what the programs say: every subcommand and option that custodyctl's and
# custodyd's --help show is in man/custodyctl.1 and man/custodyd.8 (regenerate them with
# `make man`), and every configuration key that custodyd reads is in man/custody.toml.5.
# Usage: man-test.sh BIN_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1
failures=0
fail() { echo "man-test: FAIL: $*" >&2; failures=$((failures + 1)); }

# The options a --help text lists (help and version are in every page).
options() { grep -oE -- '^ +(-[a-zA-Z], )?--[a-z][a-z0-9-]+' | grep -oE -- '--[a-z][a-z0-9-]+' | grep -vxE -- '--(help|version)' | sort -u; }
# The subcommands a --help text lists.
subcommands() { sed -n '/^SUBCOMMANDS:/,/^$/p' | grep -oE '^  [a-z][a-z0-9-]*' | sed 's/^  //' | grep -vx help || true; }

checked=0
walk() {
    local help
    help=$("$bin/custodyctl" "$@" --help)
    for option in $(options <<<"$help"); do
        grep -q -- "Fl -${option#--}\b" man/custodyctl.1 || fail "custodyctl $* $option is not in man/custodyctl.1 (run make man)"
        checked=$((checked + 1))
    done
    for sub in $(subcommands <<<"$help"); do
        grep -q "^\.It Em $sub\$" man/custodyctl.1 || fail "custodyctl $* $sub is not in man/custodyctl.1 (run make man)"
        checked=$((checked + 1))
        walk "$@" "$sub"
    done
}
walk

for option in $("$bin/custodyd" --help | options); do
    grep -q -- "Fl -${option#--}\b" man/custodyd.8 || fail "custodyd $option is not in man/custodyd.8 (run make man)"
    checked=$((checked + 1))
done
grep -q '^\.Dt CUSTODYD 8' man/custodyd.8 || fail "man/custodyd.8 is not in section 8"

# Every key of the configuration file's reader.
keys=$(sed -n '/static let topKeys/,/static let mountKeys.*$/p' Sources/CustodyConfig/Configuration.swift | grep -oE '"[A-Za-z_-]+"' | tr -d '"' | sort -u)
[ -n "$keys" ] || fail "no configuration keys found in Sources/CustodyConfig/Configuration.swift"
for key in $keys; do
    grep -qw -- "$key" man/custody.toml.5 || fail "configuration key $key is not in man/custody.toml.5"
    checked=$((checked + 1))
done

# Each page renders without warnings.
for page in man/custodyctl.1 man/custodyd.8 man/custody.toml.5; do
    out=$(LC_ALL=C.UTF-8 groff -mandoc -Tutf8 -ww -z "$page" 2>&1) || fail "$page does not render"
    [ -z "$out" ] || fail "$page: $out"
done

if [ "$failures" -gt 0 ]; then echo "man-test: $failures failed"; exit 1; fi
echo "man-test: $checked names checked, 0 failed"
