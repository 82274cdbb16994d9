#!/usr/bin/env python3
"""spread = 1 against spread = 2 for one 1->N flow (issue 18), in one run.

Topology (namespaces mcspread-<tag>-{s,r,d}, removed at exit):

  S (sender, CPU 0) s0x 10.21.0.1 <-veth-> va 10.21.0.2 | R (mcrelayd) | vb 10.22.0.1 <-veth-> vr 10.22.0.2 D

One flow from 239.10.0.1:5000 on va to 239.20.0.1..N:6000 on vb. spread = 1
runs on `cores = [1]` (the sender has CPU 0); spread = 2 on `cores = [0, 1]`
(its shards on both CPUs, one of them shared with the sender: the machine
has two). RPS steers va's receive to CPU 1 and vr's (D, where nothing
listens: the datagrams are dropped there) to CPU 0.

A round: start the daemon, send `rate` datagrams per second for `seconds`
(loadgen send, pinned to CPU 0), wait until the relay's counters settle,
read them (`mcrelayctl flows --json`), stop the daemon. A round is lossless
when every output sent at least 99.9 % of the datagrams sent and no drop
counter moved. The rates step up geometrically; spread 1 and 2 alternate
at every rate (the order flips each rate). Reported per spread: the highest
lossless rate below its first lossy one, and at every rate the daemon's own
CPU (utime + stime) and the whole machine's busy time (/proc/stat, both
CPUs: sender and D included) per delivered datagram.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, **kw)


def in_ns(ns, *args, **kw):
    return sh("ip", "netns", "exec", ns, *args, **kw)


def busy_ticks():
    """Per CPU: busy (user+nice+system+irq+softirq+steal) and total ticks."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            m = re.match(r"cpu(\d+) (.*)", line)
            if m:
                v = [int(x) for x in m.group(2).split()]
                user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
                out[int(m.group(1))] = (user + nice + system + irq + softirq, sum(v[:8]))
    return out


