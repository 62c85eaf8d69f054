#!/usr/bin/env python3
"""A cluster on one machine, every part a host of its own (issue 36's testbed): network
namespaces joined by a bridge, each with its address from 198.18.0.0/15 — a private
PostgreSQL instance (`pg`, 198.18.36.10), NODES `sipsec serve` nodes (three by default) with
`[cluster]` and `durable = true` (`n1`…, from .11) that authenticate INVITE and BYE with Proxychain, each
with a certificate of its own, against one `sipsec authd` (`authd`, .20, its users in the same
database), a stateful dispatcher in front (`d`, .2) and the load (`load`, .30: a registering
`sipsec load` callee and the callers, `--proxychain`). Root; `ip`, and PostgreSQL's server
binaries (Debian's `postgresql`).

Scenarios, in order, each printed as one JSON line:

1. `calls`: the callee's USERS users register through the dispatcher (each AOR to one node);
   CALLS calls at RATE through it, each authenticated with the calling user's chain at the
   node its Call-ID lands on.
2. `revocation`: 20 users get new passwords; the authority must push the revocation to more
   than one node (each holding a chain of one of them), and calls with the new passwords
   succeed.
3. `node-killed`: a call load runs while node n2 is killed (SIGKILL) a second in; then, after
   the dispatcher's probes have taken it out, CALLS more calls: that share must be ≥ 99%.
   Every acknowledged (durable) registration must still be held by the nodes left.
4. `postgres-restarted`: PostgreSQL is stopped (fast shutdown) and started again two seconds
   later while calls run: the nodes route them from memory; once it is back every node's
   listener has resynchronised (its log says so), and calls after it must be ≥ 99%.

Then everything is torn down (processes killed, namespaces and the database's directory
deleted).

    sudo python3 scripts/cluster_testbed.py [--nodes 3] [--users 200] [--calls 300] [--rate 50]
                                            [--json FILE --round N --commit C]

`sipsec lab run cluster` runs it once per round, into the results directory's cluster.jsonl.
"""
import json, os, shutil, signal, subprocess, sys, tempfile, time

import kit
from kit import parser

NET = "198.18.36"
# The nodes (`n1`…, from .11) are added by `--nodes`.
HOSTS = {"pg": 10, "d": 2, "authd": 20, "load": 30}
DOMAIN = "testbed.example"
PG_BIN = next((f"/usr/lib/postgresql/{v}/bin" for v in ("17", "16", "15", "14", "13")
               if os.path.exists(f"/usr/lib/postgresql/{v}/bin/postgres")), None)


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


def ip(host):
    return f"{NET}.{HOSTS[host]}"


