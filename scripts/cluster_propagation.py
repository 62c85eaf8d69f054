#!/usr/bin/env python3
"""A cluster's replication measured (issue 36): how long after node A answers a REGISTER with
200 OK node B routes a request to the new binding, under a cluster-wide registration load,
and what replication costs the nodes and PostgreSQL beside one node taking the same load.

Configurations, alternated in each round (the order turned every round), each run for
SECONDS at RATE registrations a second in all (`sipsec load --scenario register`, every
REGISTER refreshing one of USERS users per node, so each is a write):

- `cluster+probe`: NODES nodes (three by default; `sipsec serve` with `[cluster]`, one
  PostgreSQL database, one worker each) on loopback, RATE/NODES to each (`--no-probe` leaves
  this row out). The probe: every PROBE_MS a fresh AOR registers at
  node A (raw UDP, write-behind as by default); from its 200 OK on, node B is sent an OPTIONS
  for that AOR every POLL_MS until B forwards one to the probe's Contact, and the time from the
  200 OK to that arrival is one sample (B answers 404 until its replica has the binding).
- `cluster`: the same without the probe, for CPU.
- `single`: one node without `[cluster]`, on the same database, taking all RATE.

Per round: the samples' p50, p99 and max; CPU per registration of the nodes together and of
PostgreSQL (every `postgres` process of the machine, which serves nothing else meanwhile:
on-CPU time from /proc over the measured span). Then the t-interval of each over the rounds
(`kit.t_interval`), and what replication adds per registration.

    cargo build --release --bin sipsec
    python3 scripts/cluster_propagation.py --db postgres://USER:PW@127.0.0.1/DB
                                            [--rate 1000] [--rounds 5] [--seconds 15]
                                            [--nodes 3] [--no-probe]
"""
import json, os, select, socket, statistics, subprocess, sys, tempfile, time, uuid

from kit import clean_domain, cpu_ns, parser, serve, t_interval, threads_cpu_ns

DOMAIN = "cluster.test"


def postgres_cpu_ns():
    """On-CPU ns of every process named postgres."""
    pids = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and open(f"/proc/{d}/comm").read().strip() == "postgres":
                pids.append(d)
        except OSError:
            pass
    return threads_cpu_ns(pids)


def start_node(sipsec, work, name, port, db, cluster=True):
    return serve(sipsec, work, name,
                 f'[server]\nlisten = ["udp:127.0.0.1:{port}"]\ndomains = ["{DOMAIN}"]\nworkers = 1\n'
                 f'[database]\nurl = "{db}"\n'
                 + (f'[cluster]\nnode = "{name}"\n' if cluster else "")
                 # Every phone here registers from 127.0.0.1: no per-source limits.
                 + '[flood]\nrate = 0\n[registrar]\nmax_bindings_per_source = 0\nmax_bindings = 1000000\n')


def sip(text):
    return text.replace("\n", "\r\n").encode()


def status(data):
    parts = data.split(b" ", 2)
    return int(parts[1]) if data.startswith(b"SIP/2.0 ") and len(parts) > 1 else 0


