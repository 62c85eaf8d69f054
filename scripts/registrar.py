#!/usr/bin/env python3
"""The registrar path beside Kamailio's: server CPU per REGISTER (and per redirected INVITE)
under SIPp, sipsec and Kamailio 5.6 alternated round by round, and each server's peak
REGISTER rate.

Rows (SQLite for sipsec's database; Kamailio's usrloc in memory only, `db_mode` 0, which
loses every registration on a restart):

- `kamailio`: `peers/kamailio/registrar.cfg`.
- `sipsec write-behind`: the default: answered at once, written to a SQLite file within
  about 10 ms (survives a restart, not a SIGKILL in that window).
- `sipsec durable`: `[registrar] durable = true`: answered once committed (survives SIGKILL).
- `sipsec memory`: `sqlite::memory:`, which keeps nothing across a restart, like Kamailio's
  mode; the database work is still done.
- `floor`: `examples/register_floor.rs`, which answers 200 OK (302 to an INVITE) from the
  request's lines and keeps nothing: one blocking receive per message and one send per answer,
  the kernel and wake-up cost every UDP registrar or redirect server pays. "above floor" is a row's cost minus the floor's in the same round.

Two loads, on CPU 1, the server pinned to CPU 0 with one worker: SIPp's
`peers/sipp/register.xml` (1,000 users refreshing, each REGISTER a new Call-ID, Expires 3600),
which sends in bursts of a few REGISTERs per millisecond tick, so a server wakes once per
several; and `sipsec load --scenario register`, which sends each REGISTER when it falls due, as
independent phones do, so a server at 2,000/s wakes for almost every one. Each row warms up
with WARMUP registrations and then measures CALLS; CPU is the on-CPU time (`schedstat`) of
every thread of the server's process tree over the measured run, wake-ups their voluntary
context switches. The redirect rows register the users, then measure `peers/sipp/redirect.xml`
(INVITE answered 302 from the location service, ACK) against sipsec's `mode = "redirect"` and
the same Kamailio config (whose 302 is stateless, `sl_send_reply`; sipsec's with and without
a transaction, `stateful = false`). `--peak` adds `sipsec bench --find-peak --scenario register` for
each server: the highest rate with ≥ 99% of registrations answered within 500 ms.

    cargo build --release --bin sipsec --example register_floor
    python3 scripts/registrar.py [--rates 2000,10000] [--loads sipp,sipsec] [--rounds 3]
                               [--calls 20000] [--peak] [--only TEXT]

Needs SIPp and Debian's kamailio.
"""
import argparse, os, shutil, statistics, subprocess, sys, tempfile, time, json

from kit import KAMAILIO, SIPP, tree
USERS = 1000



def cpu(pids):
    """Total on-CPU ns and voluntary context switches of every thread of `pids`."""
    ns = vcs = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                ns += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
                status = open(f"/proc/{pid}/task/{t}/status").read()
                vcs += int(next(l for l in status.splitlines()
                                if l.startswith("voluntary_ctxt")).split()[1])
            except (OSError, StopIteration):
                pass
    return ns, vcs


