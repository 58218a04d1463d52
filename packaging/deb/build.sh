#!/usr/bin/env bash
# `make deb`: a Debian package of what `make install` installs, laid out for /usr: the static
# binaries (the Swift runtime inside, stripped), the units, sysusers and tmpfiles entries, the
# PAM module, the example configuration as a conffile, completions, man pages and the docs, with
# maintainer scripts that create the group and the state directory and reload systemd where it
# runs. Dependencies come from dpkg-shlibdeps. Usage: build.sh OUTPUT_DIR; prints the .deb's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:-.build/deb}")
mkdir -p "$out"
here=packaging/deb
version=$(.build-static/release/custodyd --version)
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
stage=$(mktemp -d /tmp/custody-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
umask 022

make --no-print-directory install DESTDIR="$root" PREFIX=/usr SYSCONFDIR=/etc UNITDIR=/usr/lib/systemd/system \
    SYSUSERSDIR=/usr/lib/sysusers.d TMPFILESDIR=/usr/lib/tmpfiles.d PAMDIR=/usr/lib/$multiarch/security >/dev/null
# Debian's places: vendor zsh completions; the example configuration with the docs, not in /etc.
mkdir -p "$root/usr/share/zsh/vendor-completions"
mv "$root/usr/share/zsh/site-functions/_custodyctl" "$root/usr/share/zsh/vendor-completions/_custodyctl"
rmdir "$root/usr/share/zsh/site-functions"
mv "$root/etc/custody/custody.toml.example" "$root/usr/share/doc/custody/custody.toml.example"
# Completion scripts are sourced, not run.
sed -i '1{/^#!/d}' "$root/usr/share/bash-completion/completions/custodyctl"
strip --remove-section=.comment --remove-section=.note "$root/usr/bin/custodyd" "$root/usr/bin/custodyctl"
strip --remove-section=.comment --remove-section=.note --strip-unneeded "$root/usr/lib/$multiarch/security/pam_custody.so"
chmod 0644 "$root/usr/lib/$multiarch/security/pam_custody.so"
install -m 0644 "$here/copyright" "$root/usr/share/doc/custody/copyright"
{
    echo "custody ($version) unstable; urgency=medium"
    echo
    echo "  * Release $version: see the README and docs in /usr/share/doc/custody."
    echo
    echo " -- $(sed -n 's/^Maintainer: //p' "$here/control.in")  $(date -R -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)")"
} | gzip -9n > "$root/usr/share/doc/custody/changelog.gz"
gzip -9n "$root"/usr/share/man/man*/*

mkdir -p "$root/DEBIAN"
install -m 0755 "$here/postinst" "$here/postrm" "$root/DEBIAN/"
printf "%s\n" /etc/custody/custody.toml /etc/xdg/autostart/custody-agent.desktop > "$root/DEBIAN/conffiles"
# Shared-library dependencies, as debhelper would compute them.
mkdir -p "$stage/debian"
printf 'Source: custody\n\nPackage: custody\nArchitecture: any\n' > "$stage/debian/control"
depends=$(cd "$stage" && dpkg-shlibdeps -O "root/usr/bin/custodyd" "root/usr/bin/custodyctl" "root/usr/lib/$multiarch/security/pam_custody.so" 2>/dev/null \
    | sed -n 's/^shlibs:Depends=//p')
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed "s/@VERSION@/$version/; s/@ARCH@/$arch/; s/@SIZE@/$size/; s/@DEPENDS@/$depends/" "$here/control.in" > "$root/DEBIAN/control"
(cd "$root" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\0' | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
find "$root" -type d -exec chmod 0755 {} +
deb=$out/custody_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
