#!/usr/bin/env bash
# Builds the Debian package of mcrelay with dpkg-deb alone (no cargo-deb to
# compile first): a release build of the three binaries (mcrelayd, mcrelayctl
# and the privileged helper program mcrelay-helper), a staged tree, the
# control files in this directory, dpkg-deb --build --root-owner-group.
#
#   deploy/deb/build.sh [OUTDIR]     # default OUTDIR: target/deb
#
# Prints the path of the .deb on stdout (progress goes to stderr). Needs
# dpkg-dev (dpkg-shlibdeps computes Depends from the binaries' libraries)
# and python3 (third_party.py collects the crates' licence files).
# MCRELAY_DEB_NO_BUILD=1 packages the binaries already in target/release.
set -euo pipefail
umask 022
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-target/deb}" && cd "${1:-target/deb}" && pwd)

command -v dpkg-shlibdeps >/dev/null || { echo "build.sh: dpkg-shlibdeps missing: apt-get install dpkg-dev" >&2; exit 1; }

if [ "${MCRELAY_DEB_NO_BUILD:-0}" != 1 ]; then
    cargo build --release --locked -p mcrelayd -p mcrelayctl -p mcrelay-helper >&2
fi
bin=target/release
# Reproducible timestamps (gzip -n, dpkg-deb and the changelog use it).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

version=$("$bin/mcrelayd" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "build.sh: no version from mcrelayd --version" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/mcrelay
doc=$pkg/usr/share/doc/mcrelay

install -d -m 0755 "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/libexec/mcrelay" "$pkg/usr/lib/systemd/system" \
    "$pkg/usr/lib/sysusers.d" "$pkg/usr/lib/tmpfiles.d" "$pkg/etc/mcrelay" \
    "$pkg/usr/share/man/man8" "$pkg/usr/share/man/man5" "$doc" "$pkg/usr/share/mcrelay" \
    "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" \
    "$pkg/usr/share/fish/vendor_completions.d"

# Binaries, stripped of the release profile's line tables (debug = 1).
for b in mcrelayd mcrelayctl; do
    install -m 0755 "$bin/$b" "$pkg/usr/bin/$b"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$pkg/usr/bin/$b"
done
# The privileged helper program: started by mcrelayd (which looks for it
# here), not a command for people, so not on PATH.
helper=$pkg/usr/libexec/mcrelay/mcrelay-helper
install -m 0755 "$bin/mcrelay-helper" "$helper"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$helper"

install -m 0644 deploy/mcrelay.service "$pkg/usr/lib/systemd/system/mcrelay.service"
install -m 0644 deploy/mcrelay.sysusers "$pkg/usr/lib/sysusers.d/mcrelay.conf"
install -m 0644 deploy/mcrelay.tmpfiles "$pkg/usr/lib/tmpfiles.d/mcrelay.conf"
install -m 0644 deploy/mcrelay.toml "$pkg/etc/mcrelay/mcrelay.toml"
# keepalived for a warm-standby pair: the script where the example's paths
# say, the example config with the other examples.
install -D -m 0755 deploy/keepalived/mcrelay-keepalived "$pkg/usr/share/mcrelay/keepalived/mcrelay-keepalived"
install -D -m 0644 deploy/keepalived/keepalived.conf "$doc/examples/keepalived/keepalived.conf"

# Man pages from the binaries themselves (the same definitions as --help,
# and docs/configuration.md for mcrelay.toml(5)).
"$bin/mcrelayd" man | gzip -9n >"$pkg/usr/share/man/man8/mcrelayd.8.gz"
"$bin/mcrelayctl" man | gzip -9n >"$pkg/usr/share/man/man8/mcrelayctl.8.gz"
"$bin/mcrelayd" man --config-file | gzip -9n >"$pkg/usr/share/man/man5/mcrelay.toml.5.gz"
chmod 0644 "$pkg"/usr/share/man/man*/*.gz

# Shell completions, from the binaries (the same definitions as --help).
for b in mcrelayd mcrelayctl; do
    "$bin/$b" completions bash >"$pkg/usr/share/bash-completion/completions/$b"
    "$bin/$b" completions zsh >"$pkg/usr/share/zsh/vendor-completions/_$b"
    "$bin/$b" completions fish >"$pkg/usr/share/fish/vendor_completions.d/$b.fish"
done
chmod 0644 "$pkg"/usr/share/bash-completion/completions/* "$pkg"/usr/share/zsh/vendor-completions/* \
    "$pkg"/usr/share/fish/vendor_completions.d/*

# The Prometheus alert rules, for prometheus.yml's rule_files.
install -m 0644 deploy/prometheus/mcrelay-alerts.yml "$pkg/usr/share/mcrelay/mcrelay-alerts.yml"

# Documentation (the unit's Documentation= points at two of these).
for f in README.md docs/operations.md docs/configuration.md docs/security.md docs/architecture.md; do
    install -m 0644 "$f" "$doc/$(basename "$f")"
done
install -m 0644 "$here/copyright" "$doc/copyright"
# The notices of the crates compiled into the binaries.
python3 "$here/third_party.py" | gzip -9n >"$doc/third-party-licenses.gz"
chmod 0644 "$doc/third-party-licenses.gz"
printf 'mcrelay (%s) unstable; urgency=medium\n\n  * Built from the mcrelay repository; see its git history.\n\n -- mcrelay developers <mcrelay@example.invalid>  %s\n' \
    "$version" "$(date -u -R -d "@$SOURCE_DATE_EPOCH")" | gzip -9n >"$doc/changelog.gz"
chmod 0644 "$doc/changelog.gz"

# Maintainer scripts and conffiles.
for s in postinst prerm postrm; do
    install -m 0755 "$here/$s" "$pkg/DEBIAN/$s"
done
install -m 0644 "$here/conffiles" "$pkg/DEBIAN/conffiles"

# Depends from the libraries the binaries link (libc6, libgcc-s1) with the
# symbol versions they use. dpkg-shlibdeps wants a debian/control to exist.
mkdir -p "$stage/src/debian"
printf 'Source: mcrelay\n\nPackage: mcrelay\nArchitecture: any\n' >"$stage/src/debian/control"
depends=$(cd "$stage/src" && dpkg-shlibdeps -O "$pkg/usr/bin/mcrelayd" "$pkg/usr/bin/mcrelayctl" "$helper" \
    | sed -n 's/^shlibs:Depends=//p')
[ -n "$depends" ] || { echo "build.sh: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@DEPENDS@/$depends/" \
    -e "s/@SIZE@/$size/" "$here/control.in" >"$pkg/DEBIAN/control"
(cd "$pkg" && find . \( -path ./DEBIAN -o -path ./etc \) -prune -o -type f -printf '%P\0' | sort -z \
    | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/control" "$pkg/DEBIAN/md5sums"

deb=$out/mcrelay_${version}_${arch}.deb
dpkg-deb --build --root-owner-group -Zxz "$pkg" "$deb" >&2
echo "$deb"
