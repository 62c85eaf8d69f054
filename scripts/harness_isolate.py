#!/usr/bin/env python3
"""Which half of the load makes Kamailio's CPU per call differ between harnesses? Kamailio 5.6
(stateful UDP proxy, peers/kamailio/proxy.cfg) measured under every pairing of caller and
callee — SIPp or `sipsec load` — and under our caller with `--rport`, alternated in one run.

    python3 scripts/harness_isolate.py [--sipsec target/release/sipsec] [--rounds 2] \
        [--rate 1000] [--calls 12000]

CPU per call is measured as the Kamailio kit measures it (`scripts/kamailio_compare.py`:
Kamailio on CPU 0, the load on CPU 1, user+sys from /proc over the successful calls).
Needs Debian's `kamailio` and `sip-tester`.
"""
import json, os, statistics, subprocess, sys, time

import kamailio_compare as C  # the Kamailio kit, used as a library
from kit import parser


def main():
    ap = parser(__doc__, rate=1000, calls=12000, rounds=2)
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)

    def sipp_uas():
        return C.start(["sipp", "-sf", os.path.join(C.SIPP, "uas.xml"), "-i", C.UAS[0], "-p",
                        str(C.UAS[1]), "-nostdin", "-timeout", "3600s", "-buff_size", "1048576"], 1)

    def our_uas():
        return C.start([binary, "load", "--role", "uas", "--uas", f"{C.UAS[0]}:{C.UAS[1]}",
                        "--quiet", "--duration", "3600"], 1)

    def sipp_uac(calls):
        return C.sipp(a.rate, calls)[0]

    def our_uac(*extra):
        def run(calls):
            out = os.path.join(C.WORK, "load.json")
            subprocess.run(["taskset", "-c", "1", binary, "load", f"{C.PROXY[0]}:{C.PROXY[1]}",
                            "--local", C.UAC[0], "--rate", str(a.rate), "--calls", str(calls),
                            "--quiet", "--json", out, *extra],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return json.load(open(out))["succeeded"]
        return run

    def measure(uas_start, uac):
        uas = uas_start()
        time.sleep(0.8)
        k = C.kamailio(False)
        C.wait_bound(k, C.PROXY[1])
        try:
            uac(2 * a.rate)  # warm-up
            time.sleep(1)
            pids = C.tree(k.pid)
            c0 = C.cpu(pids)
            ok = uac(a.calls)
            c1 = C.cpu(C.tree(k.pid))
        finally:
            C.stop(k)
            C.stop(uas)
        if ok < 0.99 * a.calls:
            print(f"  warning: only {ok}/{a.calls} calls succeeded")
        return (c1 - c0) / max(ok, 1) * 1e6

    variants = {
        "SIPp caller, SIPp callee": (sipp_uas, sipp_uac),
        "sipsec caller, sipsec callee": (our_uas, our_uac()),
        "SIPp caller, sipsec callee": (our_uas, sipp_uac),
        "sipsec caller, SIPp callee": (sipp_uas, our_uac()),
        "sipsec caller --rport, SIPp callee": (sipp_uas, our_uac("--rport")),
    }
    res = {k: [] for k in variants}
    try:
        for r in range(a.rounds):
            for name, (uas, uac) in variants.items():
                res[name].append(measure(uas, uac))
                print(f"round {r + 1}: {name}: {res[name][-1]:.1f} us/call", flush=True)
    finally:
        for p in C.procs:
            C.stop(p)
    base = statistics.median(res["SIPp caller, SIPp callee"])
    print(f"Kamailio stateful UDP proxy at {a.rate} cps, CPU us/call (median of {a.rounds}):")
    for name, v in res.items():
        m = statistics.median(v)
        print(f"  {name:<36} {m:7.1f}  ({m / base:.3f} of SIPp/SIPp)")


if __name__ == "__main__":
    main()
