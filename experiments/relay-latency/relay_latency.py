#!/usr/bin/env python3
"""One-way latency through each relay, on the end-to-end benchmark's
topology (experiments/relay-throughput: its namespaces, contenders, rounds
and loss accounting are reused as they are). Called by run.sh; standard
library only.

1. For each contender, a max lossless search (as relay_throughput.py
   does, shorter rounds, no saturation round).
2. Latency rounds, repeated and interleaved: for rep, for load point, for
   contender: one round at that fraction of the contender's own max
   lossless rate (or at a fixed rate), the sender stamping every datagram
   with CLOCK_MONOTONIC (`loadgen send --timestamp`) and the receiver timing
   it by the kernel's receive stamp (`loadgen recv --latency`).

Usage and how to read the output: README.md next to this file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "relay-throughput"))
import relay_throughput as rt  # noqa: E402

PERCENTILES = (("p50", "p50_ns"), ("p99", "p99_ns"), ("p999", "p999_ns"), ("max", "max_ns"))
GOAL_P99_SLACK_US = 20.0  # mcrelay p99 <= kernel p99 + 20 us at loads <= 50 %
GOAL_LOAD = 0.5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def points(o) -> list[dict]:
    """The load points: fractions of each contender's max, then fixed rates."""
    out = [{"label": f"{float(f)*100:.0f} %", "fraction": float(f), "rate": None}
           for f in o.loads.split(",") if f]
    out += [{"label": f"{int(r)/1e3:g} kpps", "fraction": None, "rate": int(r)}
            for r in o.fixed_rates.split(",") if r]
    return out


class LatencyBench(rt.Bench):
    """relay_throughput's Bench, the relay optionally at SCHED_FIFO."""

    def relay_prefix(self, busy_polls: bool = False) -> list[str]:
        if self.o.relay_sched == "fifo":
            pin = [] if busy_polls else ["taskset", "-c", str(self.topo.relay_cpu)]
            return ["chrt", "-f", str(self.o.relay_rt_priority), *pin]
        return super().relay_prefix(busy_polls)


def latency_of(r: dict) -> dict | None:
    rx = r.get("per_receiver") or []
    return rx[0].get("latency") if rx else None


def summarize(rounds: list[dict], maxima: dict, contenders: list[str], pts: list[dict]) -> list[dict]:
    rows = []
    for p in pts:
        for c in contenders:
            rs = [r for r in rounds if r["contender"] == c and r["point"] == p["label"]]
            lat = [latency_of(r) for r in rs]
            lat = [x for x in lat if x and x.get("count")]
            row = {"contender": c, "point": p["label"], "fraction": p["fraction"],
                   "requested_pps": statistics.median([r["requested_pps"] for r in rs]) if rs else None,
                   "achieved_pps_median": statistics.median([r["achieved_pps"] for r in rs]) if rs else None,
                   "reps": len(lat), "rounds_lossy": sum(not r["passed"] for r in rs),
                   "loss_frac_max": max((r["loss_frac"] for r in rs), default=None),
                   "kernel_stamped_frac": (sum(x["kernel_stamped"] for x in lat) / sum(x["count"] for x in lat))
                   if lat else None,
                   "max_lossless_pps": maxima.get(c, {}).get("max_lossless_pps")}
            for name, key in PERCENTILES:
                vals = [x[key] / 1e3 for x in lat if x.get(key) is not None]
                row[f"{name}_us_median"] = statistics.median(vals) if vals else None
                row[f"{name}_us_min"] = min(vals) if vals else None
                row[f"{name}_us_max"] = max(vals) if vals else None
            cpu = [r["ns_per_delivered"] for r in rs if r.get("ns_per_delivered")]
            row["ns_per_delivered_median"] = statistics.median(cpu) if cpu else None
            adj = [r["ns_per_delivered_adj"] for r in rs if r.get("ns_per_delivered_adj")]
            row["ns_per_delivered_adj_median"] = statistics.median(adj) if adj else None
            rows.append(row)
    return rows


