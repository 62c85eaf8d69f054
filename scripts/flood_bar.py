#!/usr/bin/env python3
"""Issue 34's flood bar: "a flood of 50,000 requests/s from one address: calls from other
addresses keep >= 0.95 of their goodput without the flood, and the flooding address's requests
cost <= 25% of the worker".

One sipsec worker (pinned to CPU 0 with --pin) with `[flood] exempt = []`, so the callers' own
requests are counted too, and a `rate` between the two: the caller (`sipsec load` from
127.0.0.1) sends about 3 x --calls requests a second, the flood (crates/sipsec-lab/examples/flood.rs
from 127.0.0.2) --flood. Then:

1. goodput: --rounds pairs of runs of --seconds each, calls at --calls per second, without and
   with the flood, the order alternating pair by pair (AB BA AB ...); goodput is the calls
   answered 200 within 500 ms per second of schedule; per pair the ratio with/without, with
   its mean, a 95% t-interval (Student, n-1 degrees of freedom) and the min and max;
2. cost: the server's CPU (utime + stime, /proc/PID/stat, of the process and of its worker
   thread) over --seconds idle, then under the flood alone once the ban is in place, as a
   share of one core; and for reference the same flood against the same server with the
   limit off (`rate = 0`).

    cargo build --release -p sipsec --bin sipsec && cargo build --release --example flood
    scripts/flood_bar.py [--rounds 5] [--calls 2000] [--flood 50000] [--seconds 10] [--pin] [--sham]
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402

# Student's t, 97.5% quantile, by degrees of freedom (a two-sided 95% interval).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 14: 2.145, 19: 2.093, 29: 2.045}


def t975(df):
    return T975.get(df) or T975[max(k for k in T975 if k <= df)]


def cpu_s(pid, worker=False):
    """User + system CPU seconds of process `pid` (all its threads), or of its worker threads
    (`sipsec-worker-N`) alone."""
    paths = [f"/proc/{pid}/stat"]
    if worker:
        paths = [f"/proc/{pid}/task/{t}/stat" for t in os.listdir(f"/proc/{pid}/task")]
    total = 0
    for path in paths:
        head, tail = open(path).read().rsplit(")", 1)
        if worker and not head.split("(", 1)[1].startswith("sipsec-worker"):
            continue
        fields = tail.split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_toml(port, uas_port, db, rate):
    return f"""[server]
