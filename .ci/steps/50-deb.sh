#!/usr/bin/env bash
# The Debian package: build it (deploy/deb/build.sh), check that it holds
# every file it promises (alert rules and shell completions included),
# install it, validate the installed example config with the installed
# daemon and the alert rules with promtool, complete a command with the
# installed bash completion, find the man pages, and purge it again. Needs
# root (dpkg -i); refuses to touch a machine where mcrelay is installed.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need() { command -v "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }; }
need dpkg-shlibdeps dpkg-dev
need man man-db

if dpkg-query -W -f '${Status}' mcrelay 2>/dev/null | grep -q 'installed'; then
    echo "mcrelay is installed on this machine; not replacing it (dpkg --purge mcrelay first)"
    exit 1
fi

deb=$(deploy/deb/build.sh)
echo "built $deb"

listing=$(dpkg-deb -c "$deb" | awk '{print $NF}')
missing=0
for path in \
    ./usr/bin/mcrelayd ./usr/bin/mcrelayctl ./usr/libexec/mcrelay/mcrelay-helper \
    ./usr/lib/systemd/system/mcrelay.service \
    ./usr/lib/sysusers.d/mcrelay.conf ./usr/lib/tmpfiles.d/mcrelay.conf \
    ./etc/mcrelay/mcrelay.toml \
    ./usr/share/man/man8/mcrelayd.8.gz ./usr/share/man/man8/mcrelayctl.8.gz \
    ./usr/share/man/man5/mcrelay.toml.5.gz \
    ./usr/share/doc/mcrelay/copyright ./usr/share/doc/mcrelay/operations.md \
    ./usr/share/doc/mcrelay/configuration.md \
    ./usr/share/mcrelay/mcrelay-alerts.yml \
    ./usr/share/bash-completion/completions/mcrelayd ./usr/share/bash-completion/completions/mcrelayctl \
    ./usr/share/zsh/vendor-completions/_mcrelayd ./usr/share/zsh/vendor-completions/_mcrelayctl \
    ./usr/share/fish/vendor_completions.d/mcrelayd.fish ./usr/share/fish/vendor_completions.d/mcrelayctl.fish \
    ./usr/share/mcrelay/keepalived/mcrelay-keepalived \
    ./usr/share/doc/mcrelay/examples/keepalived/keepalived.conf; do
    grep -qxF "$path" <<<"$listing" || { echo "MISSING from the package: $path"; missing=1; }
done
[ "$missing" = 0 ] || exit 1
[ "$(dpkg-deb --ctrl-tarfile "$deb" | tar -xOf - ./conffiles)" = /etc/mcrelay/mcrelay.toml ] \
    || { echo "conffiles must list /etc/mcrelay/mcrelay.toml"; exit 1; }
dpkg-deb -f "$deb" Package Version Architecture Depends
# SRT outputs link libsrt (OpenSSL build): the runtime library must be a
# dependency, found by dpkg-shlibdeps from mcrelayd's DT_NEEDED.
dpkg-deb -f "$deb" Depends | grep -q 'libsrt' \
    || { echo "Depends must name the libsrt runtime library"; exit 1; }

# Leave the machine as found: the package keeps the mcrelay user on purge
# (Debian's rule for system users), so remove it here if this step made it.
had_user=$(getent passwd mcrelay >/dev/null && echo 1 || echo 0)
had_run=$([ -e /run/mcrelay ] && echo 1 || echo 0)
cleanup() {
    dpkg --purge mcrelay >/dev/null 2>&1 || true
    [ "$had_user" = 1 ] || userdel mcrelay 2>/dev/null || true
    [ "$had_run" = 1 ] || rmdir /run/mcrelay 2>/dev/null || true
}
trap cleanup EXIT

dpkg -i "$deb"
/usr/bin/mcrelayd check --config /etc/mcrelay/mcrelay.toml
/usr/bin/mcrelayctl --version
/usr/libexec/mcrelay/mcrelay-helper --version
[ "$(stat -c %a:%U /usr/libexec/mcrelay/mcrelay-helper)" = 755:root ] \
    || { echo "the helper program must be root-owned 0755"; exit 1; }
getent passwd mcrelay >/dev/null || { echo "postinst did not create the mcrelay user"; exit 1; }
# The shipped alert rules are the repository's, and valid (promtool comes
# with .ci/steps/27-prometheus.sh; checked where it is installed).
cmp /usr/share/mcrelay/mcrelay-alerts.yml deploy/prometheus/mcrelay-alerts.yml
if command -v promtool >/dev/null; then
    promtool check rules /usr/share/mcrelay/mcrelay-alerts.yml
fi
# The installed bash completion completes a subcommand.
got=$(bash --norc --noprofile -c 'source /usr/share/bash-completion/completions/mcrelayctl
    COMP_WORDS=(mcrelayctl rel); COMP_CWORD=1; _mcrelayctl mcrelayctl rel mcrelayctl; echo "${COMPREPLY[*]}"')
[ "$got" = reload ] || { echo "bash completion of 'mcrelayctl rel' gave '$got', want reload"; exit 1; }
if grep -rqs '^path-exclude=*/usr/share/man' /etc/dpkg/dpkg.cfg.d/; then
    # Minimal container images tell dpkg to drop man pages; dpkg-deb -c above
    # has shown they are in the package.
    echo "dpkg excludes /usr/share/man on this machine: man -w skipped"
else
    for page in mcrelayd mcrelayctl mcrelay.toml; do
        man -w "$page"
    done
fi
if command -v systemctl >/dev/null; then
    # Installed, not enabled: the operator edits the config first.
    state=$(systemctl is-enabled mcrelay.service 2>/dev/null || true)
    [ "$state" = disabled ] || { echo "mcrelay.service is '$state' after install, want disabled"; exit 1; }
fi

dpkg --purge mcrelay
for gone in /usr/bin/mcrelayd /usr/bin/mcrelayctl /usr/libexec/mcrelay /etc/mcrelay /usr/lib/systemd/system/mcrelay.service \
    /usr/share/mcrelay /usr/share/bash-completion/completions/mcrelayctl; do
    [ ! -e "$gone" ] || { echo "$gone is still there after purge"; exit 1; }
done
echo "package installs, checks its config and purges cleanly"
