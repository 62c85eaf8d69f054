#!/usr/bin/env python3
"""UDP proxying against the relay floor: server CPU per call of a relay that forwards every
datagram unchanged and parses nothing (`--relay`: the `relay-floor` program of the seeds' bench
kit, which this repository does not carry) and of sipsec stateless and stateful with
record-route, under the same load, alternated round by round.

The server runs pinned to CPU 0, the load on CPU 1: SIPp (`peers/sipp/uac.xml` and
`uas.xml`), or `sipsec load --role both`. Each row warms up with WARMUP calls,
then measures CALLS. CPU per call is the server's threads' on-CPU time (`schedstat`) over the
measured run; wake-ups are their voluntary context switches.

    cargo build --release     # and build relay-floor into /tmp/relay-target (or pass --relay)
    python3 scripts/relay_floor.py [--rounds 3] [--rate 1000] [--load sipp|sipsec]
    python3 scripts/relay_floor.py --sipsec /tmp/before --sipsec target/release/sipsec   # A/B
    python3 scripts/relay_floor.py --no-relay --config-extra 'max_batch_delay_us = 0'
"""
import argparse, os, shutil, statistics, subprocess, sys, tempfile, time

from kit import SIPP as KIT


def threads(pid):
    """{tid: (on-CPU ns, voluntary switches)} of a process's threads."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
            status = open(f"/proc/{pid}/task/{t}/status").read()
            vcs = int(next(l for l in status.splitlines() if l.startswith("voluntary_ctxt")).split()[1])
            out[t] = (ns, vcs)
        except (OSError, StopIteration):
            pass
    return out


def row(cmd, a, sipsec):
    srv = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    time.sleep(1)
    uas = None
    if a.load == "sipp":
        uas = subprocess.Popen(["taskset", "-c", "1", "sipp", "-sf", f"{KIT}/uas.xml", "-i",
                                "127.0.0.3", "-p", "35080", "-nostdin"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)

    def load(n):
        if a.load == "sipp":
            c = ["sipp", "-sf", f"{KIT}/uac.xml", "-i", "127.0.0.2", "-p", "35070",
                 "127.0.0.1:35060", "-s", "service", "-r", str(a.rate), "-m", str(n), "-nostdin"]
        else:
            c = [sipsec, "load", "127.0.0.1:35060", "--role", "both", "--uas", "127.0.0.3:35080",
                 "--rate", str(a.rate), "--calls", str(n), "-q"]
        return subprocess.run(["taskset", "-c", "1"] + c, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode

    try:
        load(a.warmup)
        before = threads(srv.pid)
        code = load(a.calls)
        after = threads(srv.pid)
    finally:
        srv.terminate()
        srv.wait()
        if uas:
            uas.terminate()
            uas.wait()
        time.sleep(0.5)
    cpu = sum(after[t][0] - before.get(t, (0, 0))[0] for t in after) / a.calls / 1e3
    wakeups = sum(after[t][1] - before.get(t, (0, 0))[1] for t in after) / a.calls
    if code != 0:
        print(f"  warning: the load exited {code} (some calls failed)", file=sys.stderr)
    return cpu, wakeups


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", action="append", help="sipsec binaries to measure (repeatable)")
    ap.add_argument("--relay", default="/tmp/relay-target/release/relay-floor")
    ap.add_argument("--no-relay", action="store_true")
    ap.add_argument("--load", choices=["sipp", "sipsec"], default="sipp")
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config-extra", default="", help="lines added to the [server] table")
    a = ap.parse_args()
    binaries = [os.path.abspath(b) for b in (a.sipsec or ["target/release/sipsec"])]
    work = tempfile.mkdtemp()
    rows = [] if a.no_relay else [("relay floor", [a.relay, "127.0.0.1:35060", "127.0.0.1:35062",
                                                   "127.0.0.3:35080"], None)]
    for b in binaries:
        for stateful in ["false", "true"]:
            cfg = os.path.join(work, f"{len(rows)}.toml")
            open(cfg, "w").write(
                f'[server]\nlisten = ["udp:127.0.0.1:35060"]\ndomains = ["bench.test"]\n'
                f'workers = 1\nstateful = {stateful}\nrecord_route = true\n{a.config_extra}\n'
                f'[routing]\ndefault_route = "sip:127.0.0.3:35080"\n'
                f'[database]\nurl = "sqlite://{work}/{len(rows)}.db"\n')
            name = ("stateful" if stateful == "true" else "stateless")
            if len(binaries) > 1:
                name = f"{b}: {name}"
            rows.append((name, [b, "serve", "--config", cfg], b))
    res = {name: [] for name, _, _ in rows}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        for name, cmd, b in rows:
            res[name].append(row(cmd, a, b or binaries[0]))
            print(f"  {name}: {res[name][-1][0]:.1f} µs, {res[name][-1][1]:.2f} wake-ups a call",
                  file=sys.stderr)
    print(f"server CPU per call, µs (median of {a.rounds} rounds; the rounds), load {a.load}, "
          f"{a.rate} calls/s, {a.calls} calls")
    print("| row | µs/call | rounds | wake-ups/call | × floor |")
    print("|---|---:|---|---:|---:|")
    floor = statistics.median(v[0] for v in res["relay floor"]) if "relay floor" in res else None
    for name, vals in res.items():
        med = statistics.median(v[0] for v in vals)
        ratio = f"{med / floor:.2f}" if floor else "–"
        rounds = ", ".join(f"{v[0]:.0f}" for v in vals)
        wake = statistics.median(v[1] for v in vals)
        print(f"| {name} | {med:.1f} | {rounds} | {wake:.2f} | {ratio} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