class Testbed:
    def __init__(self, prefix, work):
        self.prefix, self.work = prefix, work
        self.ns = {h: f"{prefix}-{h}" for h in HOSTS}
        self.switch = f"{prefix}-sw"
        self.procs = []

    def build(self):
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for host, ns in self.ns.items():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.switch, "link", "add", f"p-{host}", "type", "veth",
               "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.switch, "link", "set", f"p-{host}", "master", "br0")
            sh("ip", "-n", self.switch, "link", "set", f"p-{host}", "up")
            sh("ip", "-n", ns, "addr", "add", f"{ip(host)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def run(self, host, args, log=None, **kw):
        """Starts `args` in `host`'s namespace; its Popen."""
        out = open(os.path.join(self.work, log), "w") if log else subprocess.DEVNULL
        p = subprocess.Popen(["ip", "netns", "exec", self.ns[host], *args],
                             stdout=kw.pop("stdout", out), stderr=out, **kw)
        self.procs.append(p)
        return p

    def teardown(self):
        for ns in list(self.ns.values()) + [self.switch]:
            out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
            for pid in out.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Postgres:
    """A private PostgreSQL instance in the `pg` host, trusting the testbed's network."""

    def __init__(self, bed):
        self.bed = bed
        self.data = os.path.join(bed.work, "pgdata")
        os.makedirs(self.data)
        shutil.chown(self.data, "postgres", "postgres")
        shutil.chown(bed.work, "postgres", "postgres")
        sh("runuser", "-u", "postgres", "--", f"{PG_BIN}/initdb", "-D", self.data, "-A", "trust")
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
            f.write(f"host all all {NET}.0/24 trust\n")
        self.url = f"postgres://postgres@{ip('pg')}:5432/postgres"

    def start(self):
        self.proc = self.bed.run("pg", ["runuser", "-u", "postgres", "--", f"{PG_BIN}/postgres",
                                        "-D", self.data, "-c", f"listen_addresses={ip('pg')}",
                                        "-c", f"unix_socket_directories={self.data}"],
                                 log="postgres.log")
        for _ in range(100):
            if subprocess.run(["ip", "netns", "exec", self.bed.ns["pg"], f"{PG_BIN}/pg_isready",
                               "-h", ip("pg"), "-q"]).returncode == 0:
                return
            time.sleep(0.1)
        sys.exit("PostgreSQL did not start: " + open(os.path.join(self.bed.work, "postgres.log")).read())

    def stop(self):
        sh("runuser", "-u", "postgres", "--", f"{PG_BIN}/pg_ctl", "stop", "-m", "fast", "-w",
           "-D", self.data)
        self.proc.wait()


def serve(bed, host, text):
    """`sipsec serve` in `host`'s namespace, once it printed its banner."""
    p = kit.serve(SIPSEC, bed.work, host, text, prefix=["ip", "netns", "exec", bed.ns[host]])
    bed.procs.append(p)
    return p


def write_users(path, count, changed):
    """The users file (`user,password,domain`), with the passwords `changed` gives."""
    with open(path, "w") as f:
        f.writelines(f"u{u},{changed.get(f'u{u}', 'x')},{DOMAIN}\n" for u in range(count))


def users_cmd(bed, args):
    """`sipsec users` on the testbed's database, from the load host."""
    p = subprocess.run(["ip", "netns", "exec", bed.ns["load"], SIPSEC, "users", "--config",
                        os.path.join(bed.work, "users.toml"), "--realm", DOMAIN, *args],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"sipsec users {' '.join(args)}: {p.stderr}")


def calls(bed, users, count, rate, tag):
    """`sipsec load` calls from the load host through the dispatcher; its summary."""
    out = os.path.join(bed.work, f"calls-{tag}.json")
    p = bed.run("load", [SIPSEC, "load", f"udp:{ip('d')}:5060", "--local", ip("load"),
                         "--users", users, "--domain", DOMAIN, "--proxychain", "--proxychain-realm",
                         DOMAIN, "--calls", str(count), "--rate", str(rate), "--drain-s", "8",
                         "--quiet", "--json", out], log=f"calls-{tag}.err")
    return p, out


def summary(p, out):
    p.wait()
    return json.load(open(out))


def held(bed, host):
    """How many of the testbed's users `host` holds a binding for (`sipsec ctl bindings`)."""
    r = subprocess.run([SIPSEC, "ctl", "bindings", "--socket", os.path.join(bed.work, f"{host}.sock")],
                       capture_output=True, text=True)
    return sum(1 for l in r.stdout.splitlines() if f"@{DOMAIN} " in l)


def main():
    global SIPSEC
    # A signal (a timeout, ^C) still tears the testbed down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = parser(__doc__, users=200, calls=300, rate=50, round=1, nodes=3)
    ap.add_argument("--json", help="append one JSON line per scenario to this file (the lab's "
                    "cluster.jsonl), with --round and --commit")
    ap.add_argument("--commit", default="", help="the commit of the binary, for --json")
    args = ap.parse_args()
    SIPSEC = os.path.abspath(args.sipsec)
    if not 2 <= args.nodes <= 9:
        sys.exit("--nodes: 2 to 9 (node n2 is the one killed)")
    HOSTS.update({f"n{i}": 10 + i for i in range(1, args.nodes + 1)})
    if os.geteuid() != 0 or not shutil.which("ip") or not PG_BIN:
        sys.exit("needs root, ip and PostgreSQL's server binaries (apt-get install postgresql)")
    work = tempfile.mkdtemp(prefix="cluster-testbed-")
    os.chmod(work, 0o755)
    bed = Testbed(f"sc{os.getpid() % 10000}", work)
    results = []
    try:
        bed.build()
        pg = Postgres(bed)
        pg.start()
        nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
        left = [n for n in nodes if n != "n2"]
        users = os.path.join(work, "users.csv")
        write_users(users, args.users, {})
        # One CA; the authority's certificate names its address; each node its own identity.
        certs = os.path.join(work, "certs")
        sh(SIPSEC, "certs", "--out", certs, "--name", ip("authd"))
        for n in nodes:
            mine = os.path.join(work, f"certs-{n}")
            os.makedirs(mine)
            for f in ("ca.pem", "ca-key.pem"):
                shutil.copy(os.path.join(certs, f), mine)
            sh(SIPSEC, "certs", "--out", mine, "--client-name", n)
        with open(os.path.join(work, "users.toml"), "w") as f:
            f.write(f'[database]\nurl = "{pg.url}"\n')
        credentials = os.path.join(work, "credentials.csv")
        with open(credentials, "w") as f:
            f.writelines(f"u{u},x\n" for u in range(args.users))
        users_cmd(bed, ["import", credentials])
        with open(os.path.join(work, "authd.toml"), "w") as f:
            f.write(f'[authd]\nlisten = "{ip("authd")}:5070"\nrealm = "{DOMAIN}"\n'
                    f'database = "{pg.url}"\ncert = "{certs}/server.pem"\n'
                    f'key = "{certs}/server-key.pem"\nca = "{certs}/ca.pem"\nchain_length = 4\n')
        authd = bed.run("authd", [SIPSEC, "authd", "--config", os.path.join(work, "authd.toml")],
                        log="authd.log", stdout=subprocess.PIPE, text=True,
                        env={**os.environ, "SIPSEC_LOG": "info"})
        if not authd.stdout.readline().startswith("sipsec authd listening"):
            sys.exit("authd did not start: " + open(os.path.join(work, "authd.log")).read())
        for n in nodes:
            mine = os.path.join(work, f"certs-{n}")
            serve(bed, n, f'[server]\nlisten = ["udp:{ip(n)}:5060"]\ndomains = ["{DOMAIN}"]\nworkers = 1\n'
                          f'[database]\nurl = "{pg.url}"\n[registrar]\ndurable = true\n'
                          f'[control]\nsocket = "{n}.sock"\n'
                          f'[tls]\ncert = "{mine}/client.pem"\nkey = "{mine}/client-key.pem"\n'
                          f'ca = "{mine}/ca.pem"\n'
                          f'[auth]\nscheme = "proxychain"\nauthority = "tls:{ip("authd")}:5070"\n'
                          f'methods = ["INVITE", "BYE"]\nchain_length = 4\n'
                          f'[cluster]\nnode = "{n}"\nheartbeat_ms = 500\ndead_after_ms = 1500\n')
        routes = ", ".join(f'{{ uri = "sip:{ip(n)}:5060" }}' for n in nodes)
        serve(bed, "d", f'[server]\nlisten = ["udp:{ip("d")}:5060"]\ndomains = ["{DOMAIN}"]\nworkers = 1\n'
                        f'mode = "dispatcher"\n[routing]\ndefault_routes = [{routes}]\n'
                        f'probe_interval_s = 1\nfailover_timeout_ms = 1000\n')
        bed.run("load", [SIPSEC, "load", "--role", "uas", "--uas", f"udp:{ip('load')}:5070",
                         "--register", f"udp:{ip('d')}:5060", "--users", users, "--domain", DOMAIN,
                         "--duration", "100000", "--quiet"], log="callee.err")
        time.sleep(3)

        s = summary(*calls(bed, users, args.calls, args.rate, "1"))
        results.append({"scenario": "calls", "attempted": s["attempted"], "succeeded": s["succeeded"],
                        "held": {n: held(bed, n) for n in nodes}})
        print(json.dumps(results[-1]), flush=True)

        changed = {f"u{u}": f"new{u}" for u in range(20)}
        for user, password in changed.items():
            users_cmd(bed, ["add", user, "--password", password])
        write_users(users, args.users, changed)
        time.sleep(2.5)  # the authority polls its users every second
        pushed = {l.split("proxy=")[1].split()[0] for l in open(os.path.join(work, "authd.log"))
                  if "revocation pushed" in l and "proxy=" in l}
        s = summary(*calls(bed, users, args.calls, args.rate, "revoked"))
        results.append({"scenario": "revocation", "pushed_to": sorted(pushed),
                        "after": [s["succeeded"], s["attempted"]]})
        print(json.dumps(results[-1]), flush=True)

        during = calls(bed, users, args.rate * 4, args.rate, "kill-during")
        time.sleep(1)
        victim = next(p for p in bed.procs if p.args[-1].endswith("/n2.toml"))
        os.kill(victim.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        s_during = summary(*during)
        time.sleep(max(0, 3 - (time.monotonic() - killed_at)))
        s = summary(*calls(bed, users, args.calls, args.rate, "kill-after"))
        results.append({"scenario": "node-killed", "during": [s_during["succeeded"], s_during["attempted"]],
                        "after": [s["succeeded"], s["attempted"]],
                        "held": {n: held(bed, n) for n in left}, "registered": args.users})
        print(json.dumps(results[-1]), flush=True)

        during = calls(bed, users, args.rate * 6, args.rate, "pg-during")
        time.sleep(1)
        pg.stop()
        time.sleep(2)
        pg.start()
        s_during = summary(*during)
        time.sleep(2)
        s = summary(*calls(bed, users, args.calls, args.rate, "pg-after"))
        logs = {n: open(os.path.join(work, f"{n}.log")).read() for n in left}
        results.append({"scenario": "postgres-restarted", "during": [s_during["succeeded"], s_during["attempted"]],
                        "after": [s["succeeded"], s["attempted"]],
                        "resynchronised": {n: "resynchronised" in l for n, l in logs.items()},
                        "held": {n: held(bed, n) for n in left}})
        print(json.dumps(results[-1]), flush=True)
    finally:
        bed.teardown()
    ok = (len(results) == 4
          and results[0]["succeeded"] == results[0]["attempted"]
          and len(results[1]["pushed_to"]) >= 2
          and results[1]["after"][0] == results[1]["after"][1]
          and results[2]["after"][0] >= 0.99 * results[2]["after"][1]
          and all(v == args.users for v in results[2]["held"].values())
          and results[3]["after"][0] >= 0.99 * results[3]["after"][1]
          and all(results[3]["resynchronised"].values()))
    if args.json and len(results) == 4:
        r = results
        lines = [
            ("calls", None, r[0]["succeeded"], r[0]["attempted"],
             "registrations held by each node: " + ", ".join(str(v) for v in r[0]["held"].values())),
            ("revocation", None, *r[1]["after"],
             "new passwords pushed to " + ", ".join(r[1]["pushed_to"])),
            ("node-killed", r[2]["during"], *r[2]["after"],
             f"acknowledged registrations held: {min(r[2]['held'].values())} of {args.users}"),
            ("postgres-restarted", r[3]["during"], *r[3]["after"],
             "listeners resynchronised: " + ", ".join(n for n, v in r[3]["resynchronised"].items() if v)),
        ]
        with open(args.json, "a") as f:
            for order, (name, during, ok_, all_, checks) in enumerate(lines, 1):
                f.write(json.dumps({"round": args.round, "order": order, "scenario": name,
                                    "during": during or [0, 0], "after": [ok_, all_],
                                    "checks": checks, "commit": args.commit,
                                    "date": time.strftime("%Y-%m-%d", time.gmtime())}) + "\n")
    print("testbed:", "every check held" if ok else f"a check failed; logs in {work}")
    if ok:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
