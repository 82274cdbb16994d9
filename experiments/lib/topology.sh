# shellcheck shell=bash
# What relay-throughput/run.sh and relay-latency/run.sh share, sourced by
# both: their options (--no-build, --help), the root and tool checks, the
# release build, and the backstop teardown of the three-namespace topology
# their Python halves build (mcrtp-{a,r,b}-TAG).

# mcrtp_args PY NOBUILD_HELP ARGS...: sets `build` (0 with --no-build) and
# `args` (the rest, for PY); --help prints ours and PY's and exits.
mcrtp_args() {
    local py=$1 nobuild_help=$2 arg
    shift 2
    build=1
    args=()
    for arg in "$@"; do
        case $arg in
            -h | --help)
                echo "run.sh [--no-build] [options of $(basename "$py") below]"
                printf '%s\n' "$nobuild_help"
                echo
                exec python3 "$py" --loadgen x --mcrelayd x --help
                ;;
            --no-build) build=0 ;;
            *) args+=("$arg") ;;
        esac
    done
}

# mcrtp_check ARGS...: root, the tools, ethtool, and smcroute when the
# kernel contender runs (the default contender lists include it).
mcrtp_check() {
    local tool
    if [[ $(id -u) -ne 0 ]]; then
        echo "run.sh: needs root (network namespaces, sysctl, RPS masks, ethtool); run it as root" >&2
        exit 2
    fi
    for tool in ip taskset nice sysctl python3 cargo; do
        command -v "$tool" >/dev/null || { echo "run.sh: $tool is missing" >&2; exit 2; }
    done
    if ! command -v ethtool >/dev/null; then
        echo "run.sh: installing ethtool" >&2
        apt-get install -y ethtool >/dev/null
    fi
    if [[ " $* " != *" --contenders "* || " $* " == *kernel* ]] && ! command -v smcrouted >/dev/null; then
        echo "run.sh: installing smcroute (kernel forwarding contender)" >&2
        apt-get install -y smcroute >/dev/null
    fi
}

# mcrtp_build ROOT BUILD: the release mcrelayd and loadgen (unless BUILD
# is 0), then check both are there.
mcrtp_build() {
    local root=$1 bin
    if (($2)); then
        echo "run.sh: cargo build --release -p mcrelayd -p mcrelay-loadgen" >&2
        (cd "$root" && cargo build --release -p mcrelayd -p mcrelay-loadgen)
    else
        echo "run.sh: --no-build: using the binaries in target/release as they are" >&2
    fi
    for bin in mcrelayd loadgen; do
        [[ -x $root/target/release/$bin ]] || { echo "run.sh: target/release/$bin is missing" >&2; exit 2; }
    done
}

# mcrtp_backstop TAG: on exit, kill what runs in mcrtp-{a,r,b}-TAG, delete
# them and restore net.core.netdev_max_backlog. The Python halves clean up
# themselves; this covers them being killed outright.
mcrtp_backstop() {
    mcrtp_tag=$1
    mcrtp_old_backlog=$(sysctl -n net.core.netdev_max_backlog)
    trap mcrtp_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

mcrtp_cleanup() {
    local ns pid
    for ns in "mcrtp-a-$mcrtp_tag" "mcrtp-r-$mcrtp_tag" "mcrtp-b-$mcrtp_tag"; do
        if ip netns list 2>/dev/null | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -KILL "$pid" 2>/dev/null || true
            done
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
    if [[ $(sysctl -n net.core.netdev_max_backlog) != "$mcrtp_old_backlog" ]]; then
        sysctl -qw "net.core.netdev_max_backlog=$mcrtp_old_backlog" || true
    fi
}
