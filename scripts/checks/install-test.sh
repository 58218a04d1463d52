#!/usr/bin/env bash
# make install into a temporary DESTDIR, then: the systemd units pass `systemd-analyze verify`,
# the installed binaries run with the Swift toolchain hidden from the loader (static runtime),
# the shipped configuration passes `custodyd --check-config`, `man` finds the installed pages, and
# `make uninstall` removes it all.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=$(mktemp -d /tmp/custody-install.XXXXXX)
trap 'rm -rf "$DEST"' EXIT
fail() { echo "install-test: FAIL: $*" >&2; exit 1; }

make --no-print-directory install DESTDIR="$DEST" PREFIX=/usr/local >/dev/null
for f in usr/local/bin/custodyd usr/local/bin/custodyctl usr/local/lib/systemd/system/custodyd.service \
         usr/local/lib/systemd/system/custodyd.socket usr/local/lib/sysusers.d/custody.conf \
         usr/local/lib/tmpfiles.d/custody.conf etc/custody/custody.toml etc/custody/custody.toml.example \
         usr/local/share/doc/custody/docs/openapi.yaml usr/local/share/bash-completion/completions/custodyctl \
         usr/local/share/man/man1/custodyctl.1 usr/local/share/man/man8/custodyd.8 usr/local/share/man/man5/custody.toml.5 \
         etc/xdg/autostart/custody-agent.desktop; do
    [ -e "$DEST/$f" ] || fail "$f was not installed"
done
# The notification agent starts in every graphical session, from the installed custodyctl.
grep -qx "Exec=/usr/local/bin/custodyctl agent" "$DEST/etc/xdg/autostart/custody-agent.desktop" || fail "the autostart entry does not run custodyctl agent"
if command -v desktop-file-validate >/dev/null; then
    out=$(desktop-file-validate "$DEST/etc/xdg/autostart/custody-agent.desktop" 2>&1) || fail "desktop-file-validate: $out"
fi
# `man custodyctl` (and the others) find the installed pages and render them.
for page in custodyctl custodyd custody.toml; do
    found=$(MANPATH="$DEST/usr/local/share/man" man -w "$page") || fail "man -w $page finds nothing"
    case "$found" in "$DEST"/*) ;; *) fail "man -w $page found $found, not the installed page" ;; esac
    MANPATH="$DEST/usr/local/share/man" MANPAGER=cat man "$page" 2>/dev/null | grep -q "custody" || fail "man $page does not render"
done

# The units as installed, with ExecStart pointing into the staging tree (it must exist).
units="$DEST/verify"
mkdir -p "$units"
for unit in custodyd.service custodyd.socket; do
    sed "s|/usr/local/bin/|$DEST/usr/local/bin/|g; s|/etc/custody/|$DEST/etc/custody/|g" "$DEST/usr/local/lib/systemd/system/$unit" > "$units/$unit"
done
out=$(systemd-analyze verify "$units/custodyd.socket" "$units/custodyd.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify warns: $out"
rm -rf "$units"

# The binaries do not need the toolchain: none of its libraries is linked...
for bin in custodyd custodyctl; do
    if ldd "$DEST/usr/local/bin/$bin" | grep -q "libswift\|libFoundation\|lib_Foundation\|libdispatch"; then
        fail "$bin links the Swift runtime dynamically: $(ldd "$DEST/usr/local/bin/$bin" | grep -i swift)"
    fi
done
# ...and they run with the toolchain's directory hidden (an empty tmpfs over it).
toolchain=$(dirname "$(dirname "$(readlink -f "$(command -v swift)")")")
version=$(unshare --mount sh -c "mount -t tmpfs none '$toolchain' && '$DEST/usr/local/bin/custodyd' --version") \
    || fail "custodyd --version with $toolchain hidden"
[ -n "$version" ] || fail "custodyd --version printed nothing"
unshare --mount sh -c "mount -t tmpfs none '$toolchain' && '$DEST/usr/local/bin/custodyctl' --version" >/dev/null \
    || fail "custodyctl --version with $toolchain hidden"
# The shipped configuration is valid (its group comes from sysusers, checked into the staging root).
systemd-sysusers --root="$DEST" "$DEST/usr/local/lib/sysusers.d/custody.conf" || fail "systemd-sysusers"
grep -q "^custody-admin:" "$DEST/etc/group" || fail "sysusers did not create custody-admin"
grep -v "group = " "$DEST/etc/custody/custody.toml" > "$DEST/check.toml"
unshare --mount sh -c "mount -t tmpfs none '$toolchain' && '$DEST/usr/local/bin/custodyd' --check-config '$DEST/check.toml'" >/dev/null \
    || fail "the installed configuration does not pass --check-config"
rm -f "$DEST/check.toml"
systemd-tmpfiles --root="$DEST" --create "$DEST/usr/local/lib/tmpfiles.d/custody.conf" || fail "systemd-tmpfiles"
[ "$(stat -c %a "$DEST/var/lib/custody")" = 700 ] || fail "tmpfiles: /var/lib/custody is not 0700"

make --no-print-directory uninstall DESTDIR="$DEST" PREFIX=/usr/local >/dev/null
left=$(find "$DEST" -type f ! -path "*/etc/custody/custody.toml" ! -path "$DEST/etc/*" ! -path "$DEST/var/*" ! -path "$DEST/run/*")
[ -z "$left" ] || fail "make uninstall left: $left"
echo "install-test: OK (custodyd $version; units verified; runs without the toolchain)"