def goals(rows: list[dict], maxima: dict) -> dict:
    """The issue's two goals, from this run's medians."""
    out = {"p99": [], "cpu": []}
    by = {(r["contender"], r["point"]): r for r in rows}
    for r in rows:
        if r["contender"] not in ("mcrelay", "mcrelay-packet"):
            continue
        if r["fraction"] is None or r["fraction"] > GOAL_LOAD:
            continue
        k = by.get(("kernel", r["point"]))
        if not k or k["p99_us_median"] is None or r["p99_us_median"] is None:
            continue
        excess = r["p99_us_median"] - k["p99_us_median"]
        out["p99"].append({"contender": r["contender"], "point": r["point"],
                           "p99_us": r["p99_us_median"], "kernel_p99_us": k["p99_us_median"],
                           "excess_us": excess, "met": excess <= GOAL_P99_SLACK_US})
    # CPU per packet, against the kernel's: (a) at each one's max lossless
    # rate (the searches' best rounds); (b) at the highest load point, from
    # the latency rounds' medians with foreign process time removed — at
    # the same input rate for every contender when --max-rates gave them
    # the same base.
    top = max((p["fraction"] for p in (r for r in rows) if p["fraction"] is not None), default=None)
    sources = [("search best round, ns / delivered",
                {c: (m or {}).get("ns_per_delivered") for c, m in maxima.items()})]
    if top is not None:
        sources.append((f"{top*100:.0f} % point, ns / delivered with foreign time removed",
                        {r["contender"]: r["ns_per_delivered_adj_median"] for r in rows if r["fraction"] == top}))
    for what, ns in sources:
        kernel_ns = ns.get("kernel")
        for c, limit in (("mcrelay-packet", 1.0), ("mcrelay", 1.2)):
            if ns.get(c) and kernel_ns:
                ratio = ns[c] / kernel_ns
                out["cpu"].append({"contender": c, "source": what, "ns_per_delivered": ns[c],
                                   "kernel_ns_per_delivered": kernel_ns, "ratio": ratio, "goal": limit,
                                   "met": ratio <= limit})
    return out


def fmt_us(r: dict, name: str) -> str:
    m = r.get(f"{name}_us_median")
    if m is None:
        return "–"
    lo, hi = r[f"{name}_us_min"], r[f"{name}_us_max"]
    return f"{m:.0f} ({lo:.0f}–{hi:.0f})"