class Probe:
    """The probing phone (its Contact socket) and caller."""

    def __init__(self, a, b):
        self.a, self.b = a, b
        self.phone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.phone.bind(("127.0.0.1", 0))
        self.caller = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.caller.bind(("127.0.0.1", 0))
        self.p_addr = "127.0.0.1:%d" % self.phone.getsockname()[1]
        self.c_addr = "127.0.0.1:%d" % self.caller.getsockname()[1]

    def register(self, user):
        """Registers `user` at A; the time its 200 OK arrived, or None."""
        tag = uuid.uuid4().hex[:12]
        self.phone.sendto(sip(
            f"REGISTER sip:{DOMAIN} SIP/2.0\nVia: SIP/2.0/UDP {self.p_addr};branch=z9hG4bK-{tag}\n"
            f"Max-Forwards: 70\nFrom: <sip:{user}@{DOMAIN}>;tag={tag}\nTo: <sip:{user}@{DOMAIN}>\n"
            f"Call-ID: {tag}@probe\nCSeq: 1 REGISTER\nContact: <sip:{user}@{self.p_addr}>;expires=60\n"
            f"Content-Length: 0\n\n"), self.a)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.phone], [], [], 0.1)
            if r:
                data = self.phone.recv(65536)
                if status(data) == 200:
                    return time.monotonic()
        return None

    def routed(self, user, poll_s, limit_s=3.0):
        """Polls B until it forwards an OPTIONS for `user` here: the time that one arrived."""
        start = time.monotonic()
        while time.monotonic() - start < limit_s:
            tag = uuid.uuid4().hex[:12]
            self.caller.sendto(sip(
                f"OPTIONS sip:{user}@{DOMAIN} SIP/2.0\nVia: SIP/2.0/UDP {self.c_addr};branch=z9hG4bK-{tag}\n"
                f"Max-Forwards: 70\nFrom: <sip:probe@{DOMAIN}>;tag={tag}\nTo: <sip:{user}@{DOMAIN}>\n"
                f"Call-ID: {tag}@poll\nCSeq: 1 OPTIONS\nContent-Length: 0\n\n"), self.b)
            until = time.monotonic() + poll_s
            while True:
                left = until - time.monotonic()
                r, _, _ = select.select([self.phone, self.caller], [], [], max(left, 0))
                if self.phone in r:
                    data, src = self.phone.recvfrom(65536)
                    if data.startswith(b"OPTIONS "):
                        at = time.monotonic()
                        self.answer(data, src)
                        return at
                if self.caller in r:
                    self.caller.recv(65536)  # 404 (not there yet), or a 200 of an earlier poll
                if not r:
                    break
        return None

    def answer(self, request, src):
        lines = request.decode(errors="replace").split("\r\n")
        keep = [l for l in lines[1:] if l.split(":", 1)[0].strip().lower() in ("via", "from", "to", "call-id", "cseq")]
        self.phone.sendto(("SIP/2.0 200 OK\r\n" + "\r\n".join(keep) + "\r\nContent-Length: 0\r\n\r\n").encode(), src)


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def measure(args, work, run, tag, nodes, ports, probe):
    """One configuration's round: the load to every node in `ports`, the probe if given."""
    loads = []
    for i, port in enumerate(ports):
        users = os.path.join(work, f"users{i}.csv")
        with open(users, "w") as f:
            f.writelines(f"r{run}p{port}u{u},x,{DOMAIN}\n" for u in range(args.users))
        out = os.path.join(work, f"load-{tag}-{i}.json")
        loads.append((out, subprocess.Popen(
            [args.sipsec, "load", f"udp:127.0.0.1:{port}", "--scenario", "register",
             "--users", users, "--domain", DOMAIN, "--rate", str(args.rate // len(ports)),
             "--duration", str(args.seconds), "--quiet", "--json", out],
            stdout=subprocess.DEVNULL, stderr=open(out + ".err", "w"))))
    time.sleep(1.0)  # the load at its rate
    cpu0 = [cpu_ns(n.pid) for n in nodes]
    pg0 = postgres_cpu_ns()
    t0 = time.monotonic()
    samples, lost, k = [], 0, 0
    while time.monotonic() - t0 < args.seconds - 2:
        if probe is None:
            time.sleep(0.05)
            continue
        k += 1
        user = f"probe{run}{tag}k{k}"
        answered = probe.register(user)
        seen = probe.routed(user, args.poll_ms / 1000) if answered else None
        if seen is None:
            lost += 1
            continue
        samples.append((seen - answered) * 1000)
        time.sleep(max(0, args.probe_ms / 1000 - (time.monotonic() - answered)))
    span = time.monotonic() - t0
    cpu1 = [cpu_ns(n.pid) for n in nodes]
    pg1 = postgres_cpu_ns()
    made = attempted = 0
    for out, p in loads:
        p.wait()
        summary = json.load(open(out))
        made += summary["succeeded"]
        attempted += summary["attempted"]
    # The load's registrations over its whole run, CPU over the measured span: scaled.
    regs = made / args.seconds * span
    if made < 0.99 * attempted:
        sys.exit(f"{tag}: only {made} of {attempted} registrations succeeded: see {work}")
    row = {
        "registrations_per_s": made / args.seconds,
        "nodes_us_per_registration": sum(b - a for a, b in zip(cpu0, cpu1)) / 1000 / regs,
        "postgres_us_per_registration": (pg1 - pg0) / 1000 / regs,
    }
    if probe is not None:
        row.update({
            "samples": len(samples),
            "lost": lost,
            "p50_ms": pct(samples, 0.5),
            "p99_ms": pct(samples, 0.99),
            "max_ms": max(samples, default=float("nan")),
        })
    return row


def main():
    ap = parser(__doc__, rate=1000, rounds=5, seconds=15, users=3000, probe_ms=50, poll_ms=2, port=27600,
                nodes=3)
    ap.add_argument("--no-probe", action="store_true", help="leave out the `cluster+probe` row")
    ap.add_argument("--db", default=os.environ.get("SIPSEC_TEST_POSTGRES"), help="PostgreSQL URL")
    args = ap.parse_args()
    if not args.db:
        sys.exit("--db (or SIPSEC_TEST_POSTGRES): a PostgreSQL database the nodes share")
    clean_domain(args.db, DOMAIN)
    work = tempfile.mkdtemp(prefix="cluster-prop-")
    run = uuid.uuid4().hex[:6]
    if not 2 <= args.nodes <= 9:
        sys.exit("--nodes: 2 to 9")
    names = [f"{n}-{run}" for n in "abcdefghi"[: args.nodes]]
    ports = [args.port + i for i in range(args.nodes)]
    nodes = [start_node(args.sipsec, work, n, p, args.db) for n, p in zip(names, ports)]
    single_port = args.port + 10
    single = start_node(args.sipsec, work, f"single-{run}", single_port, args.db, cluster=False)
    time.sleep(1.0)
    probe = Probe(("127.0.0.1", ports[0]), ("127.0.0.1", ports[1]))
    configs = {
        "cluster+probe": (nodes, ports, probe),
        "cluster": (nodes, ports, None),
        "single": ([single], [single_port], None),
    }
    if args.no_probe:
        del configs["cluster+probe"]
    rows = {c: [] for c in configs}
    try:
        for rnd in range(1, args.rounds + 1):
            order = list(configs)
            if rnd % 2 == 0:
                order.reverse()
            for c in order:
                nodes_c, ports_c, probe_c = configs[c]
                row = measure(args, work, run, f"{rnd}{c[0]}{len(c)}", nodes_c, ports_c, probe_c)
                rows[c].append(row)
                print(json.dumps({"round": rnd, "config": c, **row}), flush=True)
    finally:
        for n in nodes + [single]:
            n.terminate()
        for n in nodes + [single]:
            n.wait()
        clean_domain(args.db, DOMAIN)
    print(f"\n{args.rounds} rounds, {args.nodes} nodes, {args.rate} REGISTERs/s offered in all, {args.seconds} s "
          f"each; probe every {args.probe_ms} ms, polled every {args.poll_ms} ms "
          f"(mean over rounds ± the 95% t-interval's half-width):")
    for c, rs in rows.items():
        print(f"  {c}:")
        for key in rs[0]:
            mean, half = t_interval([r[key] for r in rs])
            print(f"    {key:32} {mean:9.2f} ± {half:.2f}")
    for key in ("nodes_us_per_registration", "postgres_us_per_registration"):
        diff = [a[key] - b[key] for a, b in zip(rows["cluster"], rows["single"])]
        mean, half = t_interval(diff)
        print(f"  replication adds to {key}: {mean:.2f} ± {half:.2f} (paired by round)")


if __name__ == "__main__":
    main()
