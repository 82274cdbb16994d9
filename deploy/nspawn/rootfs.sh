#!/usr/bin/env bash
# A minimal Debian root filesystem for booting mcrelay's unit under a real
# systemd (deploy/nspawn/run.sh), built with debootstrap once and cached.
#
#   deploy/nspawn/rootfs.sh            # prints the cached rootfs directory
#
# The cache lives in $MCRELAY_CI_CACHE (default /var/cache/mcrelay-ci) under
# a name keyed by the suite (the host's), variant, package list and
# architecture, so changing any of them builds a new one. The Debian
# mirror is read from this machine's apt configuration at run time (deb822
# .sources or sources.list), so the rootfs comes from wherever this host
# gets its own packages. Needs root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# The host's own release: the .deb built here links against its libc, and
# its apt sources name that suite.
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || { echo "rootfs.sh: no VERSION_CODENAME in /etc/os-release (not Debian?)" >&2; exit 1; }
variant=minbase
# systemd as PID 1; iproute2 for the veths and namespaces inside the
# container; python3-minimal to send and count numbered datagrams.
# libsrt1.5-openssl: mcrelayd links libsrt (SRT outputs); the .deb depends on it.
packages=systemd,systemd-sysv,iproute2,python3-minimal,libsrt1.5-openssl
cache=${MCRELAY_CI_CACHE:-/var/cache/mcrelay-ci}

key=$(printf '%s %s %s %s\n' "$suite" "$variant" "$packages" "$(dpkg --print-architecture)" | sha256sum | cut -c1-16)
dir=$cache/rootfs-$suite-$key
if [ -e "$dir/.complete" ]; then
    echo "$dir"
    exit 0
fi

command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; } >&2

# The first URI of a Debian stanza that carries $suite (not -security,
# -updates): deb822 files first, then one-line sources.list entries.
mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # One stanza per paragraph: print its first URI if its Suites name
        # $suite, its Types include deb and it is not Enabled: no.
        awk -v suite="$suite" '
            function flush() { if (uri != "" && has && deb && !off && !done) { print uri; done = 1; exit } uri = ""; has = deb = off = 0 }
            /^[[:space:]]*$/ { flush(); next }
            /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) has = 1 }
            /^Enabled:[[:space:]]*no/ { off = 1 }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        awk -v suite="$suite" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } if ($(i + 1) == suite) print $i }' "$f"
    done
}
url=$(mirror | head -n1)
[ -n "$url" ] || { echo "rootfs.sh: no Debian '$suite' source in /etc/apt; cannot debootstrap" >&2; exit 1; }

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.rootfs-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "rootfs.sh: debootstrap $suite ($variant, +$packages) into $dir" >&2
debootstrap --variant="$variant" --include="$packages" "$suite" "$tmp" "$url" >&2
# No getty on the (absent) console, no network configuration to wait for:
# the container boots straight to multi-user.target.
chroot "$tmp" systemctl mask console-getty.service getty@.service systemd-networkd-wait-online.service >/dev/null 2>&1 || true
echo mcrelay-ci >"$tmp/etc/hostname"
rm -rf "$tmp/var/cache/apt/archives"/*.deb "$tmp/var/lib/apt/lists"/*
# mktemp made it 0700: the container's / must be traversable by its users.
chmod 0755 "$tmp"
touch "$tmp/.complete"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