listen = ["udp:127.0.0.1:{port}"]
workers = 1
[routing]
default_route = "sip:127.0.0.3:{uas_port}"
[database]
url = "sqlite://{db}"
[flood]
exempt = []
rate = {rate}
ban_s = 60
"""


class Server:
    def __init__(self, a, out, name, rate):
        path = os.path.join(out, f"{name}.toml")
        with open(path, "w") as f:
            f.write(server_toml(a.port, a.port + 20, os.path.join(out, f"{name}.db"), rate))
        pin = ["taskset", "-c", "0"] if a.pin else []
        self.log = open(os.path.join(out, f"{name}.log"), "w")
        self.proc = subprocess.Popen(pin + [a.sipsec, "serve", "--config", path],
                                     stdout=subprocess.PIPE, stderr=self.log,
                                     env=dict(os.environ, SIPSEC_LOG="warn"))
        banner = self.proc.stdout.readline().decode()
        if not banner.startswith("sipsec listening"):
            sys.exit(f"the server did not start: {banner!r} (see {self.log.name})")

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def flood(a, seconds, to=None):
    to = to or f"127.0.0.1:{a.port}"
    return subprocess.Popen([a.flooder, "--from", "127.0.0.2", "--to", to,
                             "--rate", str(a.flood), "--seconds", str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def goodput(a, out, name):
    """One load run of --seconds at --calls: its goodput per second."""
    path = os.path.join(out, f"{name}.json")
    subprocess.run([a.sipsec, "load", f"udp:127.0.0.1:{a.port}", "--local", "127.0.0.1",
                    "--rate", str(a.calls), "--duration", str(a.seconds), "--quiet",
                    "--json", path], stdout=subprocess.DEVNULL)  # failed calls exit 1
    s = json.load(open(path))
    return s["on_time"] / a.seconds, s


def with_flood(a, out, name, to=None):
    # The flood starts first, so its first window (let through before the ban) is behind us.
    f = flood(a, a.seconds + 4, to)
    time.sleep(2)
    g = goodput(a, out, name)
    print("   ", f.communicate()[0].strip())
    return g


def cost(a, out, name, rate):
    """The CPU share of a core of the server process and of its worker thread, idle, then
    under the flood alone (from 2 s after it starts): ((process, worker) idle, flooded)."""
    server = Server(a, out, name, rate)
    pid = server.proc.pid

    def measure():
        c0, w0, t0 = cpu_s(pid), cpu_s(pid, True), time.monotonic()
        time.sleep(a.seconds)
        t = time.monotonic() - t0
        return (cpu_s(pid) - c0) / t, (cpu_s(pid, True) - w0) / t

    try:
        time.sleep(1)
        idle = measure()
        f = flood(a, a.seconds + 3)
        time.sleep(2)
        flooded = measure()
        print("   ", f.communicate()[0].strip())
        return idle, flooded
    finally:
        server.stop()


def main():
    ap = kit.parser(__doc__, rounds=5, calls=2000, flood=50000, seconds=10, port=42600,
                    rate=10000)
    ap.add_argument("--flooder", default=os.path.join(kit.ROOT, "target", "release",
                                                       "examples", "flood"))
    ap.add_argument("--pin", action="store_true", help="pin the server to CPU 0 (taskset)")
    ap.add_argument("--sham", action="store_true",
                    help="in the runs without the flood, run the flooder all the same, aimed at "
                         "a socket of this script's that never reads: on a machine of few "
                         "cores the flooder's own CPU (on loopback the kernel's receive path "
                         "too) then weighs on both arms, and the ratio is the server's")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="sipsec-flood-")
    print(f"results in {out}; load average {os.getloadavg()}")
    uas = subprocess.Popen([a.sipsec, "load", "--role", "uas", "--uas",
                            f"udp:127.0.0.3:{a.port + 20}", "--quiet"],
                           stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.9", 0))
    sink_addr = "%s:%d" % sink.getsockname()
    try:
        server = Server(a, out, "bar", a.rate)
        ratios = []
        try:
            for r in range(a.rounds):
                order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
                got = {}
                for kind in order:
                    name = f"round{r + 1}-{kind}"
                    if kind == "with":
                        got[kind], s = with_flood(a, out, name)
                    elif a.sham:
                        got[kind], s = with_flood(a, out, name, sink_addr)
                    else:
                        got[kind], s = goodput(a, out, name)
                    label = {"with": "with the flood", "without": "without the flood"}[kind]
                    if a.sham and kind == "without":
                        label = "sham flood only"
                    print(f"  round {r + 1}, {label:>17}: goodput {got[kind]:7.1f}/s "
                          f"({s['succeeded']} of {s['attempted']} succeeded, p99 "
                          f"{s['latency_ms']['p99']:.2f} ms) {s['failures_by_reason'] or ''}")
                ratios.append(got["with"] / got["without"])
        finally:
            server.stop()
        n = len(ratios)
        mean = statistics.mean(ratios) if ratios else float("nan")
        half = t975(n - 1) * statistics.stdev(ratios) / n ** 0.5 if n > 1 else float("nan")
        if ratios:
            print(f"goodput with the flood / without, {n} pairs: mean {mean:.4f}, 95% t-interval "
                  f"[{mean - half:.4f}, {mean + half:.4f}], min {min(ratios):.4f}, max "
                  f"{max(ratios):.4f} ([min, max] of {n} holds the next pair's ratio with "
                  f"probability {(n - 1) / (n + 1):.0%})")
            print("  ratios:", " ".join(f"{x:.4f}" for x in ratios))
        for label, rate in [("limit on", a.rate), ("limit off (rate = 0), for reference", 0)]:
            idle, flooded = cost(a, out, f"cost-{rate}", rate)
            print(f"server CPU, {label}: idle {idle[0]:.2%} of a core (worker thread "
                  f"{idle[1]:.2%}); under {a.flood}/s from one address {flooded[0]:.2%} "
                  f"(worker thread {flooded[1]:.2%})")
        print(f"load average at the end: {os.getloadavg()}")
    finally:
        uas.terminate()
        uas.wait()


if __name__ == "__main__":
    main()
