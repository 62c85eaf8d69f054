#!/usr/bin/env python3
"""What a cluster costs per call (issue 36's last bar): calls per node CPU second of a
three-node cluster behind a dispatcher, beside one node alone, alternated round by round.

- `single`: one `sipsec serve` (one worker, PostgreSQL database, no `[cluster]`); the
  callee's USERS users register at it; the caller calls them at RATE a second.
- `cluster`: three nodes (one worker each, `[cluster]` on the same database) behind a
  stateless dispatcher (`mode = "dispatcher"`, `stateful = false`); the callee's users
  register through the dispatcher (each AOR to one node), and the caller calls them through
  it at 3 × RATE a second: each node takes RATE, as the single node does, so neither row
  pays more wake-ups per call for a lower rate.

CPU is the on-CPU time (/proc schedstat) of the nodes' process trees over the measured span
(the dispatcher's apart: the extra hop), wake-ups their voluntary context switches; calls are
those the caller completed. Per round: calls per node CPU second of each row and their ratio
(cluster / single); over the rounds the t-interval of the ratio (`kit.t_interval`). Two cores
hold all of it here — the nodes, the dispatcher, PostgreSQL and both sides of the load — so
the cluster's rows also pay for sharing them.

    cargo build --release --bin sipsec
    python3 scripts/cluster_calls.py --db postgres://USER:PW@127.0.0.1/DB
                                     [--rate 1000] [--rounds 5] [--seconds 15]
"""
import json, os, subprocess, sys, tempfile, time, uuid

from kit import clean_domain, cpu_ns, parser, serve, t_interval, wakeups

DOMAIN = "calls.cluster.test"


def node_config(port, db, node=None):
    return (f'[server]\nlisten = ["udp:127.0.0.1:{port}"]\ndomains = ["{DOMAIN}"]\nworkers = 1\n'
            f'[database]\nurl = "{db}"\n[flood]\nrate = 0\n'
            f'[registrar]\nmax_bindings_per_source = 0\n'
            + (f'[cluster]\nnode = "{node}"\n' if node else ""))


def main():
    ap = parser(__doc__, rate=1000, rounds=5, seconds=15, users=100, port=27700)
    ap.add_argument("--db", default=os.environ.get("SIPSEC_TEST_POSTGRES"), help="PostgreSQL URL")
    args = ap.parse_args()
    if not args.db:
        sys.exit("--db (or SIPSEC_TEST_POSTGRES): a PostgreSQL database the nodes share")
    clean_domain(args.db, DOMAIN)
    work = tempfile.mkdtemp(prefix="cluster-calls-")
    run = uuid.uuid4().hex[:6]
    p = args.port
    single = serve(args.sipsec, work, "single", node_config(p, args.db))
    nodes = [serve(args.sipsec, work, f"n{i}", node_config(p + i, args.db, f"n{i}-{run}"))
             for i in (1, 2, 3)]
    routes = ", ".join(f'{{ uri = "sip:127.0.0.1:{p + i}" }}' for i in (1, 2, 3))
    dispatcher = serve(args.sipsec, work, "dispatcher",
                       f'[server]\nlisten = ["udp:127.0.0.1:{p + 4}"]\ndomains = ["{DOMAIN}"]\n'
                       f'workers = 1\nmode = "dispatcher"\nstateful = false\n[flood]\nrate = 0\n'
                       f'[routing]\ndefault_routes = [{routes}]\n')
    callees = []
    for name, target, uas in (("single", p, p + 10), ("cluster", p + 4, p + 11)):
        users = os.path.join(work, f"users-{name}.csv")
        with open(users, "w") as f:
            f.writelines(f"{name}{run}u{u},x,{DOMAIN}\n" for u in range(args.users))
        callees.append(subprocess.Popen(
            [args.sipsec, "load", "--role", "uas", "--uas", f"udp:127.0.0.1:{uas}", "--register",
             f"udp:127.0.0.1:{target}", "--users", users, "--domain", DOMAIN,
             "--duration", "100000", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"uas-{name}.err"), "w")))
    time.sleep(3)
    rows = {"single": [], "cluster": []}
    try:
        for rnd in range(1, args.rounds + 1):
            order = ["single", "cluster"] if rnd % 2 else ["cluster", "single"]
            for name in order:
                servers = [single] if name == "single" else nodes
                target = p if name == "single" else p + 4
                rate = args.rate * len(servers)
                out = os.path.join(work, f"calls-{rnd}-{name}.json")
                load = subprocess.Popen(
                    [args.sipsec, "load", f"udp:127.0.0.1:{target}", "--users",
                     os.path.join(work, f"users-{name}.csv"), "--domain", DOMAIN,
                     "--rate", str(rate), "--duration", str(args.seconds), "--quiet", "--json", out],
                    stdout=subprocess.DEVNULL, stderr=open(out + ".err", "w"))
                time.sleep(1.0)
                c0 = [cpu_ns(s.pid) for s in servers]
                w0 = [wakeups(s.pid) for s in servers]
                d0 = cpu_ns(dispatcher.pid)
                t0 = time.monotonic()
                time.sleep(args.seconds - 2)
                span = time.monotonic() - t0
                c1 = [cpu_ns(s.pid) for s in servers]
                w1 = [wakeups(s.pid) for s in servers]
                d1 = cpu_ns(dispatcher.pid)
                load.wait()
                summary = json.load(open(out))
                ok, tried = summary["succeeded"], summary["attempted"]
                if ok < 0.99 * tried:
                    sys.exit(f"{name} round {rnd}: {ok} of {tried} calls succeeded; see {work}")
                calls = ok / args.seconds * span
                cpu_s = sum(b - a for a, b in zip(c0, c1)) / 1e9
                row = {
                    "calls_per_s": ok / args.seconds,
                    "calls_per_node_cpu_s": calls / cpu_s,
                    "node_us_per_call": cpu_s * 1e6 / calls,
                    "wakeups_per_call": sum(b - a for a, b in zip(w0, w1)) / calls,
                }
                if name == "cluster":
                    row["dispatcher_us_per_call"] = (d1 - d0) / 1000 / calls
                rows[name].append(row)
                print(json.dumps({"round": rnd, "row": name, **row}), flush=True)
    finally:
        for c in callees:
            c.terminate()
        for s in [single, dispatcher] + nodes:
            s.terminate()
        for s in callees + [single, dispatcher] + nodes:
            s.wait()
        clean_domain(args.db, DOMAIN, check=False)
    print(f"\n{args.rounds} rounds, {args.rate} calls/s per node, {args.seconds} s each "
          f"(mean over rounds ± the 95% t-interval's half-width):")
    for name, rs in rows.items():
        print(f"  {name}:")
        for key in rs[0]:
            mean, half = t_interval([r[key] for r in rs])
            print(f"    {key:24} {mean:9.2f} ± {half:.2f}")
    ratio = [c["calls_per_node_cpu_s"] / s["calls_per_node_cpu_s"]
             for c, s in zip(rows["cluster"], rows["single"])]
    mean, half = t_interval(ratio)
    print(f"  calls per node CPU second, cluster / single: {mean:.3f} ± {half:.3f} (paired by round)")


if __name__ == "__main__":
    main()
