#!/usr/bin/env python3
"""End-to-end relay throughput benchmark: mcrelay vs the loadgen baseline
relay vs kernel multicast forwarding (smcroute), on one three-namespace veth
topology. Called by run.sh (which builds the binaries); standard library only.

Method: /work/shared/BENCHMARKING.md; usage and how to read the output:
README.md next to this file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

IN_GROUP, IN_PORT = "239.1.1.1", 5000
# The second leg of a two-leg (merge) flow: vA2 -> vRA2, its own group.
IN2_GROUP = "239.1.1.2"
OUT_GROUP, OUT_PORT = "239.2.2.2", 6000
FANOUT_MAX = 4  # veth pairs R -> B, always built
LOSS_LIMIT = 0.001  # a round passes at <= 0.1 % loss
SENDER_SHORT = 0.95  # achieved < 95 % of requested = the sender fell short
STEAL_LIMIT = 0.05  # repeat a round once when steal > 5 % of the window
DRAIN_S = 0.25  # after the sender: let queues drain before stopping
PAUSE_S = 0.3  # between rounds


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, capture: bool = True) -> str:
    p = subprocess.run(args, capture_output=capture, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout if capture else ""


# ---------------------------------------------------------------- /proc readers


def cpu_times() -> dict[int, list[int]]:
    """Per-CPU jiffies from /proc/stat: user nice system idle iowait irq
    softirq steal guest guest_nice."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                out[int(name[3:])] = [int(v) for v in vals]
    return out


def cpu_delta(before: list[int], after: list[int]) -> dict:
    d = [a - b for a, b in zip(after, before)]
    user, nice, system, idle, iowait, irq, softirq, steal = d[:8]
    busy = user + nice + system + irq + softirq
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return {
        "user": user, "nice": nice, "system": system, "idle": idle, "iowait": iowait,
        "irq": irq, "softirq": softirq, "steal": steal, "busy": busy, "total": total,
        "busy_ns": busy * 1e9 / CLK_TCK,
        "steal_frac": steal / total if total else 0.0,
    }


def read_snmp(pid: int) -> dict:
    """The namespace of `pid`'s /proc/net/snmp, as {"Udp": {...}, "Ip": {...}}."""
    out: dict[str, dict[str, int]] = {}
    with open(f"/proc/{pid}/net/snmp") as f:
        lines = f.read().splitlines()
    for head, vals in zip(lines[0::2], lines[1::2]):
        proto, keys = head.split(":", 1)
        _, nums = vals.split(":", 1)
        out[proto] = {k: int(v) for k, v in zip(keys.split(), nums.split())}
    return out


def read_netdev(pid: int) -> dict:
    """rx/tx packets and drops per interface of `pid`'s namespace."""
    out = {}
    with open(f"/proc/{pid}/net/dev") as f:
        for line in f.readlines()[2:]:
            name, rest = line.split(":", 1)
            v = [int(x) for x in rest.split()]
            # rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets errs drop ...
            out[name.strip()] = {"rx_packets": v[1], "rx_drop": v[3], "tx_packets": v[9], "tx_drop": v[11]}
    return out


def read_softnet() -> list[dict]:
    """Per-CPU backlog counters: processed, dropped (backlog full), time_squeeze."""
    out = []
    with open("/proc/net/softnet_stat") as f:
        for line in f:
            v = [int(x, 16) for x in line.split()]
            out.append({"processed": v[0], "dropped": v[1], "time_squeeze": v[2]})
    return out