def sipp(scenario, target, rate, n, port):
    """Runs a SIPp scenario to completion on CPU 1; returns how many calls failed."""
    p = subprocess.run(["taskset", "-c", "1", "sipp", "-sf", os.path.join(SIPP, scenario),
                        "-inf", os.path.join(SIPP, "users.csv"), "-i", "127.0.0.2",
                        "-p", str(port), target, "-r", str(rate), "-m", str(n), "-nostdin",
                        "-timeout", str(max(30, 4 * n // rate)), "-timeout_error"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 0 if p.returncode == 0 else n  # SIPp exits non-zero when any call failed


class Server:
    """A server under test, started pinned to CPU 0 and stopped at the end of the row."""

    def __init__(self, name, start, target):
        self.name, self.start, self.target = name, start, target

    def __enter__(self):
        self.proc = self.start()
        time.sleep(2)
        if self.proc.poll() is not None:
            sys.exit(f"{self.name} did not start")
        self.pids = tree(self.proc.pid)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
        time.sleep(0.5)


def sipsec(binary, work, name, db, extra="", mode="proxy", server_extra=""):
    cfg = os.path.join(work, f"{name.replace(' ', '_')}.toml")
    open(cfg, "w").write(
        f'[server]\nlisten = ["udp:127.0.0.1:35060"]\ndomains = ["bench.test"]\n'
        f'workers = 1\nmode = "{mode}"\n{server_extra}\n[registrar]\n{extra}\n'
        f'[database]\nurl = "{db}"\n')

    def start():
        for f in os.listdir(work):
            if f.startswith("reg.db"):
                os.unlink(os.path.join(work, f))
        return subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", cfg],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Server(name, start, "127.0.0.1:35060"), cfg


def floor(binary):
    exe = os.path.join(os.path.dirname(binary), "examples", "register_floor")

    def start():
        return subprocess.Popen(["taskset", "-c", "0", exe, "127.0.0.1:35060"])
    return Server("floor", start, "127.0.0.1:35060")


def kamailio(work):
    cfg = os.path.join(work, "kamailio.cfg")
    shutil.copy(os.path.join(KAMAILIO, "registrar.cfg"), cfg)

    def start():
        log = open(os.path.join(work, "kamailio.log"), "w")
        return subprocess.Popen(["taskset", "-c", "0", "kamailio", "-DD", "-E", "-f", cfg,
                                 "-m", "512", "-M", "32", "-Y", work, "-w", work],
                                stdout=log, stderr=log)
    return Server("kamailio", start, "127.0.0.1:5060")


def sipsec_load(binary, target, rate, n):
    """`sipsec load` registrations on CPU 1; returns how many failed."""
    p = subprocess.run(["taskset", "-c", "1", binary, "load", target, "--scenario", "register",
                        "--domain", "bench.test", "--rate", str(rate), "--calls", str(n), "-q"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 0 if p.returncode == 0 else n


def measure(binary, server, load, scenario, rate, warmup, calls):
    """µs of server CPU and wake-ups per operation over `calls` after `warmup`."""
    def run(n, port):
        if load == "sipsec":
            return sipsec_load(binary, s.target, rate, n)
        return sipp(scenario, s.target, rate, n, port)
    with server as s:
        if scenario == "redirect.xml":
            sipp("register.xml", s.target, 2000, USERS, 35070)
        run(warmup, 35071)
        ns0, v0 = cpu(s.pids)
        failed = run(calls, 35072)
        ns1, v1 = cpu(s.pids)
    if failed:
        print(f"  warning: {s.name} {scenario} at {rate}/s: some calls failed", file=sys.stderr)
    return (ns1 - ns0) / calls / 1e3, (v1 - v0) / calls


def peak(binary, server, cfg):
    out = tempfile.mktemp(suffix=".json")
    args = [binary, "bench", "--scenario", "register", "--find-peak", "--calls", "20000",
            "--rate", "2000", "-q", "--json", out]
    if cfg:
        args += ["--config", cfg]
        subprocess.run(args, stdout=subprocess.DEVNULL, check=True)
    else:
        with server as s:
            args += ["--server-pid", str(s.proc.pid), "--target", s.target]
            subprocess.run(args, stdout=subprocess.DEVNULL, check=True)
    r = json.load(open(out))
    os.unlink(out)
    return r["peak_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", default="target/release/sipsec")
    ap.add_argument("--rates", default="2000,10000")
    ap.add_argument("--loads", default="sipp,sipsec")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=4000)
    ap.add_argument("--peak", action="store_true")
    ap.add_argument("--only", help="row names containing this")
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    work = tempfile.mkdtemp()
    file_db = f"sqlite://{work}/reg.db"
    servers = [floor(binary), kamailio(work)]
    for name, db, extra in [("sipsec write-behind", file_db, ""),
                            ("sipsec durable", file_db, "durable = true"),
                            ("sipsec memory", "sqlite::memory:", "")]:
        servers.append(sipsec(binary, work, name, db, extra)[0])
    redirect = [floor(binary), kamailio(work),
                sipsec(binary, work, "sipsec redirect", file_db, mode="redirect")[0],
                sipsec(binary, work, "sipsec-stateless redirect", file_db, mode="redirect",
                       server_extra="stateful = false")[0]]
    rates = [int(r) for r in a.rates.split(",")]
    rows = [(f"{s.name} register {r}/s {load}", s, load, "register.xml", r)
            for load in a.loads.split(",") for r in rates for s in servers]
    rows += [(f"{s.name.split()[0]} redirect 2000/s sipp", s, "sipp", "redirect.xml", 2000)
             for s in redirect]
    if a.only:
        rows = [r for r in rows if a.only in r[0]]
    res = {name: [] for name, *_ in rows}
    for rnd in range(a.rounds):
        print(f"round {rnd + 1}/{a.rounds}", file=sys.stderr)
        for name, server, load, scenario, rate in rows:
            res[name].append(measure(binary, server, load, scenario, rate, a.warmup, a.calls))
    print(f"server CPU per operation, µs (median of {a.rounds} rounds; the rounds), wake-ups "
          f"per operation, and the same above the floor; {a.calls} operations after {a.warmup}")
    print("| row | µs/op | rounds | wake-ups/op | ÷ Kamailio | above floor | ÷ Kamailio's |")
    print("|---|---:|---|---:|---:|---:|---:|")
    med = {n: statistics.median(u for u, _ in v) for n, v in res.items()}

    def above(name):
        """Median over rounds of the row's cost minus the floor's in the same round."""
        _, kind, rate, load = name.rsplit(" ", 3)
        fl = res.get(f"floor {kind} {rate} {load}")
        if not fl:
            return None
        return statistics.median(u - f for (u, _), (f, _) in zip(res[name], fl))
    for name, vals in res.items():
        _, kind, rate, load = name.rsplit(" ", 3)
        base = med.get(f"kamailio {kind} {rate} {load}")
        ratio = f"{med[name] / base:.2f}" if base else ""
        wake = statistics.median(w for _, w in vals)
        rounds = ", ".join(f"{u:.1f}" for u, _ in vals)
        mine, theirs = above(name), above(f"kamailio {kind} {rate} {load}")
        extra = f"{mine:.1f}" if mine is not None else ""
        extra_ratio = f"{mine / theirs:.2f}" if mine is not None and theirs else ""
        print(f"| {name} | {med[name]:.1f} | {rounds} | {wake:.2f} | {ratio} | {extra} | "
              f"{extra_ratio} |")
    if a.peak:
        print("| peak REGISTERs/s (≥ 99% within 500 ms, `sipsec bench --find-peak`) | |")
        k = peak(binary, kamailio(work), None)
        s = peak(binary, None, sipsec(binary, work, "sipsec peak", file_db)[1])
        print(f"| kamailio | {k:.0f} |\n| sipsec write-behind | {s:.0f} |")
        if k:
            print(f"sipsec ÷ Kamailio peak: {s / k:.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