def table(rows: list[dict]) -> str:
    lines = ["| load | relay | rate in, kpps | p50 µs | p99 µs | p99.9 µs | max µs | lossy rounds |",
             "|" + "---|" * 8]
    for r in rows:
        rate = f"{r['achieved_pps_median']/1e3:.1f}" if r["achieved_pps_median"] else "–"
        lines.append(f"| {r['point']} | {r['contender']} | {rate} | {fmt_us(r, 'p50')} | {fmt_us(r, 'p99')} | "
                     f"{fmt_us(r, 'p999')} | {fmt_us(r, 'max')} | {r['rounds_lossy']}/{r['reps']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="latency rounds per contender and load point")
    ap.add_argument("--size", type=int, default=1316, help="payload bytes")
    ap.add_argument("--contenders", default="mcrelay,mcrelay-packet,baseline,kernel")
    ap.add_argument("--loads", default="0.1,0.5,0.9", help="fractions of each contender's max lossless rate")
    ap.add_argument("--fixed-rates", default="1000", help="extra points at these input rates (pps), every contender")
    ap.add_argument("--round-seconds", type=float, default=3.0, help="sending time of a latency round")
    ap.add_argument("--search-seconds", type=float, default=1.5, help="sending time of a search round")
    ap.add_argument("--max-steps", type=int, default=7, help="rounds per max lossless search at most")
    ap.add_argument("--max-rates", default="",
                    help="skip the searches: CONTENDER=PPS,... (e.g. from a relay-throughput run)")
    ap.add_argument("--resolution", type=float, default=0.08)
    ap.add_argument("--start-rate", type=int, default=20000)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 rep, 1 s rounds, searches of at most 5 steps")
    ap.add_argument("--mcrelay-user", default="nobody")
    ap.add_argument("--relay-cpu", type=int, default=1)
    ap.add_argument("--harness-cpu", type=int, default=0)
    ap.add_argument("--receiver-nice", type=int, default=-5)
    ap.add_argument("--sender-nice", type=int, default=0)
    ap.add_argument("--relay-nice", type=int, default=0, help="with --relay-sched other")
    ap.add_argument("--relay-sched", choices=("fifo", "other"), default="fifo",
                    help="mcrelayd / the baseline at SCHED_FIFO (chrt -f) so other jobs on the relay CPU "
                         "don't set its wake-up delay (default), or at SCHED_OTHER with --relay-nice")
    ap.add_argument("--relay-rt-priority", type=int, default=50)
    ap.add_argument("--loadgen", type=Path, required=True)
    ap.add_argument("--mcrelayd", type=Path, required=True)
    ap.add_argument("--mcrelayd-before", type=Path,
                    help="another mcrelayd for the contenders mcrelay-before / mcrelay-packet-before "
                         "(a before/after in one run)")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--tag", default=str(os.getpid()))
    o = ap.parse_args()
    if o.quick:
        o.reps, o.round_seconds, o.search_seconds, o.max_steps = 1, 1.0, 1.0, min(o.max_steps, 5)
    # What relay_throughput.Bench reads from its options.
    o.distinct_groups, o.confirm, o.saturation = False, False, False
    o.round_seconds_latency, o.round_seconds = o.round_seconds, o.search_seconds
    contenders = [c for c in o.contenders.split(",") if c]
    for c in contenders:
        if c not in rt.CONTENDERS:
            ap.error(f"unknown contender {c!r}; use {','.join(rt.CONTENDERS)}")
        if getattr(rt.CONTENDERS[c], "before", False) and not o.mcrelayd_before:
            ap.error(f"{c} needs --mcrelayd-before PATH")
        if getattr(rt.CONTENDERS[c], "framing", "loadgen") != "loadgen":
            ap.error(f"{c} sends RTP: the latency stamp needs the plain loadgen payload")
    given = {}
    for kv in (x for x in o.max_rates.split(",") if x):
        c, _, v = kv.partition("=")
        given[c] = float(v)
    if os.geteuid() != 0:
        print("relay_latency.py needs root (network namespaces, sysctl, RPS)", file=sys.stderr)
        return 2
    pts = points(o)

    started = dt.datetime.now(dt.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    logdir = Path(tempfile.mkdtemp(prefix=f"relay-latency-{stamp}-"))
    # mcrelayd's helper reads the round's config after dropping to
    # --mcrelay-user: mkdtemp's 0700 would hide it.
    logdir.chmod(0o755)
    rt.private_binaries(o, logdir)
    log(f"logs: {logdir}")
    topo = rt.Topology(o.tag, o.relay_cpu, o.harness_cpu, False, logdir)
    bench = LatencyBench(o, topo, logdir / "rounds")
    bench.send_extra = ["--timestamp"]
    bench.recv_extra = ["--latency"]

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    meta = {
        "started_utc": started.isoformat(), "kernel": os.uname().release, "cpus": os.cpu_count(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(o).items()},
        "binaries": {"loadgen": rt.sha256(o.loadgen), "mcrelayd": rt.sha256(o.mcrelayd),
                     "mcrelayd_before": rt.sha256(o.mcrelayd_before) if o.mcrelayd_before else None},
        "clock": "send: CLOCK_MONOTONIC before sendmmsg; receive: SO_TIMESTAMPNS (CLOCK_REALTIME, "
                 "converted to CLOCK_MONOTONIC per receive batch)",
        "logdir": str(logdir),
    }
    maxima: dict[str, dict] = {}
    lat_rounds: list[dict] = []
    status = "complete"
    try:
        topo.up()
        meta["topology"] = topo.sysinfo()
        for c in contenders:
            if c in given:
                maxima[c] = {"max_lossless_pps": given[c], "given": True}
                continue
            log(f"search: {c} {o.size} B 1->1")
            s = bench.search(c, o.size, 1, 1, None)
            maxima[c] = s
            if not s["max_lossless_pps"]:
                raise RuntimeError(f"{c}: no lossless rate found")
        o.round_seconds = o.round_seconds_latency
        for rep in range(1, o.reps + 1):
            for p in pts:
                for c in contenders:
                    if p["rate"] is not None:
                        rate = p["rate"]
                    else:
                        # The requested rate of the best search round: what
                        # the pacer was asked for when it passed.
                        m = maxima[c]
                        base = min(m.get("max_lossless_requested_pps") or m["max_lossless_pps"],
                                   m["max_lossless_pps"]) if not m.get("given") else m["max_lossless_pps"]
                        rate = max(100, int(base * p["fraction"]))
                    log(f"rep {rep}/{o.reps}: {c} at {p['label']} ({rate/1e3:.1f} kpps)")
                    r = bench.measured_round(c, o.size, 1, rate, o.round_seconds, tag="latency")
                    r["rep"], r["point"] = rep, p["label"]
                    lat_rounds.append(r)
                    x = latency_of(r) or {}
                    log(f"    latency: p50 {(x.get('p50_ns') or 0)/1e3:.1f} µs, p99 {(x.get('p99_ns') or 0)/1e3:.1f}, "
                        f"p99.9 {(x.get('p999_ns') or 0)/1e3:.1f}, max {(x.get('max_ns') or 0)/1e3:.1f} "
                        f"({x.get('count', 0)} timed, {x.get('kernel_stamped', 0)} by kernel stamp)")
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
    rows = summarize(lat_rounds, maxima, contenders, pts)
    g = goals(rows, maxima)
    meta["finished_utc"] = dt.datetime.now(dt.timezone.utc).isoformat()
    meta["status"] = status
    o.results.mkdir(parents=True, exist_ok=True)
    out = o.results / f"{stamp}.json"
    slim_max = {c: {k: v for k, v in m.items() if k in (
        "max_lossless_pps", "max_lossless_requested_pps", "sender_limited", "ns_per_delivered",
        "ns_per_delivered_adj", "limit_side", "given", "rounds")} for c, m in maxima.items()}
    out.write_text(json.dumps({"meta": meta, "maxima": slim_max, "summary": rows, "goals": g,
                               "rounds": bench.rounds}, indent=1))
    print(f"\n## relay latency, {stamp} ({status})")
    print(f"{o.size} B, 1→1, {o.reps} interleaved reps of {o.round_seconds_latency} s per point; "
          "delay = receiver's kernel stamp − sender's stamp, medians (min–max) over reps; "
          f"relay scheduling: {'SCHED_FIFO ' + str(o.relay_rt_priority) if o.relay_sched == 'fifo' else 'SCHED_OTHER, nice ' + str(o.relay_nice)}")
    print("max lossless (search): " + ", ".join(
        f"{c} {'≥ ' if m.get('sender_limited') else ''}{m['max_lossless_pps']/1e3:.1f} kpps"
        + (f" ({m['ns_per_delivered']:.0f} ns/pkt)" if m.get("ns_per_delivered") else "")
        for c, m in maxima.items()))
    print()
    print(table(rows))
    print()
    for x in g["p99"]:
        print(f"goal p99 ≤ kernel + {GOAL_P99_SLACK_US:.0f} µs: {x['contender']} at {x['point']}: "
              f"{x['p99_us']:.0f} vs {x['kernel_p99_us']:.0f} µs (+{x['excess_us']:.0f}): "
              f"{'met' if x['met'] else 'MISSED'}")
    for x in g["cpu"]:
        print(f"goal CPU ≤ {x['goal']}x kernel ({x['source']}): {x['contender']}: {x['ns_per_delivered']:.0f} / "
              f"{x['kernel_ns_per_delivered']:.0f} ns = {x['ratio']:.2f}x: {'met' if x['met'] else 'MISSED'}")
    print(f"\nresults: {out}\nlogs:    {logdir}")
    return 0 if status == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