def read_proc_file(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/net/{name}") as f:
            return f.read()
    except OSError:
        return ""


def proc_cpu(pid: int) -> dict | None:
    """utime, stime (jiffies, all threads) of a process, None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    fields = s.rsplit(")", 1)[1].split()
    return {"utime": int(fields[11]), "stime": int(fields[12])}


def delta(after, before):
    """Recursive numeric difference of two equally shaped dicts/lists."""
    if isinstance(after, dict):
        return {k: delta(v, before.get(k, 0) if isinstance(before, dict) else 0) for k, v in after.items()}
    if isinstance(after, list):
        return [delta(a, b) for a, b in zip(after, before)]
    if isinstance(after, (int, float)) and isinstance(before, (int, float)):
        return after - before
    return after


def group_hex(group: str) -> str:
    """An IPv4 address as /proc/net/igmp and ip_mr_cache print it."""
    return "".join(f"{int(o):02X}" for o in reversed(group.split(".")))


# ---------------------------------------------------------------- topology


class Topology:
    """ns A (sender) -- vA/vRA -- ns R (relay) -- vRBi/vBi (i = 1..4) -- ns B,
    and a second path into R, vA2/vRA2, for the second leg of a merge flow."""

    def __init__(self, tag: str, relay_cpu: int, harness_cpu: int, keep_uso: bool, workdir: Path):
        self.a, self.r, self.b = (f"mcrtp-{x}-{tag}" for x in "arb")
        self.relay_cpu, self.harness_cpu = relay_cpu, harness_cpu
        self.keep_uso = keep_uso
        self.workdir = workdir
        self.anchors: dict[str, subprocess.Popen] = {}
        self.old_backlog: str | None = None
        self.uso_state: dict[str, str] = {}
        # --input-gro: GRO and rx-udp-gro-forwarding on R's input veths,
        # which gives their receive a NAPI instance (SO_INCOMING_NAPI_ID).
        self.input_gro = False
        self.gro_state: dict[str, str] = {}

    def ip(self, ns: str, *args: str) -> str:
        return sh("ip", "-n", ns, *args)

    def nsexec(self, ns: str, *args: str) -> str:
        return sh("ip", "netns", "exec", ns, *args)

    def up(self) -> None:
        for ns in (self.a, self.r, self.b):
            sh("ip", "netns", "add", ns)
            self.ip(ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", "vA", "netns", self.a, "type", "veth", "peer", "name", "vRA", "netns", self.r)
        sh("ip", "link", "add", "vA2", "netns", self.a, "type", "veth", "peer", "name", "vRA2", "netns", self.r)
        addrs = [(self.a, "vA", "10.10.1.1/24"), (self.r, "vRA", "10.10.1.2/24"),
                 (self.a, "vA2", "10.10.3.1/24"), (self.r, "vRA2", "10.10.3.2/24")]
        for i in range(1, FANOUT_MAX + 1):
            sh("ip", "link", "add", f"vRB{i}", "netns", self.r, "type", "veth",
               "peer", "name", f"vB{i}", "netns", self.b)
            addrs += [(self.r, f"vRB{i}", f"10.10.{10 + i}.1/24"), (self.b, f"vB{i}", f"10.10.{10 + i}.2/24")]
        for ns, dev, addr in addrs:
            self.ip(ns, "addr", "add", addr, "dev", dev)
            self.ip(ns, "link", "set", dev, "up")
        self.ip(self.a, "route", "add", "224.0.0.0/4", "dev", "vA")
        for i in range(1, FANOUT_MAX + 1):
            self.ip(self.b, "route", "add", "224.0.0.0/4", "dev", f"vB{i}", "metric", str(i))
        for key in ["all", "default", "vRA", "vRA2"] + [f"vRB{i}" for i in range(1, FANOUT_MAX + 1)]:
            self.nsexec(self.r, "sysctl", "-qw", f"net.ipv4.conf.{key}.rp_filter=0")
        # RPS: a veth delivers on the sending CPU; steer R's receive path to
        # the relay CPU and B's to the harness CPU.
        rmask, hmask = f"{1 << self.relay_cpu:x}", f"{1 << self.harness_cpu:x}"
        for dev in ("vRA", "vRA2"):
            self.nsexec(self.r, "sh", "-c", f"echo {rmask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus")
        for i in range(1, FANOUT_MAX + 1):
            self.nsexec(self.b, "sh", "-c", f"echo {hmask} > /sys/class/net/vB{i}/queues/rx-0/rps_cpus")
        for i in range(1, FANOUT_MAX + 1):
            dev = f"vRB{i}"
            if not self.keep_uso:
                self.nsexec(self.r, "ethtool", "-K", dev, "tx-udp-segmentation", "off")
            feat = self.nsexec(self.r, "ethtool", "-k", dev)
            self.uso_state[dev] = next(
                (l.split(":", 1)[1].strip() for l in feat.splitlines() if l.strip().startswith("tx-udp-segmentation:")),
                "?")
        for dev in ("vRA", "vRA2"):
            if self.input_gro:
                self.nsexec(self.r, "ethtool", "-K", dev, "gro", "on", "rx-udp-gro-forwarding", "on")
            feat = self.nsexec(self.r, "ethtool", "-k", dev)
            self.gro_state[dev] = ", ".join(
                l.strip() for l in feat.splitlines()
                if l.strip().startswith(("generic-receive-offload:", "rx-udp-gro-forwarding:")))
        self.old_backlog = sh("sysctl", "-n", "net.core.netdev_max_backlog").strip()
        sh("sysctl", "-qw", "net.core.netdev_max_backlog=10000")
        # One idle process per namespace: its /proc/PID/net/* is that
        # namespace's view, read without spawning anything during a round.
        for ns in (self.a, self.r, self.b):
            self.anchors[ns] = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "infinity"])

    def pid(self, ns: str) -> int:
        return self.anchors[ns].pid

    def down(self) -> None:
        for p in self.anchors.values():
            stop_process(p, signal.SIGKILL)
        for ns in (self.a, self.r, self.b):
            # Anything still running in our namespaces is ours.
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.old_backlog is not None:
            subprocess.run(["sysctl", "-qw", f"net.core.netdev_max_backlog={self.old_backlog}"])
            self.old_backlog = None

    def sysinfo(self) -> dict:
        return {
            "namespaces": [self.a, self.r, self.b],
            "tx_udp_segmentation": self.uso_state,
            "input_gro": self.gro_state,
            "netdev_max_backlog": {"run": 10000, "restored_to": self.old_backlog},
            "rps_cpus": {"vRA, vRA2": f"{1 << self.relay_cpu:x}", "vBi": f"{1 << self.harness_cpu:x}"},
        }


def stop_process(p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 5.0) -> int | None:
    if p.poll() is None:
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def reap(p: subprocess.Popen, timeout: float) -> float | None:
    """Wait for `p` (SIGKILL after `timeout`) and return its user+system CPU
    seconds (rusage), setting its returncode."""
    end = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return ru.ru_utime + ru.ru_stime
        if time.monotonic() > end:
            p.kill()
            end = time.monotonic() + 5
        time.sleep(0.005)


def wait_for(cond, timeout: float, what: str, step: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(step)


# ---------------------------------------------------------------- contenders


class Relay:
    """One contender instance for one round, started in R."""

    name = "?"

    def __init__(self, bench: "Bench", fanout: int, rdir: Path):
        self.bench, self.topo = bench, bench.topo
        self.fanout, self.rdir = fanout, rdir
        self.proc: subprocess.Popen | None = None
        self.stderr_path = rdir / f"{self.name}.stderr"
        self.stdout_path = rdir / f"{self.name}.stdout"

    def out_group(self, i: int) -> tuple[str, int]:
        """(group, port) the receiver on vB{i} listens to."""
        if self.name == "kernel":
            return IN_GROUP, IN_PORT
        return self.bench.out_group(i), OUT_PORT

    def popen(self, args: list[str]) -> subprocess.Popen:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.topo.r, *args],
            stdout=open(self.stdout_path, "w"), stderr=open(self.stderr_path, "w"),
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
        self.bench.children.add(self.proc)
        return self.proc

    def joined(self, want_dev: str = "vRA", group: str = IN_GROUP) -> bool:
        """The relay has joined `group` on `want_dev` in R."""
        dev = None
        for line in read_proc_file(self.topo.pid(self.topo.r), "igmp").splitlines():
            if not line.startswith("\t"):
                parts = line.split()
                dev = parts[1] if len(parts) > 1 else None
            elif dev == want_dev and line.split()[0] == group_hex(group):
                return True
        return False

    def send_args(self) -> list[str]:
        """Extra arguments of this contender's `loadgen send`."""
        return []

    def recv_args(self) -> list[str]:
        """Extra arguments of this contender's `loadgen recv`s."""
        return []

    def check_alive(self) -> None:
        if self.proc and self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) during start:\n"
                               + self.stderr_path.read_text()[-2000:])

    def start(self) -> None:
        raise NotImplementedError

    def cpu(self) -> dict | None:
        return proc_cpu(self.proc.pid) if self.proc else None

    def extra_counters(self) -> dict:
        return {}

    def stop(self) -> dict:
        rc = stop_process(self.proc) if self.proc else None
        self.bench.children.discard(self.proc)
        return {"exit": rc}


