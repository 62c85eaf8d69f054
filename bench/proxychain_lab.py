#!/usr/bin/env python3
"""Seed 001's comparison on this machine: no authentication, digest with the user database
33 ms away (without a credential cache, one query per authentication as the paper's servers
did, and with sipsec's cache), Proxychain, and Proxychain with prefetching, with the authority
33 ms away (`sipsec delay-relay` in front of the database and of `sipsec authd`; `tc netem` is
not available here). The digest rows need PostgreSQL (`--postgres URL`, e.g. the tests'
SIPSEC_TEST_POSTGRES); SQLite cannot be put across a network.

Per row, `sipsec bench` (server pinned to CPU 0; the load generator, the authority and the
relay on CPU 1) at a fixed rate gives the server CPU per call, and, through `--peer-pid`, the
authority's (or, for digest, PostgreSQL's) CPU over the same measured run: shown as read and
less the peer's idle rate (its once-a-second database polls), read for --idle-s seconds after
the run. The authority logs its counters on SIGUSR1, sent when the measured run starts, and
when it stops; their difference gives the chains issued and the bytes between proxy and
authority per measured call, without the warm-up's first chain per user. A second pass at a low rate (as seed 001 measured
it: under 5 calls/s) with few users, so that chains run out during the run, gives the
call-setup latency (INVITE to 200, including the 407 round). A third pass, with --peak, finds
each row's peak rate (`--find-peak`: ≥ 99% of calls succeed within 500 ms). Rows are
alternated per round; medians are shown.

    cargo build --release
    python3 bench/proxychain_lab.py [--rounds 3] [--rtt-ms 33] [--peak] [--postgres URL]
        [--cpu-users 100] [--rate 500] [--calls 4000] [--users 20000] [--peak-start 2000]

The peak pass uses many users (20,000), as real ones call seldom: at 10,000 calls/s each then
calls every two seconds. With few users, one user's concurrent calls race for the same chain
value and the losers start over, which measures the lab, not the protocol. The row "answered
ahead" is the client option of docs/proxychain.md (`--auth-reuse`): one challenge per chain.
"""
import argparse, json, os, re, signal, statistics, subprocess, sys, tempfile, time

REALM = "lab.test"
AUTHD, RELAY = "127.0.0.1:35070", "127.0.0.1:35071"
DB_RELAY = "127.0.0.1:35072"