def proc_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Bench:
    def __init__(self, a):
        self.a = a
        self.s, self.r, self.d = (f"mcspread-{a.tag}-{x}" for x in "srd")
        self.work = f"/tmp/mcspread-{a.tag}"
        self.backlog = None

    def setup(self):
        os.makedirs(self.work, mode=0o755, exist_ok=True)
        os.chmod(self.work, 0o755)
        for ns in (self.s, self.r, self.d):
            sh("ip", "netns", "add", ns)
            in_ns(ns, "ip", "link", "set", "lo", "up")
        sh("ip", "link", "add", "name", "s0x", "netns", self.s, "type", "veth", "peer", "name", "va", "netns", self.r)
        sh("ip", "link", "add", "name", "vr", "netns", self.d, "type", "veth", "peer", "name", "vb", "netns", self.r)
        for ns, dev, addr in ((self.s, "s0x", "10.21.0.1/24"), (self.r, "va", "10.21.0.2/24"),
                              (self.r, "vb", "10.22.0.1/24"), (self.d, "vr", "10.22.0.2/24")):
            in_ns(ns, "ip", "addr", "add", addr, "dev", dev)
            in_ns(ns, "ip", "link", "set", dev, "up")
        in_ns(self.s, "ip", "route", "add", "224.0.0.0/4", "dev", "s0x")
        for k in ("all", "default", "va", "vb"):
            in_ns(self.r, "sysctl", "-qw", f"net.ipv4.conf.{k}.rp_filter=0")
        in_ns(self.r, "sh", "-c", "echo 2 > /sys/class/net/va/queues/rx-0/rps_cpus")
        in_ns(self.d, "sh", "-c", "echo 1 > /sys/class/net/vr/queues/rx-0/rps_cpus")
        self.backlog = sh("sysctl", "-n", "net.core.netdev_max_backlog", capture_output=True, text=True).stdout.strip()
        sh("sysctl", "-qw", "net.core.netdev_max_backlog=10000")

    def teardown(self):
        for ns in (self.s, self.r, self.d):
            pids = sh("ip", "netns", "pids", ns, check=False, capture_output=True, text=True).stdout.split()
            for p in pids:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False, stderr=subprocess.DEVNULL)
        if self.backlog:
            sh("sysctl", "-qw", f"net.core.netdev_max_backlog={self.backlog}", check=False)

    def config(self, spread):
        outs = ",\n".join(
            f'  {{ interface = "vb", address = "239.20.{(i + 1) // 256}.{(i + 1) % 256}", port = 6000 }}'
            for i in range(self.a.outputs))
        cores = "[1]" if spread == 1 else "[0, 1]"
        path = f"{self.work}/spread{spread}.toml"
        with open(path, "w") as f:
            f.write(f'[daemon]\nuser = "nobody"\ncontrol_socket = "{self.work}/control.sock"\n'
                    f'cores = {cores}\n\n[[flow]]\nname = "wide"\nspread = {spread}\n'
                    f'input = {{ interface = "va", address = "239.10.0.1", port = 5000 }}\n'
                    f"outputs = [\n{outs}\n]\n")
        return path

    def ctl(self, *args):
        return in_ns(self.r, self.a.mcrelayctl, "--socket", f"{self.work}/control.sock", *args,
                     check=False, capture_output=True, text=True)

    def flow(self):
        out = self.ctl("flows", "--json", "--sample", "0")
        return json.loads(out.stdout)["flows"][0]

    def round(self, spread, rate):
        a = self.a
        try:
            os.unlink(f"{self.work}/control.sock")
        except FileNotFoundError:
            pass
        log = open(f"{self.work}/spread{spread}-{rate}.log", "w")
        # `ip netns exec` execs mcrelayd: the child's pid is the daemon's.
        daemon = subprocess.Popen(["ip", "netns", "exec", self.r, a.mcrelayd, "--config", self.config(spread)],
                                  stdout=log, stderr=log)
        deadline = time.time() + 60
        while not re.search(r"^flows: +1 with \d+ outputs$", self.ctl("status").stdout, re.M):
            if daemon.poll() is not None or time.time() > deadline:
                raise SystemExit(f"spread.py: mcrelayd did not start relaying; see {log.name}")
            time.sleep(0.05)
        before, t0, d0 = self.flow(), busy_ticks(), proc_ticks(daemon.pid)
        count = rate * a.seconds
        sent = in_ns(self.s, "taskset", "-c", "0", a.loadgen, "send", "--dest", "239.10.0.1:5000",
                     "--interface", "s0x", "--rate", str(rate), "--count", str(count),
                     "--size", str(a.size), "--json", capture_output=True, text=True)
        sender = json.loads(sent.stdout)
        # Until the relay's counters settle (the backlog drained).
        last, after = None, None
        for _ in range(100):
            after = self.flow()
            key = (after["packets_in"], sum(o["packets_out"] for o in after["outputs"]))
            if key == last:
                break
            last = key
            time.sleep(0.1)
        t1, d1 = busy_ticks(), proc_ticks(daemon.pid)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        log.close()

        def drops(f):
            d = f["drops"]
            return (sum(d.values()) + f.get("receive_errors", 0)
                    + sum(o["drops_backlog"] + o["drops_send_error"] for o in f["outputs"]))

        outs = [o1["packets_out"] - o0["packets_out"] for o0, o1 in zip(before["outputs"], after["outputs"])]
        delivered = sum(outs)
        n = sender["sent"]
        busy = sum(t1[c][0] - t0[c][0] for c in t1)
        r = {
            "spread": spread, "rate": rate, "sent": n,
            "sender_pps": sender["pps"],
            "packets_in": after["packets_in"] - before["packets_in"],
            "delivered": delivered, "min_output": min(outs),
            "drops": drops(after) - drops(before),
            "daemon_ns_per_delivered": round((d1 - d0) / TICK * 1e9 / max(1, delivered)),
            "machine_busy_ns_per_delivered": round(busy / TICK * 1e9 / max(1, delivered)),
            "cpu_busy_pct": {c: round(100 * (t1[c][0] - t0[c][0]) / max(1, t1[c][1] - t0[c][1])) for c in t1},
            "workers": after.get("workers") or [after["worker"]],
        }
        r["lossless"] = r["min_output"] >= 0.999 * n and r["drops"] == 0
        print(f"  spread {spread} at {rate:>6}/s: sent {n}, in {r['packets_in']}, min output {r['min_output']}, "
              f"drops {r['drops']}, {'lossless' if r['lossless'] else 'LOSSY'}; daemon {r['daemon_ns_per_delivered']} ns, "
              f"machine {r['machine_busy_ns_per_delivered']} ns per delivered; CPU busy {r['cpu_busy_pct']}",
              file=sys.stderr, flush=True)
        return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mcrelayd", required=True)
    p.add_argument("--mcrelayctl", required=True)
    p.add_argument("--loadgen", required=True)
    p.add_argument("--tag", default=str(os.getpid()))
    p.add_argument("--outputs", type=int, default=64)
    p.add_argument("--size", type=int, default=1316)
    p.add_argument("--seconds", type=int, default=3)
    p.add_argument("--start", type=int, default=1000, help="first input rate (datagrams/s)")
    p.add_argument("--factor", type=float, default=1.4, help="rate step")
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", help="write every round as JSON here")
    a = p.parse_args()
    b = Bench(a)
    rounds = []
    try:
        b.setup()
        with open("/proc/loadavg") as f:
            load0 = f.read().split()[:3]
        rates = [round(a.start * a.factor ** i) for i in range(a.steps)]
        for rep in range(a.reps):
            print(f"rep {rep + 1}/{a.reps}", file=sys.stderr)
            failed = {1: 0, 2: 0}
            for i, rate in enumerate(rates):
                order = (1, 2) if i % 2 == 0 else (2, 1)
                for spread in order:
                    if failed[spread] >= 2:
                        continue
                    r = b.round(spread, rate)
                    r["rep"] = rep
                    rounds.append(r)
                    failed[spread] += 0 if r["lossless"] else 1
                if min(failed.values()) >= 2:
                    break
        with open("/proc/loadavg") as f:
            load1 = f.read().split()[:3]
    finally:
        b.teardown()
    print(f"1->{a.outputs} flow, {a.size} B, {a.seconds} s rounds; load average {' '.join(load0)} at start, "
          f"{' '.join(load1)} at end")
    print("spread | max lossless input (/s, per rep) | daemon ns / delivered (at each lossless rate) | machine ns / delivered")
    for spread in (1, 2):
        best = []
        for rep in range(a.reps):
            ok = None
            for r in (r for r in rounds if r["rep"] == rep and r["spread"] == spread):
                if not r["lossless"]:
                    break
                ok = r["rate"]
            best.append(ok)
        good = [r for r in rounds if r["spread"] == spread and r["lossless"]]
        per = ", ".join(f"{r['rate']}: {r['daemon_ns_per_delivered']}" for r in good)
        mach = ", ".join(f"{r['rate']}: {r['machine_busy_ns_per_delivered']}" for r in good)
        print(f"{spread} | {best} | {per} | {mach}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"outputs": a.outputs, "size": a.size, "seconds": a.seconds,
                       "loadavg": [load0, load1], "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