class Mcrelay(Relay):
    name = "mcrelay"
    ingress = "socket"
    # The flow's `payload` (None: the default, "udp"), the sender's and
    # receivers' `--payload`, and the legs (2: a merge flow fed the same
    # stream on vRA and vRA2).
    payload: str | None = None
    framing = "loadgen"
    legs = 1
    # Another mcrelayd binary (--mcrelayd-before) runs this contender.
    before = False
    # Each output's `egress` ("socket" or "xdp").
    egress = "socket"
    # The flow's `latency` ("low": its worker busy-polls).
    latency = "normal"

    def send_args(self) -> list[str]:
        args = ["--payload", self.framing]
        if self.legs == 2:
            args += ["--copy-dest", f"{IN2_GROUP}:{IN_PORT}", "--copy-interface", "vA2"]
        return args

    def recv_args(self) -> list[str]:
        return ["--payload", self.framing] if self.framing != "loadgen" else []

    def flow_keys(self) -> str:
        """The flow's input(s) and payload keys."""
        leg = lambda dev, g: (f'{{ interface = "{dev}", address = "{g}", port = {IN_PORT}, '  # noqa: E731
                              f'ingress = "{self.ingress}" }}')
        if self.legs == 2:
            keys = (f"inputs = [\n  {leg('vRA', IN_GROUP)},\n  {leg('vRA2', IN2_GROUP)},\n]\n"
                    'redundancy = "merge"\n')
        else:
            keys = f"input = {leg('vRA', IN_GROUP)}\n"
        if self.payload:
            keys += f'payload = "{self.payload}"\n'
        if self.latency != "normal":
            keys += f'latency = "{self.latency}"\n'
        return keys

    def start(self) -> None:
        egress = f', egress = "{self.egress}"' if self.egress != "socket" else ""
        outs = ",\n".join(
            f'  {{ interface = "vRB{i}", address = "{g}", port = {p}, ttl = 16{egress} }}'
            for i in range(1, self.fanout + 1) for g, p in [self.out_group(i)])
        # Started as root, mcrelayd opens its sockets, then drops to
        # daemon.user (the default "mcrelay" need not exist here). The
        # control socket path must fit a sockaddr_un (107 bytes).
        sock = self.bench.logdir.parent / f"ctl-{self.bench.round_no}.sock"
        conf = (
            "[daemon]\n"
            f'user = "{self.bench.o.mcrelay_user}"\n'
            f"cores = [{self.topo.relay_cpu}]\n"
            'log_level = "info"\n'
            f'control_socket = "{sock}"\n\n'
            "[[flow]]\n"
            'name = "bench"\n'
            f"{self.flow_keys()}"
            f"outputs = [\n{outs},\n]\n"
        )
        self.ctl_sock = sock
        path = self.rdir / "mcrelay.toml"
        path.write_text(conf)
        binary = self.bench.o.mcrelayd_before if self.before else self.bench.mcrelayd
        prefix = self.bench.relay_prefix(busy_polls=self.latency == "low")
        self.popen([*prefix, str(binary), "--config", str(path)])

        def ready():
            self.check_alive()
            return ("relaying;" in self.stderr_path.read_text() and self.joined()
                    and (self.legs == 1 or self.joined("vRA2", IN2_GROUP)))

        wait_for(ready, 10, "mcrelayd to start relaying")

    def health(self) -> dict | None:
        """The flow's stream health and merge counters from the control
        socket (`stats`), for the contenders that parse their payload."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(5)
                c.connect(str(self.ctl_sock))
                c.sendall(b'{"v":1,"cmd":"stats"}\n')
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = c.recv(1 << 16)
                    if not chunk:
                        break
                    buf += chunk
            flow = json.loads(buf)["result"]["flows"][0]
            return {"health": flow.get("health"), "redundancy": flow.get("redundancy")}
        except (OSError, ValueError, KeyError, IndexError) as e:
            return {"error": repr(e)}

    def stop(self) -> dict:
        health = self.health() if self.payload and self.proc and self.proc.poll() is None else None
        r = super().stop()
        if health is not None:
            r["health"] = health
        finals = []
        for line in self.stderr_path.read_text().splitlines():
            if line.startswith("final "):
                kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
                kind = line.split()[1]
                kv["kind"] = kind if "=" not in kind else ("flow" if "packets_in" in kv else
                                                            "worker" if "turns" in kv else "?")
                finals.append({k: int(v) if v.lstrip("-").isdigit() else v for k, v in kv.items()})
        r["final"] = finals
        flow = next((f for f in finals if "packets_in" in f), {})
        outs = [f for f in finals if f.get("kind") == "output"]
        r["summary"] = {
            "packets_in": flow.get("packets_in"),
            "drop_oversize": flow.get("drop_oversize"),
            "drop_pool_exhausted": flow.get("drop_pool_exhausted"),
            "receive_errors": flow.get("receive_errors"),
            "packets_out": sum(o.get("packets_out", 0) for o in outs),
            "drop_backlog": sum(o.get("drop_backlog", 0) for o in outs),
            "drop_send_error": sum(o.get("drop_send_error", 0) for o in outs),
            "gso_sends": sum(o.get("gso_sends", 0) for o in outs),
            "gso_fallbacks": sum(o.get("gso_fallbacks", 0) for o in outs),
        }
        return r


class McrelayPacket(Mcrelay):
    """mcrelay with ingress = "packet": AF_PACKET frames parsed in user
    space instead of a UDP socket (the cost of bypassing rp_filter)."""
    name = "mcrelay-packet"
    ingress = "packet"


def napi_threads() -> dict[int, str]:
    """Every NAPI kthread (`napi/<dev>-<id>`) of the machine: pid -> name."""
    found = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                comm = (d / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("napi/"):
                found[int(d.name)] = comm
    return found


def bpf_prog_stats(ns: str, devs: list[str]) -> dict:
    """run_time_ns and run_cnt (kernel.bpf_stats_enabled=1) of the XDP
    program attached to each of `devs` in namespace `ns`, via bpftool."""
    out = {}
    for dev in devs:
        try:
            net = json.loads(sh("ip", "netns", "exec", ns, "bpftool", "net", "show", "dev", dev, "--json"))
            ids = [x["id"] for n in net for x in n.get("xdp", [])]
        except (RuntimeError, subprocess.CalledProcessError, ValueError, KeyError):
            ids = []
        for pid in ids:
            try:
                prog = json.loads(sh("bpftool", "prog", "show", "id", str(pid), "--json"))
            except (RuntimeError, subprocess.CalledProcessError, ValueError):
                continue
            out[dev] = {"id": pid, "name": prog.get("name"), "run_time_ns": prog.get("run_time_ns", 0),
                        "run_cnt": prog.get("run_cnt", 0)}
    return out


class McrelayXdp(Mcrelay):
    """mcrelay with ingress = "xdp" (issue 30): an XDP program on vRA
    steers the group to an AF_XDP socket (copy mode on veth), below the
    kernel's IP stack.

    For every XDP contender the veths whose receive runs the XDP path (the
    input's vRA) get threaded NAPI (`/sys/class/net/<dev>/threaded`), and
    the NAPI kthreads that appear (`napi/<dev>-<id>`) are pinned to the
    relay CPU, so the XDP work is charged to the relay's core; and BPF run
    time is counted (`kernel.bpf_stats_enabled=1`): the XDP program's
    run_time_ns / run_cnt over the round go into the result (per program,
    from `bpftool prog show`). `bpftool prog profile` would split that into
    cycles and instructions but needs hardware perf counters, which this
    VM does not have."""
    name = "mcrelay-xdp"
    ingress = "xdp"

    def xdp_devs(self) -> list[str]:
        """R's devices whose receive runs this contender's XDP path."""
        return ["vRA"] if self.ingress == "xdp" else []

    def start(self) -> None:
        super().start()
        self.bpf_stats_before = sh("sysctl", "-n", "kernel.bpf_stats_enabled").strip()
        sh("sysctl", "-qw", "kernel.bpf_stats_enabled=1")
        before = napi_threads()
        self.napi = {"threaded": {}, "pinned": {}}
        for dev in self.xdp_devs():
            try:
                self.topo.nsexec(self.topo.r, "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded")
                self.napi["threaded"][dev] = self.topo.nsexec(
                    self.topo.r, "cat", f"/sys/class/net/{dev}/threaded").strip()
            except (RuntimeError, subprocess.CalledProcessError) as e:
                self.napi["threaded"][dev] = f"failed: {e}"
        # The kthreads threaded NAPI just made (other runs may have their
        # own vRA: only the new ones are ours).
        deadline = time.monotonic() + 2
        new = {}
        while time.monotonic() < deadline and self.xdp_devs():
            new = {pid: n for pid, n in napi_threads().items()
                   if pid not in before and any(n.startswith(f"napi/{d}-") for d in self.xdp_devs())}
            if new:
                break
            time.sleep(0.05)
        for pid, n in new.items():
            sh("taskset", "-pc", str(self.topo.relay_cpu), str(pid))
            self.napi["pinned"][n] = {"pid": pid, "cpu": self.topo.relay_cpu}
        self.bpf0 = bpf_prog_stats(self.topo.r, self.xdp_devs())

    def extra_counters(self) -> dict:
        after = bpf_prog_stats(self.topo.r, self.xdp_devs())
        progs = {}
        for dev, a in after.items():
            b = self.bpf0.get(dev, {"run_time_ns": 0, "run_cnt": 0})
            runs = a["run_cnt"] - b["run_cnt"]
            ns = a["run_time_ns"] - b["run_time_ns"]
            progs[dev] = {**a, "round_run_cnt": runs, "round_run_time_ns": ns,
                          "ns_per_run": ns / runs if runs else None}
        return {"napi": self.napi, "bpf_prog": progs,
                "bpf_prog_profile": "not taken: bpftool prog profile needs hardware perf counters (cycles, "
                                    "instructions), which this VM lacks"}

    def stop(self) -> dict:
        before = getattr(self, "bpf_stats_before", None)
        if before is not None:
            subprocess.run(["sysctl", "-qw", f"kernel.bpf_stats_enabled={before}"], capture_output=True)
        return super().stop()


class McrelayXdpEgress(McrelayXdp):
    """mcrelay with socket ingress and egress = "xdp" (issue 30): each
    datagram leaves as a frame the worker built, on an AF_XDP socket's TX
    ring bound to vRB<i> (copy mode: the kick runs the driver's transmit
    on the relay's thread), skipping the UDP/IP output path and qdisc."""
    name = "mcrelay-xdp-egress"
    ingress = "socket"
    egress = "xdp"


class McrelayXdpFull(McrelayXdp):
    """mcrelay with ingress = "xdp" and egress = "xdp": the whole path
    below the kernel's IP stack."""
    name = "mcrelay-xdp-full"
    ingress = "xdp"
    egress = "xdp"


class McrelayLow(Mcrelay):
    """mcrelay (socket ingress) with latency = "low": the worker
    busy-polls instead of sleeping, spending the relay core."""
    name = "mcrelay-low"
    latency = "low"


class McrelayXdpFullLow(McrelayXdpFull):
    """mcrelay-xdp-full with latency = "low"."""
    name = "mcrelay-xdp-full-low"
    latency = "low"


class McrelayBefore(Mcrelay):
    """mcrelay run by the --mcrelayd-before binary: a before/after
    comparison inside one interleaved run."""
    name = "mcrelay-before"
    before = True


class McrelayPacketBefore(McrelayPacket):
    name = "mcrelay-packet-before"
    before = True


class McrelayRtp(Mcrelay):
    """payload = "rtp": RTP health (sequence, jitter) on every datagram,
    fed RTP (then the loadgen payload)."""
    name = "mcrelay-rtp"
    payload = framing = "rtp"


class McrelayRtpMpegts(Mcrelay):
    """payload = "rtp-mpegts": RTP and per-PID TS continuity on every
    datagram, fed RTP carrying TS packets (the size is the RTP payload:
    1316 B = 7 TS packets, 1328 B on the wire)."""
    name = "mcrelay-rtp-mpegts"
    payload = framing = "rtp-mpegts"


class McrelayMerge(Mcrelay):
    """A two-leg SMPTE 2022-7 merge flow (payload = "rtp"), fed the same RTP
    stream on vRA and vRA2: every datagram arrives twice, once leaves."""
    name = "mcrelay-merge"
    payload = framing = "rtp"
    legs = 2


class Baseline(Relay):
    name = "baseline"

    def start(self) -> None:
        args = [*self.bench.relay_prefix(), str(self.bench.loadgen), "relay",
                "--input", f"{IN_GROUP}:{IN_PORT}", "--input-interface", "vRA", "--batch", "64", "--json"]
        for i in range(1, self.fanout + 1):
            g, p = self.out_group(i)
            args += ["--output", f"{g}:{p}", "--output-interface", f"vRB{i}"]
        self.popen(args)

        def ready():
            self.check_alive()
            return self.joined()

        wait_for(ready, 10, "the baseline relay to join")
        time.sleep(0.05)  # output sockets are opened right after the join

    def stop(self) -> dict:
        r = super().stop()
        try:
            r["summary"] = json.loads(self.stdout_path.read_text().strip().splitlines()[-1])
        except (IndexError, ValueError):
            r["summary"] = None
        return r


class Kernel(Relay):
    name = "kernel"

    def start(self) -> None:
        oifs = " ".join(f"vRB{i}" for i in range(1, self.fanout + 1))
        phy = "\n".join(f"phyint {d} enable" for d in ["vRA"] + [f"vRB{i}" for i in range(1, FANOUT_MAX + 1)])
        conf = f"{phy}\nmroute from vRA source 10.10.1.1 group {IN_GROUP} to {oifs}\n"
        path = self.rdir / "smcroute.conf"
        path.write_text(conf)
        ident = f"mcrtp-{os.getpid()}"
        self.popen(["smcrouted", "-n", "-N", "-f", str(path), "-i", ident, "-l", "notice",
                    "-P", str(self.rdir / "smcroute.pid"), "-u", str(self.rdir / "smcroute.sock")])
        want = self.fanout

        def ready():
            self.check_alive()
            for line in read_proc_file(self.topo.pid(self.topo.r), "ip_mr_cache").splitlines()[1:]:
                f = line.split()
                if f and f[0] == group_hex(IN_GROUP) and len(f[6:]) == want:
                    return True
            return False

        wait_for(ready, 10, "smcrouted to install the MFC entry")

    def extra_counters(self) -> dict:
        pid = self.topo.pid(self.topo.r)
        return {"ip_mr_cache": read_proc_file(pid, "ip_mr_cache"), "ip_mr_vif": read_proc_file(pid, "ip_mr_vif")}


CONTENDERS = {"mcrelay": Mcrelay, "mcrelay-before": McrelayBefore, "mcrelay-packet": McrelayPacket,
              "mcrelay-xdp": McrelayXdp, "mcrelay-xdp-egress": McrelayXdpEgress,
              "mcrelay-xdp-full": McrelayXdpFull, "mcrelay-low": McrelayLow,
              "mcrelay-xdp-full-low": McrelayXdpFullLow,
              "mcrelay-packet-before": McrelayPacketBefore, "mcrelay-rtp": McrelayRtp,
              "mcrelay-rtp-mpegts": McrelayRtpMpegts, "mcrelay-merge": McrelayMerge,
              "baseline": Baseline, "kernel": Kernel}


# ---------------------------------------------------------------- the bench


class Bench:
    def __init__(self, opts, topo: Topology, logdir: Path):
        self.o, self.topo, self.logdir = opts, topo, logdir
        self.loadgen = opts.loadgen
        self.mcrelayd = opts.mcrelayd
        self.children: set[subprocess.Popen] = set()
        self.rounds: list[dict] = []
        self.round_no = 0
        self.distinct_groups = opts.distinct_groups
        # Extra arguments of every `loadgen send` / `loadgen recv` (the
        # latency benchmark next door adds --timestamp / --latency).
        self.send_extra: list[str] = []
        self.recv_extra: list[str] = []

    def out_group(self, i: int) -> str:
        if self.distinct_groups:
            return f"239.2.2.{10 + i}"
        return OUT_GROUP

    def relay_prefix(self, busy_polls: bool = False) -> list[str]:
        """How the relay is started: on the relay CPU. A daemon whose
        worker busy-polls (latency = "low") is not confined there as a
        whole: its worker pins itself (daemon.cores), and its other
        threads (control, metrics) would never run beside it."""
        pin = [] if busy_polls else ["taskset", "-c", str(self.topo.relay_cpu)]
        return ["nice", "-n", str(self.o.relay_nice), *pin]

    def kill_children(self) -> None:
        for p in list(self.children):
            stop_process(p, signal.SIGKILL, 2)
        self.children.clear()

    def spawn(self, ns: str, args: list[str], out: Path) -> subprocess.Popen:
        p = subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=open(out, "w"),
                             stderr=subprocess.STDOUT)
        self.children.add(p)
        return p

    def one_round(self, contender: str, size: int, fanout: int, rate: int, seconds: float,
                  receivers: int | None = None, tag: str = "search") -> dict:
        """Relay, receivers, a paced send; everything measured. `receivers`
        (default `fanout`) receivers listen, receiver i on vB{i}."""
        self.round_no += 1
        t_round = time.monotonic()
        run_id = 1000 + self.round_no
        nrx = receivers or fanout
        rdir = self.logdir / f"{self.round_no:04d}-{contender}-{size}B-1to{fanout}-{rate}pps"
        rdir.mkdir(parents=True)
        relay = CONTENDERS[contender](self, fanout, rdir)
        topo, hc = self.topo, str(self.topo.harness_cpu)
        rxs = []
        try:
            relay.start()
            for i in range(1, nrx + 1):
                g, p = relay.out_group(i)
                ready = rdir / f"rx{i}.ready"
                rxs.append(self.spawn(topo.b, [
                    "nice", "-n", str(self.o.receiver_nice), "taskset", "-c", hc, str(self.loadgen), "recv",
                    "--group", f"{g}:{p}", "--interface", f"vB{i}", "--json", "--run-id", str(run_id),
                    "--idle-exit", "0", "--duration", str(seconds + 60), "--ready-file", str(ready),
                    *relay.recv_args(), *self.recv_extra],
                    rdir / f"rx{i}.out"))
                wait_for(lambda r=ready, p=rxs[-1]: r.exists() or p.poll() is not None, 10, f"receiver {i}")
                if rxs[-1].poll() is not None:
                    raise RuntimeError(f"receiver {i} exited: {(rdir / f'rx{i}.out').read_text()}")
            time.sleep(0.05)  # IGMP joins settle
            pa, pr, pb = topo.pid(topo.a), topo.pid(topo.r), topo.pid(topo.b)
            before = {"snmp_r": read_snmp(pr), "snmp_b": read_snmp(pb), "dev_r": read_netdev(pr),
                      "dev_b": read_netdev(pb), "dev_a": read_netdev(pa), "softnet": read_softnet()}
            relay_cpu0 = relay.cpu()
            cpu0 = cpu_times()
            t0 = time.monotonic()
            sender = self.spawn(topo.a, [
                "nice", "-n", str(self.o.sender_nice), "taskset", "-c", hc, str(self.loadgen), "send", "--dest", f"{IN_GROUP}:{IN_PORT}",
                "--interface", "vA", "--rate", str(rate), "--duration", str(seconds), "--size", str(size),
                "--run-id", str(run_id), "--json", *relay.send_args(), *self.send_extra], rdir / "sender.out")
            sender_ru = reap(sender, seconds + 60)
            self.children.discard(sender)
            time.sleep(DRAIN_S)
            cpu1 = cpu_times()
            wall = time.monotonic() - t0
            relay_cpu1 = relay.cpu()
            after = {"snmp_r": read_snmp(pr), "snmp_b": read_snmp(pb), "dev_r": read_netdev(pr),
                     "dev_b": read_netdev(pb), "dev_a": read_netdev(pa), "softnet": read_softnet()}
            extra = relay.extra_counters()
            if sender.returncode != 0:
                raise RuntimeError(f"sender failed: {(rdir / 'sender.out').read_text()}")
            snd = json.loads((rdir / "sender.out").read_text().strip().splitlines()[-1])
            outs = []
            rx_ru = []
            for i, p in enumerate(rxs, 1):
                p.send_signal(signal.SIGTERM)
                rx_ru.append(reap(p, 5))
                self.children.discard(p)
                txt = (rdir / f"rx{i}.out").read_text().strip()
                try:
                    outs.append(json.loads(txt.splitlines()[-1]))
                except (IndexError, ValueError):
                    raise RuntimeError(f"receiver {i} printed no JSON: {txt[-500:]}")
            rel = relay.stop()
        finally:
            for p in rxs:
                stop_process(p, signal.SIGKILL, 2)
                self.children.discard(p)
            if relay.proc and relay.proc.poll() is None:
                relay.stop()
        d = delta(after, before)
        rc, hcpu = cpu_delta(cpu0[topo.relay_cpu], cpu1[topo.relay_cpu]), cpu_delta(
            cpu0[topo.harness_cpu], cpu1[topo.harness_cpu])
        sent = snd["sent"]
        delivered = sum(o["unique"] for o in outs[:fanout])
        expected = sent * fanout
        lost = expected - delivered
        corrupt = sum(o["corrupt"] for o in outs)
        dups = sum(o["duplicates"] for o in outs)
        # Anything a receiver beyond the fan-out got is a leak between
        # interfaces (the IP_MULTICAST_ALL check).
        leaked = sum(o["received"] for o in outs[fanout:])
        loss_frac = lost / expected if expected else 1.0
        passed = loss_frac <= LOSS_LIMIT and corrupt == 0 and dups == 0 and leaked == 0 and sent > 0
        relay_proc = None
        if relay_cpu0 and relay_cpu1:
            relay_proc = {k: relay_cpu1[k] - relay_cpu0[k] for k in relay_cpu0}
        # Process time on the relay CPU that is not the relay's: other
        # users' jobs on this shared machine. Kernel forwarding is all
        # softirq (smcrouted idles), so all process time there is foreign.
        proc_time = rc["user"] + rc["nice"] + rc["system"]
        foreign = None
        if contender == "kernel":
            foreign = proc_time
        elif relay_proc:
            foreign = max(0, proc_time - relay_proc["utime"] - relay_proc["stime"])
        adj_busy_ns = (rc["busy"] - foreign) * 1e9 / CLK_TCK if foreign is not None else None
        # The same on the harness CPU: process time there that is neither
        # the sender's nor the receivers' (rusage: exact, not ticks).
        harness_proc_s = sum(ru for ru in [sender_ru, *rx_ru] if ru is not None)
        harness_foreign = max(0.0, (hcpu["user"] + hcpu["nice"] + hcpu["system"]) / CLK_TCK - harness_proc_s)
        where = {
            "R_udp_rcvbuf_errors": d["snmp_r"]["Udp"]["RcvbufErrors"],
            "R_udp_in_errors": d["snmp_r"]["Udp"]["InErrors"],
            "R_vRA_rx_drop": d["dev_r"]["vRA"]["rx_drop"] + d["dev_r"]["vRA2"]["rx_drop"],
            # A veth whose peer has an XDP program hands its frames to the
            # peer's NAPI through a 256-entry ring; what that ring refuses
            # is counted as a tx drop on the sending side (vA), in A.
            "A_vA_tx_drop": d["dev_a"]["vA"]["tx_drop"] + d["dev_a"]["vA2"]["tx_drop"],
            "R_vRB_tx_drop": sum(d["dev_r"][f"vRB{i}"]["tx_drop"] for i in range(1, FANOUT_MAX + 1)),
            "B_udp_rcvbuf_errors": d["snmp_b"]["Udp"]["RcvbufErrors"],
            "B_vB_rx_drop": sum(d["dev_b"][f"vB{i}"]["rx_drop"] for i in range(1, FANOUT_MAX + 1)),
            "receiver_kernel_drops": sum(o.get("kernel_drops") or 0 for o in outs),
            "softnet_dropped": [c["dropped"] for c in d["softnet"]],
            "R_vRA_rx_packets": d["dev_r"]["vRA"]["rx_packets"],
            "R_vRA2_rx_packets": d["dev_r"]["vRA2"]["rx_packets"],
            "R_vRB_tx_packets": [d["dev_r"][f"vRB{i}"]["tx_packets"] for i in range(1, FANOUT_MAX + 1)],
        }
        r = {
            "round": self.round_no, "tag": tag, "contender": contender, "size": size, "fanout": fanout,
            "receivers": nrx, "run_id": run_id, "requested_pps": rate, "seconds": seconds,
            "logdir": str(rdir),
            "sent": sent, "achieved_pps": snd["pps"], "send_seconds": snd["seconds"],
            "send_errors": snd.get("send_errors"),
            "copies_sent": snd.get("copies_sent"), "copy_send_errors": snd.get("copy_send_errors"),
            "sender_short": snd["pps"] < SENDER_SHORT * rate,
            "delivered": delivered, "expected": expected, "lost": lost, "loss_frac": loss_frac,
            "corrupt": corrupt, "duplicates": dups, "leaked": leaked,
            "reordered": sum(o["reordered"] for o in outs),
            "per_receiver": [{k: o.get(k) for k in ("received", "unique", "lost", "corrupt", "duplicates",
                                                    "reordered", "wrong_run", "short", "kernel_drops", "rcvbuf",
                                                    "latency")}
                             for o in outs],
            "passed": passed,
            "relay_cpu": rc, "harness_cpu": hcpu, "window_s": wall,
            "harness_process_s": harness_proc_s,
            "harness_foreign_frac": harness_foreign * CLK_TCK / hcpu["total"] if hcpu["total"] else None,
            "relay_process_jiffies": relay_proc, "foreign_jiffies": foreign,
            "foreign_frac": foreign / rc["total"] if foreign is not None and rc["total"] else None,
            "ns_per_delivered": rc["busy_ns"] / delivered if delivered else None,
            "ns_per_input": rc["busy_ns"] / (delivered / fanout) if delivered else None,
            "ns_per_delivered_adj": adj_busy_ns / delivered if delivered and adj_busy_ns is not None else None,
            "round_wall_s": time.monotonic() - t_round,
            "where": where, "relay": rel, "extra": extra,
        }
        r["limit_side"] = self.limit_side(r)
        self.rounds.append(r)
        (rdir / "round.json").write_text(json.dumps(r, indent=1))
        log(f"  #{r['round']:<4} {contender:8} {size:5}B 1->{fanout} req {rate/1e3:7.1f}k "
            f"got {r['achieved_pps']/1e3:7.1f}k  loss {loss_frac*100:7.3f}%  "
            f"{'PASS' if passed else 'fail'}"
            f"{'  sender-short' if r['sender_short'] else ''}"
            f"  cpu{topo.relay_cpu} busy {rc['busy']*100/max(rc['total'],1):3.0f}% steal {rc['steal_frac']*100:.1f}%"
            f" (cpu{topo.harness_cpu} {hcpu['busy']*100/max(hcpu['total'],1):3.0f}%,"
            f" foreign {(r['harness_foreign_frac'] or 0)*100:.0f}%)"
            f"  {r['ns_per_delivered'] or 0:7.0f} ns/pkt (adj {r['ns_per_delivered_adj'] or 0:.0f},"
            f" foreign {(r['foreign_frac'] or 0)*100:.0f}%)"
            + ("" if passed else f"  [{r['limit_side']}: {self.where_text(r)}]"))
        time.sleep(PAUSE_S)
        return r

    @staticmethod
    def where_text(r: dict) -> str:
        w = r["where"]
        parts = [f"{k}={v}" for k, v in w.items() if k not in ("R_vRA_rx_packets", "R_vRA2_rx_packets", "R_vRB_tx_packets")
                 and v and (not isinstance(v, list) or any(v))]
        s = (r["relay"].get("summary") or {}) if isinstance(r.get("relay"), dict) else {}
        for k in ("drop_pool_exhausted", "drop_backlog", "drop_send_error", "drops", "send_errors", "kernel_drops"):
            if s.get(k):
                parts.append(f"relay.{k}={s[k]}")
        if r["corrupt"] or r["duplicates"] or r["leaked"]:
            parts.append(f"corrupt={r['corrupt']} dup={r['duplicates']} leaked={r['leaked']}")
        return " ".join(parts) or "no counter saw it"

    def limit_side(self, r: dict) -> str:
        """Which box lost the packets: 'R' (relay box), 'B' (receivers:
        the harness), 'A' or '?'."""
        if r["passed"]:
            return "-"
        w = r["where"]
        s = (r["relay"].get("summary") or {}) if isinstance(r.get("relay"), dict) else {}
        r_side = (w["R_udp_rcvbuf_errors"] + w["R_vRA_rx_drop"] + w["R_vRB_tx_drop"]
                  + w.get("A_vA_tx_drop", 0)
                  + (s.get("drop_pool_exhausted") or 0) + (s.get("drop_backlog") or 0)
                  + (s.get("drop_send_error") or 0) + (s.get("drops") or 0))
        b_side = w["B_udp_rcvbuf_errors"] + w["B_vB_rx_drop"]
        if r["corrupt"] or r["duplicates"] or r["leaked"]:
            return "integrity"
        if r_side and b_side:
            return "R+B"
        if r_side:
            return "R"
        if b_side:
            return "B"
        # Backlog (softnet) drops are per CPU: the relay CPU's are R's (RPS
        # steers R's receive there), the harness CPU's are B's.
        sd = w["softnet_dropped"]
        if sd[self.topo.relay_cpu]:
            return "R"
        if sd[self.topo.harness_cpu]:
            return "B"
        return "?"

    def measured_round(self, *args, **kw) -> dict:
        """A round, repeated once when steal took > 5 % of the relay CPU's
        (or the harness CPU's) window."""
        r = self.one_round(*args, **kw)
        stolen = max(r["relay_cpu"]["steal_frac"], r["harness_cpu"]["steal_frac"])
        if stolen > STEAL_LIMIT:
            log(f"  steal {stolen*100:.1f}% > {STEAL_LIMIT*100:.0f}%: repeating round #{r['round']}")
            r["superseded"] = True
            r2 = self.one_round(*args, **kw)
            r2["repeat_of"] = r["round"]
            return r2
        return r

    # ------------------------------------------------------------ search

    def search(self, contender: str, size: int, fanout: int, rep: int, start: float | None) -> dict:
        """Max lossless rate: step from `start` (×2 cold, ×1.25 warm) until
        the outcome flips, then bisect to ~5 %; at most max_steps rounds."""
        o = self.o
        warm = start is not None
        rate = int(start if warm else o.start_rate)
        factor = 1.25 if warm else 2.0
        lo = None  # best passing round
        hi_rate = None  # lowest rate (achieved, if below the request) that failed
        steps = 0
        rounds = []
        sender_limited = False
        sender_stumbles = 0
        short_at = None  # requested rate of the last sender-short pass
        while steps < o.max_steps:
            r = self.measured_round(contender, size, fanout, rate, o.round_seconds)
            r["rep"] = rep
            rounds.append(r["round"])
            steps += 1
            if r["passed"]:
                if lo is None or r["achieved_pps"] > lo["achieved_pps"]:
                    lo = r
                if r["sender_short"]:
                    if hi_rate is None:
                        # Never failed: the sender is the limit, if it falls
                        # short twice in a row (once may be a neighbour's job
                        # on its CPU).
                        if short_at == rate:
                            sender_limited = True
                            break
                        short_at = rate
                        sender_stumbles += 1
                        continue
                    # Bracketed already: the sender merely stumbled (CPU 0 is
                    # shared); the bisection goes on from what it achieved.
                    sender_stumbles += 1
            else:
                # The rate that reached the relay: a short sender lowers it.
                hit = min(rate, int(r["achieved_pps"]))
                hi_rate = hit if hi_rate is None else min(hi_rate, hit)
            if hi_rate is None:  # all passed so far: go up
                rate = int(rate * factor)
            elif lo is None:  # all failed so far: go down
                if rate <= 500:
                    break
                rate = max(int(rate / factor), 500)
            else:
                lo_rate = min(lo["requested_pps"], int(lo["achieved_pps"]))
                if (hi_rate - lo_rate) / lo_rate <= o.resolution:
                    break
                rate = int((lo_rate + hi_rate) / 2)
        result = {
            "contender": contender, "size": size, "fanout": fanout, "rep": rep, "rounds": rounds,
            "steps": steps, "sender_limited": sender_limited, "warm_start": warm,
            "sender_short_retries": sender_stumbles,
            "failed_at_pps": hi_rate,
            "max_lossless_pps": lo["achieved_pps"] if lo else 0.0,
            "max_lossless_requested_pps": lo["requested_pps"] if lo else None,
            "best_round": lo["round"] if lo else None,
            "ns_per_delivered": lo["ns_per_delivered"] if lo else None,
            "ns_per_input": lo["ns_per_input"] if lo else None,
            "ns_per_delivered_adj": lo["ns_per_delivered_adj"] if lo else None,
            "steal_frac": lo["relay_cpu"]["steal_frac"] if lo else None,
            "foreign_frac": lo["foreign_frac"] if lo else None,
            "reordered": lo["reordered"] if lo else None,
        }
        # Where the first failure above the max lost its packets.
        fails = [x for x in self.rounds if x["round"] in rounds and not x["passed"] and not x.get("superseded")]
        if fails:
            f = min(fails, key=lambda x: x["requested_pps"])
            result["limit_side"] = f["limit_side"]
            result["limit_detail"] = self.where_text(f)
        else:
            result["limit_side"] = "sender" if sender_limited else "steps"
        if o.confirm and lo and not sender_limited:
            c = self.measured_round(contender, size, fanout, lo["requested_pps"], o.round_seconds, tag="confirm")
            result["confirm_round"] = c["round"]
            result["confirm_passed"] = c["passed"]
            if c["passed"]:
                for k in ("ns_per_delivered", "ns_per_input", "ns_per_delivered_adj", "foreign_frac"):
                    result[k] = c[k]
        if o.saturation and lo:
            # Graceful overload: an unpaced sender (as fast as it goes, well
            # above the max lossless rate when the relay is the limit) for
            # one round; what the relay still delivers, per output.
            sat = self.measured_round(contender, size, fanout, 0, o.round_seconds, tag="saturation")
            sat["rep"] = rep
            per_output = sat["delivered"] / fanout
            secs = sat["send_seconds"] or o.round_seconds
            result["saturation_round"] = sat["round"]
            result["saturation_offered_pps"] = sat["achieved_pps"]
            result["saturation_delivered_pps"] = per_output / secs
            result["saturation_ratio"] = (per_output / secs) / result["max_lossless_pps"] if result["max_lossless_pps"] else None
            log(f"  saturation: offered {sat['achieved_pps']/1e3:.1f} kpps, delivered "
                f"{result['saturation_delivered_pps']/1e3:.1f} kpps per output = "
                f"{(result['saturation_ratio'] or 0):.2f}x the max lossless rate")
        log(f"= {contender} {size}B 1->{fanout} rep {rep}: max lossless "
            f"{'>= ' if sender_limited else ''}{result['max_lossless_pps']/1e3:.1f} kpps"
            f"{' (sender-limited)' if sender_limited else ''}, "
            f"{result['ns_per_delivered'] or 0:.0f} ns/delivered pkt, limit: {result['limit_side']}")
        return result

    # ------------------------------------------------------------ preflight

    def preflight(self, contenders: list[str]) -> dict:
        """Per-interface delivery with IP_MULTICAST_ALL off, at a low rate:
        (a) fan-out 4, each receiver on its own vBi gets every datagram
        once; (b) fan-out 1 with four receivers: vB2..vB4 get nothing."""
        res = {}
        checks = []
        for c in contenders:
            checks.append((c, 4, 4))
            checks.append((c, 1, 4))
        for c, fanout, nrx in checks:
            r = self.one_round(c, 1316, fanout, 5000, 1.0, receivers=nrx, tag="preflight")
            per = [(x["received"], x["unique"], x["duplicates"]) for x in r["per_receiver"]]
            ok = all(x[0] == r["sent"] and x[2] == 0 for x in per[:fanout]) and all(x[0] == 0 for x in per[fanout:])
            res[f"{c} 1->{fanout} with {nrx} receivers"] = {
                "ok": ok, "sent": r["sent"], "received_unique_duplicates_per_receiver": per, "round": r["round"]}
            log(f"preflight {c} 1->{fanout}, {nrx} receivers: sent {r['sent']}, per receiver "
                f"(received, unique, dups) {per}: {'OK' if ok else 'FAILED'}")
        return res


# ---------------------------------------------------------------- summary


def summarize(searches: list[dict]) -> list[dict]:
    rows = []
    keys = []
    for s in searches:
        k = (s["contender"], s["size"], s["fanout"])
        if k not in keys:
            keys.append(k)
    for k in sorted(keys, key=lambda k: (-k[1], k[2], list(CONTENDERS).index(k[0]))):
        ss = [s for s in searches if (s["contender"], s["size"], s["fanout"]) == k]
        rates = [s["max_lossless_pps"] for s in ss]
        nsd = [s["ns_per_delivered"] for s in ss if s["ns_per_delivered"] is not None]
        nsi = [s["ns_per_input"] for s in ss if s["ns_per_input"] is not None]
        nsa = [s["ns_per_delivered_adj"] for s in ss if s.get("ns_per_delivered_adj") is not None]
        ff = [s["foreign_frac"] for s in ss if s.get("foreign_frac") is not None]
        sat = [s["saturation_ratio"] for s in ss if s.get("saturation_ratio") is not None]
        sat_off = [s["saturation_offered_pps"] for s in ss if s.get("saturation_offered_pps") is not None]
        sat_del = [s["saturation_delivered_pps"] for s in ss if s.get("saturation_delivered_pps") is not None]
        rows.append({
            "contender": k[0], "size": k[1], "fanout": k[2], "reps": len(ss),
            "max_lossless_pps_median": statistics.median(rates),
            "max_lossless_pps_min": min(rates), "max_lossless_pps_max": max(rates),
            "output_pps_median": statistics.median(rates) * k[2],
            "sender_limited": sum(s["sender_limited"] for s in ss),
            "ns_per_delivered_median": statistics.median(nsd) if nsd else None,
            "ns_per_delivered_min": min(nsd) if nsd else None,
            "ns_per_delivered_max": max(nsd) if nsd else None,
            "ns_per_input_median": statistics.median(nsi) if nsi else None,
            "ns_per_delivered_adj_median": statistics.median(nsa) if nsa else None,
            "foreign_frac_max": max(ff) if ff else None,
            "limit_sides": [s["limit_side"] for s in ss],
            "reordered": [s["reordered"] for s in ss],
            "saturation_ratio_median": statistics.median(sat) if sat else None,
            "saturation_ratio_min": min(sat) if sat else None,
            "saturation_offered_pps_median": statistics.median(sat_off) if sat_off else None,
            "saturation_delivered_pps_median": statistics.median(sat_del) if sat_del else None,
        })
    return rows


def table(rows: list[dict]) -> str:
    head = ("| relay | size B | fan-out | max lossless in, kpps: median (min–max) | out kpps | "
            "ns / delivered pkt: median (min–max) | ns / input pkt | ns / delivered, foreign removed "
            "| limited by (per rep) | saturation: offered → delivered kpps, ratio to max lossless (min) |")
    lines = [head, "|" + "---|" * 10]
    fmt = lambda v: f"{v:.0f}" if v is not None else "–"  # noqa: E731
    for r in rows:
        sl = r["sender_limited"]
        ge = "≥ " if sl == r["reps"] else ""
        flag = f", sender-limited {sl}/{r['reps']}" if sl else ""
        ns = (f"{r['ns_per_delivered_median']:.0f} ({r['ns_per_delivered_min']:.0f}–{r['ns_per_delivered_max']:.0f})"
              if r["ns_per_delivered_median"] is not None else "–")
        ff = r.get("foreign_frac_max")
        adj = fmt(r.get("ns_per_delivered_adj_median")) + (f" (foreign ≤ {ff*100:.0f} %)" if ff else "")
        lines.append(
            f"| {r['contender']} | {r['size']} | 1→{r['fanout']} | "
            f"{ge}{r['max_lossless_pps_median']/1e3:.1f} ({r['max_lossless_pps_min']/1e3:.1f}–"
            f"{r['max_lossless_pps_max']/1e3:.1f}){flag} | {r['output_pps_median']/1e3:.1f} | {ns} | "
            f"{fmt(r['ns_per_input_median'])} | {adj} | {' '.join(r['limit_sides'])} | {sat_text(r)} |")
    return "\n".join(lines)


def sat_text(r: dict) -> str:
    if r.get("saturation_ratio_median") is None:
        return "–"
    return (f"{r['saturation_offered_pps_median']/1e3:.1f} → {r['saturation_delivered_pps_median']/1e3:.1f}, "
            f"{r['saturation_ratio_median']:.2f}× ({r['saturation_ratio_min']:.2f})")


def private_binaries(o, logdir: Path) -> None:
    """Copy the binaries `o` names into logdir/bin and point `o` at the
    copies: a concurrent `cargo build` must not swap a binary mid-run.
    mcrelayd runs the privileged helper program found beside it, so
    mcrelay-helper is copied with it, and --mcrelayd-before gets a
    directory of its own (bin/before) for its own helper."""
    for attr in ("loadgen", "mcrelayd", "mcrelayd_before"):
        if getattr(o, attr) is None:
            continue
        src = getattr(o, attr)
        bindir = logdir / "bin" / ("before" if attr == "mcrelayd_before" else "")
        bindir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, bindir / src.name)
        helper = src.with_name("mcrelay-helper")
        if attr != "loadgen" and helper.is_file():
            shutil.copy2(helper, bindir / helper.name)
        setattr(o, attr, bindir / src.name)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="1316,64")
    ap.add_argument("--fanouts", default="1,4")
    ap.add_argument("--contenders", default="mcrelay,baseline,kernel")
    ap.add_argument("--round-seconds", type=float, default=3.0)
    ap.add_argument("--no-saturation", dest="saturation", action="store_false",
                    help="skip the unpaced saturation round after each search")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 rep, 1316 B only, 1.5 s rounds, at most 6 steps per search")
    ap.add_argument("--keep-uso", action="store_true",
                    help="leave tx-udp-segmentation on on R's output veths (default: off)")
    ap.add_argument("--input-gro", action="store_true",
                    help="turn gro and rx-udp-gro-forwarding on on R's input veths (default: as created, off), "
                         "which gives their receive a NAPI id (for NAPI busy polling)")
    ap.add_argument("--start-rate", type=int, default=20000, help="first rate of a cold search (pps)")
    ap.add_argument("--max-steps", type=int, default=9, help="rounds per search at most")
    ap.add_argument("--resolution", type=float, default=0.05, help="bisection stops at this relative gap")
    ap.add_argument("--confirm", action="store_true",
                    help="one more round at the max lossless rate; its CPU figure is reported")
    ap.add_argument("--no-warm-start", action="store_true",
                    help="start every repetition's search cold (default: reps 2+ start near rep 1's result)")
    ap.add_argument("--skip-preflight", action="store_true")
    ap.add_argument("--distinct-groups", action="store_true",
                    help="mcrelay/baseline send to 239.2.2.1i per output (auto if the preflight finds a leak)")
    ap.add_argument("--mcrelay-user", default="nobody",
                    help="daemon.user of mcrelayd: started as root it drops to this user")
    ap.add_argument("--relay-cpu", type=int, default=1)
    ap.add_argument("--harness-cpu", type=int, default=0)
    ap.add_argument("--receiver-nice", type=int, default=-5)
    ap.add_argument("--sender-nice", type=int, default=0)
    ap.add_argument("--relay-nice", type=int, default=0,
                    help="nice of mcrelayd / the baseline (kernel forwarding runs in softirq)")
    ap.add_argument("--loadgen", type=Path, required=True)
    ap.add_argument("--mcrelayd", type=Path, required=True)
    ap.add_argument("--mcrelayd-before", type=Path,
                    help="another mcrelayd for the contenders mcrelay-before / mcrelay-packet-before "
                         "(the same configuration: a before/after inside one interleaved run)")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--tag", default=str(os.getpid()), help="suffix of the namespace names")
    o = ap.parse_args()
    if o.quick:
        o.reps, o.sizes, o.max_steps = 1, "1316", min(o.max_steps, 6)
        if o.round_seconds == 3.0:
            o.round_seconds = 1.5
    sizes = [int(x) for x in o.sizes.split(",") if x]
    fanouts = [int(x) for x in o.fanouts.split(",") if x]
    contenders = [x for x in o.contenders.split(",") if x]
    for c in contenders:
        if c not in CONTENDERS:
            ap.error(f"unknown contender {c!r}; use {','.join(CONTENDERS)}")
        if getattr(CONTENDERS[c], "before", False) and not o.mcrelayd_before:
            ap.error(f"{c} needs --mcrelayd-before PATH")
    for f in fanouts:
        if not 1 <= f <= FANOUT_MAX:
            ap.error(f"fan-out {f} not in 1..{FANOUT_MAX}")
    if os.geteuid() != 0:
        print("relay_throughput.py needs root (network namespaces, sysctl, RPS)", file=sys.stderr)
        return 2
    if "kernel" in contenders and not shutil.which("smcrouted"):
        print("smcrouted missing: apt-get install -y smcroute", file=sys.stderr)
        return 2
    if not shutil.which("ethtool"):
        print("ethtool missing: apt-get install -y ethtool", file=sys.stderr)
        return 2
    if os.cpu_count() and max(o.relay_cpu, o.harness_cpu) >= os.cpu_count():
        print(f"need CPUs {o.harness_cpu} and {o.relay_cpu}", file=sys.stderr)
        return 2

    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    logdir = Path(tempfile.mkdtemp(prefix=f"relay-throughput-{stamp}-"))
    # mcrelayd's helper reads the round's config after dropping to
    # --mcrelay-user: mkdtemp's 0700 would hide it.
    logdir.chmod(0o755)
    private_binaries(o, logdir)
    log(f"logs: {logdir}")
    topo = Topology(o.tag, o.relay_cpu, o.harness_cpu, o.keep_uso, logdir)
    topo.input_gro = o.input_gro
    bench = Bench(o, topo, logdir / "rounds")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    searches: list[dict] = []
    preflight = {}
    meta = {
        "started_utc": started.isoformat(), "host": platform.node(), "kernel": platform.release(),
        "cpus": os.cpu_count(), "clk_tck": CLK_TCK,
        "cpu_model": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(o).items()},
        "binaries": {"loadgen": sha256(o.loadgen), "mcrelayd": sha256(o.mcrelayd),
                     "mcrelayd_before": sha256(o.mcrelayd_before) if o.mcrelayd_before else None},
        "sysctl": {k: sh("sysctl", "-n", k).strip() for k in
                   ("net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default", "net.core.netdev_max_backlog")},
        "smcrouted": sh("smcrouted", "-v", check=False).strip().splitlines()[0] if shutil.which("smcrouted") else None,
        "logdir": str(logdir),
        "loss_limit": LOSS_LIMIT, "sender_short_below": SENDER_SHORT, "steal_limit": STEAL_LIMIT,
    }
    status = "complete"
    try:
        topo.up()
        meta["topology"] = topo.sysinfo()
        log(f"USO (tx-udp-segmentation) on R's output veths: "
            f"{'left ON (--keep-uso)' if o.keep_uso else 'OFF'} {topo.uso_state}")
        log(f"GRO on R's input veths{' (--input-gro)' if o.input_gro else ''}: {topo.gro_state}")
        if not o.skip_preflight:
            preflight = bench.preflight(contenders)
            leak = [k for k, v in preflight.items() if not v["ok"] and not k.startswith("kernel")]
            if leak and not bench.distinct_groups:
                log("preflight: per-interface delivery failed for " + ", ".join(leak)
                    + "; switching mcrelay/baseline to one group per output and re-checking")
                bench.distinct_groups = True
                preflight["retry_distinct_groups"] = bench.preflight([c for c in contenders if c != "kernel"])
        meta["distinct_groups"] = bench.distinct_groups
        previous: dict[tuple, float] = {}
        for rep in range(1, o.reps + 1):
            for size in sizes:
                for fanout in fanouts:
                    for c in contenders:
                        key = (c, size, fanout)
                        start = None
                        if not o.no_warm_start and previous.get(key):
                            start = previous[key] * 0.9
                        log(f"rep {rep}/{o.reps}: {c} {size} B 1->{fanout}"
                            + (f" (warm start {start/1e3:.0f} kpps)" if start else ""))
                        s = bench.search(c, size, fanout, rep, start)
                        searches.append(s)
                        if s["max_lossless_requested_pps"]:
                            previous[key] = s["max_lossless_requested_pps"]
    except KeyboardInterrupt as e:
        status = f"interrupted ({e})"
        log(f"\n{status}: cleaning up")
    except Exception as e:  # keep what was measured
        status = f"error: {e!r}"
        log(f"\n{status}")
        import traceback
        traceback.print_exc()
    finally:
        bench.kill_children()
        topo.down()
    rows = summarize(searches) if searches else []
    o.results.mkdir(parents=True, exist_ok=True)
    out = o.results / f"{stamp}.json"
    meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat()
    meta["status"] = status
    out.write_text(json.dumps({"meta": meta, "preflight": preflight, "summary": rows,
                               "searches": searches, "rounds": bench.rounds}, indent=1))
    print(f"\n## relay throughput, {stamp} ({status})")
    print(f"USO on R's output veths: {'on (--keep-uso)' if o.keep_uso else 'off'}; "
          f"reps {o.reps}, rounds {o.round_seconds} s, loss limit {LOSS_LIMIT*100:.1f} %, "
          f"groups per output: {'distinct' if bench.distinct_groups else 'shared 239.2.2.2'}")
    if preflight:
        bad = [k for k, v in preflight.items() if isinstance(v, dict) and "ok" in v and not v["ok"]]
        print(f"preflight per-interface delivery: {'all OK' if not bad else 'FAILED: ' + ', '.join(bad)}")
    print()
    print(table(rows) if rows else "(no completed searches)")
    print(f"\nresults: {out}\nlogs:    {logdir}")
    return 0 if status == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
