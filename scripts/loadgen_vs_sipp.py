#!/usr/bin/env python3
"""Load generator efficiency: the highest call rate one core sustains, sipsec load vs SIPp.

    python3 scripts/loadgen_vs_sipp.py [--sipsec target/release/sipsec] [--cpu 1] [--seconds 5]

Both tools run caller and callee on the same core (`taskset -c CPU`), UDP, no proxy between:
SIPp as two processes (`-sn uac` against `-sn uas`), sipsec as one (`--role both`). A rate is
sustained when at least 99% of the calls succeed and the run keeps pace with its schedule
(it ends within 10% + 1 s of calls/rate, so neither tool passes by quietly slowing down). For
each tool the rate doubles from --start until a run fails, then the interval is bisected to 5%.
The tools alternate trial by trial, so machine noise hits both alike. Needs Debian's
`sip-tester`.
"""
import json, os, signal, subprocess, tempfile, time

from kit import parser

WORK = tempfile.mkdtemp(prefix="loadgen-")
UAS = ("127.0.0.3", 36080)
UAC_IP = "127.0.0.2"


def run(cmd, planned_s):
    """Runs a tool, interrupting it once it is clearly not keeping pace (then it fails)."""
    p = subprocess.Popen(cmd, cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(planned_s * 1.1 + 5)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGINT)  # both tools write their statistics on SIGINT
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def sipp_run(cpu, rate, calls):
    uas = subprocess.Popen(["taskset", "-c", str(cpu), "sipp", "-sn", "uas", "-i", UAS[0], "-p",
                            str(UAS[1]), "-nostdin", "-buff_size", "4194304", "-timeout", "600s"],
                           cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    stat = os.path.join(WORK, f"sipp-{rate}.csv")
    t0 = time.monotonic()
    run(["taskset", "-c", str(cpu), "sipp", f"{UAS[0]}:{UAS[1]}", "-sn", "uac", "-i",
         UAC_IP, "-p", "36070", "-r", str(rate), "-rp", "1000", "-m", str(calls), "-l",
         str(rate * 10), "-nostdin", "-buff_size", "4194304", "-trace_stat", "-stf",
         stat, "-fd", "1"], calls / rate)
    elapsed = time.monotonic() - t0
    uas.terminate()
    uas.wait()
    try:
        rows = [l.strip().split(";") for l in open(stat) if l.strip()]
        os.remove(stat)
    except OSError:
        return 0, elapsed
    last = dict(zip(rows[0], rows[-1]))
    return int(last["SuccessfulCall(C)"]), elapsed


def sipsec_run(binary, cpu, rate, calls):
    out = os.path.join(WORK, "load.json")
    t0 = time.monotonic()
    if os.path.exists(out):
        os.remove(out)
    run(["taskset", "-c", str(cpu), binary, "load", f"{UAS[0]}:{UAS[1]}", "--role",
         "both", "--uas", f"{UAS[0]}:{UAS[1]}", "--local", UAC_IP, "--rate", str(rate),
         "--calls", str(calls), "--drain-s", "10", "--quiet", "--json", out], calls / rate)
    elapsed = time.monotonic() - t0
    return (json.load(open(out))["succeeded"] if os.path.exists(out) else 0), elapsed


def sustained(ok, elapsed, rate, calls):
    return ok >= 0.99 * calls and elapsed <= calls / rate * 1.1 + 1.0


def main():
    ap = parser(__doc__, cpu=1, start=1000)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    tools = {"sipp": lambda r, n: sipp_run(a.cpu, r, n),
             "sipsec": lambda r, n: sipsec_run(binary, a.cpu, r, n)}
    # Per tool: last good rate, first bad rate (None until found), next rate to try.
    state = {t: {"good": 0, "bad": None, "next": a.start, "done": False} for t in tools}
    while not all(s["done"] for s in state.values()):
        for name, run in tools.items():
            s = state[name]
            if s["done"]:
                continue
            rate = s["next"]
            calls = int(rate * a.seconds)
            ok, elapsed = run(rate, calls)
            passed = sustained(ok, elapsed, rate, calls)
            print(f"{name:6} {rate:6}/s: {ok}/{calls} ok in {elapsed:.1f} s "
                  f"({'sustained' if passed else 'not sustained'})", flush=True)
            if passed:
                s["good"] = rate
            else:
                s["bad"] = rate
            if s["bad"] is None:
                s["next"] = rate * 2
            else:
                mid = (s["good"] + s["bad"]) // 2
                if s["bad"] - s["good"] <= max(0.05 * s["good"], 50):
                    s["done"] = True
                s["next"] = mid
            time.sleep(0.5)
    g_sipp, g_ours = state["sipp"]["good"], state["sipsec"]["good"]
    print(f"one core, UAC+UAS, UDP: sipsec load sustains {g_ours}/s, SIPp {g_sipp}/s, "
          f"ratio {g_ours / max(g_sipp, 1):.2f}")


if __name__ == "__main__":
    main()
