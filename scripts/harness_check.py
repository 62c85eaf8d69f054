#!/usr/bin/env python3
"""Does `sipsec bench` measure what the SIPp-driven kit measures? Server CPU per call of
Kamailio 5.6 and of sipsec, each measured by both harnesses, alternated in one run.

    python3 scripts/harness_check.py [--sipsec target/release/sipsec] [--rate 1000] \
        [--calls 18000] [--rounds 2]

- "SIPp": `scripts/kamailio_compare.py`'s own functions (its Kamailio and sipsec
  starters, SIPp caller and callee on CPU 1, CPU read from /proc);
- "bench": `sipsec bench`, sipsec's load generator (UAC+UAS) pinned to CPU 1, measuring
  Kamailio by `--server-pid` and sipsec by starting it with the same config kamailio_compare.py uses.

Prints each figure, the bench/SIPp agreement per server, and sipsec/Kamailio per harness.
Needs Debian's `kamailio` and `sip-tester`.
"""
import json, os, statistics, subprocess, sys

import kamailio_compare as C  # the Kamailio kit, used as a library
from kit import parser


def sipp_measure(starter, rate, calls, answers_options):
    uas = C.start(["sipp", "-sf", os.path.join(C.SIPP, "uas.xml"), "-i", C.UAS[0], "-p",
                   str(C.UAS[1]), "-nostdin", "-timeout", "3600s", "-buff_size", "1048576"], 1)
    try:
        import time
        time.sleep(0.8)
        return C.measure(starter, rate, calls, answers_options)
    finally:
        C.stop(uas)


def bench_measure(binary, rate, calls, kamailio):
    out = os.path.join(C.WORK, "bench.json")
    cmd = [binary, "bench", "--rate", str(rate), "--calls", str(calls), "--quiet",
           "--server-cpu", "0", "--load-cpu", "1", "--uas", f"{C.UAS[0]}:{C.UAS[1]}",
           "--json", out]
    p = None
    if kamailio:
        p = C.kamailio(False)
        C.wait_bound(p, C.PROXY[1])
        cmd += ["--server-pid", str(p.pid), "--target", f"{C.PROXY[0]}:{C.PROXY[1]}"]
    else:
        cfg = os.path.join(C.WORK, "bench.toml")
        C.sipsec(binary, False)  # writes WORK/sipsec.toml; stop that copy, keep its config
        C.stop(C.procs.pop())
        os.replace(os.path.join(C.WORK, "sipsec.toml"), cfg)
        cmd += ["--config", cfg]
    try:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    finally:
        if p:
            C.stop(p)
    r = json.load(open(out))
    if r["ops"] < 0.99 * calls:
        print(f"  warning: only {r['ops']}/{calls} calls succeeded")
    return r["server_cpu_us_per_op"]


def main():
    ap = parser(__doc__, rate=1000, calls=18000, rounds=2)
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    res = {k: [] for k in ("kam_sipp", "kam_bench", "sec_sipp", "sec_bench")}
    try:
        for r in range(a.rounds):
            res["kam_sipp"].append(sipp_measure(lambda: C.kamailio(False), a.rate, a.calls, False))
            res["kam_bench"].append(bench_measure(binary, a.rate, a.calls, True))
            res["sec_sipp"].append(sipp_measure(lambda: C.sipsec(binary, False), a.rate, a.calls, True))
            res["sec_bench"].append(bench_measure(binary, a.rate, a.calls, False))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in res.items()), flush=True)
    finally:
        for p in C.procs:
            C.stop(p)
    m = {k: statistics.median(v) for k, v in res.items()}
    print(f"stateful UDP proxy at {a.rate} cps, server CPU us/call (median of {a.rounds}):")
    print(f"  kamailio: SIPp kit {m['kam_sipp']:.1f}, sipsec bench {m['kam_bench']:.1f} "
          f"-> bench/SIPp {m['kam_bench'] / m['kam_sipp']:.3f}")
    print(f"  sipsec:   SIPp kit {m['sec_sipp']:.1f}, sipsec bench {m['sec_bench']:.1f} "
          f"-> bench/SIPp {m['sec_bench'] / m['sec_sipp']:.3f}")
    print(f"  sipsec/kamailio: SIPp kit {m['sec_sipp'] / m['kam_sipp']:.2f}, "
          f"sipsec bench {m['sec_bench'] / m['kam_bench']:.2f}")


if __name__ == "__main__":
    main()