def cpu_seconds(pid):
    """User + system CPU of a process, in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(cmd, log, cpu):
    p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=subprocess.PIPE,
                         stderr=open(log, "w"), text=True, env={**os.environ, "SIPSEC_LOG": "info"})
    line = p.stdout.readline()
    if not line:
        sys.exit(f"{cmd[1]} did not start: {open(log).read()}")
    return p


def stop(p):
    p.terminate()
    p.wait()


def server_config(work, auth, db=None):
    db = db or f"sqlite://{work}/users.db"
    return (f"[server]\nlisten = [\"udp:127.0.0.1:35060\"]\ndomains = [\"bench.test\"]\n"
            f"mode = \"proxy\"\nstateful = true\nrecord_route = true\nworkers = 1\n"
            f"[routing]\ndefault_route = \"sip:127.0.0.3:35080;transport=udp\"\n"
            f"[database]\nurl = \"{db}\"\n"
            f"[tls]\ncert = \"{work}/certs/client.pem\"\nkey = \"{work}/certs/client-key.pem\"\n"
            f"ca = \"{work}/certs/ca.pem\"\n{auth}")


class Row:
    """One configuration: its [auth] table, whether it needs the authority, the database URL
    the proxy uses and where the relay forwards it (None: the local SQLite), extra load
    arguments, and where its peak search starts (the digest row without a cache collapses
    far below the others)."""

    def __init__(self, name, auth, pc=False, db=None, load=(), peak_start=None):
        self.name, self.auth, self.pc, self.db = name, auth, pc, db
        self.load, self.peak_start = list(load), peak_start


def rows(remote_db):
    pc = (f"[auth]\nscheme = \"proxychain\"\nauthority = \"tls:{RELAY}\"\nchain_length = 10\n"
          f"methods = [\"INVITE\"]\nwait_ms = 2000\n")
    digest = (f"[auth]\nscheme = \"digest\"\nrealm = \"{REALM}\"\nmethods = [\"INVITE\"]\n"
              f"algorithms = [\"SHA-256\"]\n")
    out = [Row("no auth", "")]
    if remote_db:
        out += [Row("digest, no cache (a query per call)", digest + "credential_cache = false\n",
                    db=remote_db, peak_start=10),
                Row("digest, sipsec's cache", digest, db=remote_db)]
    return out + [
        Row("proxychain", pc + "prefetch_at = 0\n", pc=True),
        Row("proxychain + prefetch", pc, pc=True),
        Row("proxychain + prefetch, answered ahead", pc, pc=True, load=["--auth-reuse"]),
    ]


def counters(line):
    """The name=value counters of an authority log line."""
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def bench(binary, work, name, config, proxychain, args, rtt, users="users.csv", db=None,
          db_pid=None, idle_s=0):
    """One bench run of a row. Returns the report, with "peer_busy_us_per_op" (the authority's
    or the database's CPU per call over the measured run, less its idle rate measured for
    `idle_s` seconds afterwards) and, for Proxychain, "authd" (its counters over the measured
    run: SIGUSR1 when measuring starts, then the stop line)."""
    path = os.path.join(work, "row.toml")
    open(path, "w").write(config)
    authd = relay = None
    if db:
        relay = start([binary, "delay-relay", DB_RELAY, db, "--rtt-ms", str(rtt)],
                      f"{work}/relay.log", 1)
    if proxychain:
        authd = start([binary, "authd", "--config", f"{work}/authd.toml"], f"{work}/authd.log", 1)
        relay = start([binary, "delay-relay", RELAY, AUTHD, "--rtt-ms", str(rtt)],
                      f"{work}/relay.log", 1)
    peer = authd.pid if authd else db_pid
    out = tempfile.mktemp(suffix=".json")
    extra = ["--proxychain-realm", REALM] if proxychain else []
    extra += ["--peer-pid", str(peer)] if peer else []
    p = subprocess.Popen([binary, "bench", "--config", path, "--users", f"{work}/{users}",
                          "--domain", "elsewhere.test", "--json", out] + extra + args,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = []
    for line in p.stderr:
        err.append(line)
        if authd and "sipsec bench: measuring" in line:
            authd.send_signal(signal.SIGUSR1)
    p.wait()
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit(f"{name}: bench failed: {''.join(err)[-2000:]}")
    r = json.load(open(out))
    os.unlink(out)
    if relay:
        stop(relay)
    r["peer_busy_us_per_op"] = 0.0
    if peer and idle_s:
        # The server has stopped: what the peer burns now is its idle work (polls, timers).
        tree = [peer] + [int(x) for x in subprocess.run(
            ["pgrep", "-P", str(peer)], capture_output=True, text=True).stdout.split()]
        c0 = sum(cpu_seconds(t) for t in tree if os.path.exists(f"/proc/{t}"))
        time.sleep(idle_s)
        c1 = sum(cpu_seconds(t) for t in tree if os.path.exists(f"/proc/{t}"))
        idle_us = (c1 - c0) / idle_s * r["measured_s"] * 1e6 / max(r["ops"], 1)
        r["peer_busy_us_per_op"] = r["peer_cpu_us_per_op"] - idle_us
    if authd:
        stop(authd)
        log = open(f"{work}/authd.log").read().splitlines()
        first = next((counters(l) for l in log if "counters;" in l), None)
        last = next((counters(l) for l in log if "stopped;" in l), None)
        if first and last:
            r["authd"] = {k: last[k] - first[k] for k in last}
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", default="target/release/sipsec")
    ap.add_argument("--users", type=int, default=20000,
                    help="callers in the peak pass; the warm-up makes one call per user, so every "
                         "user holds a chain when measuring starts (as the paper preloaded them)")
    ap.add_argument("--cpu-users", type=int, default=100,
                    help="callers in the CPU pass: few enough that each runs through several "
                         "chains in the measured run, so issuing is at its steady rate")
    ap.add_argument("--latency-rate", type=float, default=5)
    ap.add_argument("--latency-calls", type=int, default=200, help="0: no latency pass")
    ap.add_argument("--latency-users", type=int, default=5,
                    help="few users, so each one's chains run out during the latency pass")
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rtt-ms", type=float, default=33.0)
    ap.add_argument("--idle-s", type=float, default=5.0,
                    help="seconds the authority's (or database's) idle CPU rate is read for, "
                         "after each measured run, to subtract it")
    ap.add_argument("--peak", action="store_true", help="also find each row's peak rate")
    ap.add_argument("--only", default="", help="rows whose names match this regex")
    ap.add_argument("--peak-start", type=int, default=2000,
                    help="the peak search's first rate, also the warm-up's")
    ap.add_argument("--postgres", default=os.environ.get("SIPSEC_TEST_POSTGRES"),
                    help="PostgreSQL URL for the digest rows (default: $SIPSEC_TEST_POSTGRES)")
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    work = tempfile.mkdtemp()
    subprocess.run([binary, "certs", "--client-name", "proxy-1", "--out", f"{work}/certs"],
                   check=True, stdout=subprocess.DEVNULL)
    open(f"{work}/users.csv", "w").write("".join(f"u{i},pw{i}\n" for i in range(a.users)))
    open(f"{work}/steady.csv", "w").write("".join(f"u{i},pw{i}\n" for i in range(a.cpu_users)))
    open(f"{work}/few.csv", "w").write("".join(f"u{i},pw{i}\n" for i in range(a.latency_users)))
    open(f"{work}/users.toml", "w").write(f"[database]\nurl = \"sqlite://{work}/users.db\"\n")
    subprocess.run([binary, "users", "--config", f"{work}/users.toml", "--realm", REALM,
                    "import", f"{work}/users.csv"], check=True, stdout=subprocess.DEVNULL)
    open(f"{work}/authd.toml", "w").write(
        f"[authd]\nlisten = \"{AUTHD}\"\nrealm = \"{REALM}\"\n"
        f"database = \"sqlite://{work}/users.db\"\ncert = \"{work}/certs/server.pem\"\n"
        f"key = \"{work}/certs/server-key.pem\"\nca = \"{work}/certs/ca.pem\"\nchain_length = 10\n")
    remote = None
    if a.postgres:
        m = re.match(r"(postgres(?:ql)?://[^@]+@)([^/]+)(/.*)", a.postgres)
        open(f"{work}/pg.toml", "w").write(f"[database]\nurl = \"{a.postgres}\"\n")
        subprocess.run([binary, "users", "--config", f"{work}/pg.toml", "--realm", REALM,
                        "import", f"{work}/users.csv"], check=True, stdout=subprocess.DEVNULL)
        # The proxy reaches PostgreSQL through the delay relay.
        remote = (m.group(1) + DB_RELAY + m.group(3), m.group(2))
    else:
        print("no --postgres: the digest rows are skipped", file=sys.stderr)
    db_pid = None
    if a.postgres:
        # The postmaster: its children are the backends that serve the proxy's queries.
        found = subprocess.run(["pgrep", "-o", "-x", "postgres"], capture_output=True, text=True)
        db_pid = int(found.stdout.split()[0]) if found.stdout.split() else None
    table = [row for row in rows(remote) if re.search(a.only, row.name)]
    if not table or table[0].name != "no auth":
        sys.exit("--only must keep the \"no auth\" row: the others are read against it")
    res = {row.name: [] for row in table}
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        for row in table:
            cfg = server_config(work, row.auth, row.db and row.db[0])
            target = row.db and row.db[1]
            rep = bench(binary, work, row.name, cfg, row.pc,
                        ["--rate", str(a.rate), "--calls", str(a.calls),
                         "--warmup-calls", str(a.cpu_users)] + row.load,
                        a.rtt_ms, users="steady.csv", db=target,
                        db_pid=db_pid if row.db else None, idle_s=a.idle_s)
            ops = max(rep["ops"], 1)
            moved = rep.get("authd", {})
            lat = rep
            if a.latency_calls:
                lat = bench(binary, work, row.name, cfg, row.pc,
                            ["--rate", str(a.latency_rate), "--calls", str(a.latency_calls),
                             "--warmup-calls", "1"] + row.load, a.rtt_ms, users="few.csv",
                            db=target)
            res[row.name].append({
                "server_us": rep["server_cpu_us_per_op"],
                "peer_us": rep["peer_cpu_us_per_op"],
                "peer_busy_us": rep["peer_busy_us_per_op"],
                "bytes": (moved.get("bytes_in", 0) + moved.get("bytes_out", 0)) / ops,
                "issued": moved.get("issued", 0) / ops,
                "p50": lat["load"]["latency_ms"]["p50"],
                "p99": lat["load"]["latency_ms"]["p99"],
                "ok": min(rep["load"]["succeeded"] / max(rep["load"]["attempted"], 1),
                          lat["load"]["succeeded"] / max(lat["load"]["attempted"], 1)),
            })
        print(json.dumps(res), file=sys.stderr)
    med = lambda name, k: statistics.median(x[k] for x in res[name])
    base = med("no auth", "server_us")
    latency = (f"latency at {a.latency_rate} calls/s, {a.latency_calls} calls from "
               f"{a.latency_users} users" if a.latency_calls else
               "latency of the same measured run")
    print(f"{a.cpu_users} users, {a.rate} calls/s, {a.calls} calls, {a.rounds} rounds (medians); "
          f"authority or database {a.rtt_ms} ms away; {latency}")
    print("| configuration | server µs/call | ÷ no auth | authority or database µs/call: "
          "all, less idle | chains issued/call | bytes/call proxy↔authority | setup p50 ms "
          "| p99 ms | succeeded |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in table:
        name = row.name
        print(f"| {name} | {med(name, 'server_us'):.1f} | {med(name, 'server_us') / base:.2f} | "
              f"{med(name, 'peer_us'):.1f}, {med(name, 'peer_busy_us'):.1f} | "
              f"{med(name, 'issued'):.3f} | {med(name, 'bytes'):.1f} | {med(name, 'p50'):.2f} | "
              f"{med(name, 'p99'):.2f} | {min(x['ok'] for x in res[name]):.3f} |")
    if a.peak:
        print(f"\npeak calls/s (≥ 99% within 500 ms), {a.users} users, {a.rounds} rounds "
              f"alternated; median, the rounds:")
        peaks = {row.name: [] for row in table}
        for r in range(a.rounds):
            for row in table:
                start = row.peak_start or a.peak_start
                # Every user makes one call first, so each holds a chain (the paper preloaded
                # them); a cacheless row has nothing to warm.
                warm = 10 if row.peak_start else a.users
                rep = bench(binary, work, row.name,
                            server_config(work, row.auth, row.db and row.db[0]), row.pc,
                            ["--rate", str(start), "--calls", "1000", "--find-peak",
                             "--warmup-calls", str(warm)] + row.load, a.rtt_ms,
                            db=row.db and row.db[1])
                peaks[row.name].append(rep.get("peak_per_s") or 0)
            print(json.dumps(peaks), file=sys.stderr)
        base_peak = statistics.median(peaks["no auth"])
        for name, v in peaks.items():
            m = statistics.median(v)
            print(f"  {name}: {m:.0f} ({m / max(base_peak, 1):.2f} of no auth); "
                  f"{', '.join(f'{x:.0f}' for x in v)}")


if __name__ == "__main__":
    main()
