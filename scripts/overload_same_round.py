#!/usr/bin/env python3
"""Overload goodput against each round's own capacity, from the lab's results (issue 37).

The lab's overload table reads every row's goodput as a share of one reference capacity,
searched once at the start of the run; a run of the suite takes an hour, and on a shared
machine the server's CPU per call drifts by ±15% over minutes (measured: 54-80 us a call for
one binary and configuration over five runs in ten minutes). This reads each round's rows against
that round's capacity instead: the CPU quota divided by what a call cost the uncontrolled
server offered the reference rate in the same round (the `off` row's CPU per call at 1x,
measured minutes before the other rows of its round). Rounds where that row did not carry
99% of the offered rate are left out: its CPU per call then includes calls that failed.

    python3 scripts/overload_same_round.py results/lab/results.jsonl [--quota 0.25]

Prints, per row and grid point, the mean over rounds with a 95% Student's t-interval.
"""
import argparse
import json
from collections import defaultdict

from kit import t_interval


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--quota", type=float, default=0.25)
    a = ap.parse_args()
    recs = [json.loads(line) for line in open(a.results) if line.strip()]
    recs = [r for r in recs if r.get("suite") == "overload" and not r.get("skipped")]
    ref = next(r for r in recs if r["row"] == "reference")["peak_per_s"]
    rounds = defaultdict(dict)
    for r in recs:
        if r["row"] != "reference" and r.get("goodput_curve"):
            rounds[r["round"]][r["row"]] = r
    capacity = {}
    for n, rows in sorted(rounds.items()):
        off = rows.get("off")
        if not off:
            continue
        i = [round(rate) for rate, _ in off["goodput_curve"]].index(round(ref))
        rate, good = off["goodput_curve"][i]
        cpu = off["curve_cpu_us"][i]
        if good >= 0.99 * rate:
            capacity[n] = a.quota * 1e6 / cpu
        print(f"round {n}: control off at {rate:.0f}/s kept {good:.0f}/s at {cpu:.1f} us a call"
              + (f" -> capacity {capacity[n]:.0f}/s" if n in capacity else " (not used)"))
    print(f"\nGoodput / the same round's capacity (reference searched once: {ref:.0f}/s); "
          f"mean [95% t-interval], n = {len(capacity)} rounds:\n")
    order = [r for r in ["on", "on-oc", "two-hop", "two-hop-oc", "on-tls", "on-oc-tls"]
             if any(r in rows for rows in rounds.values())]
    grid = [rate for rate, _ in next(iter(rounds.values()))["off"]["goodput_curve"]]
    print("| row | " + " | ".join(f"{g / ref:.3g}x ({g:.0f}/s)" for g in grid) + " |")
    print("|---|" + "---:|" * len(grid))
    for row in order:
        cells = []
        for j in range(len(grid)):
            xs = [rounds[n][row]["goodput_curve"][j][1] / capacity[n]
                  for n in capacity if row in rounds[n]]
            m, h = t_interval(xs)
            cells.append(f"{m:.2f} [{m - h:.2f}, {m + h:.2f}]")
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
