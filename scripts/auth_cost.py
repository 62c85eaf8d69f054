#!/usr/bin/env python3
"""What digest authentication costs with a million users in the database: server CPU per call
for the stateful UDP proxy with INVITE authentication, and per registration with REGISTER
authentication, each as a ratio to the same scenario without authentication, measured side by
side in rounds; beside Kamailio 5.6 with auth_db on SQLite holding the same million users.

    cargo build --release
    python3 scripts/auth_cost.py [--users 1000000] [--rate 500] [--calls 4000] [--rounds 3] [--kamailio]

Rows: "challenged" is SIPp's way — every INVITE is answered 407 and sent again with
credentials (three more messages through the proxy); "nonce reused" is a phone's way — the
credentials of the last challenge with the next nonce count go with the first INVITE. The
load's callers are 1,000 users spread over the million, so with nonce reuse three calls in four
go without a challenge. The script also reports the time
`sipsec users import` takes for the million and the server's resident memory with them
loaded. Kamailio needs Debian's kamailio and kamailio-sqlite-modules.
"""
import hashlib, json, os, shutil, sqlite3, statistics, subprocess, sys, tempfile, time

from kit import KAMAILIO as KIT, parser
REALM = "bench.test"


def bench(binary, args, rate, calls):
    out = tempfile.mktemp(suffix=".json")
    cmd = [binary, "bench", "--rate", str(rate), "--calls", str(calls), "-q", "--json", out] + args
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        for f in ("kamailio.log",):
            path = os.path.join(os.path.dirname(args[-1]), f)
            if os.path.exists(path):
                print(open(path).read()[-1500:], file=sys.stderr)
        sys.exit(f"bench {args} failed: {p.stderr}")
    r = json.load(open(out))
    os.unlink(out)
    if r["ops"] < 0.99 * calls:
        print(f"  warning: {args}: only {r['ops']}/{calls} succeeded", file=sys.stderr)
    return r["server_cpu_us_per_op"]


def config(work, auth):
    return (f'[server]\nlisten = ["udp:127.0.0.1:35060"]\ndomains = ["{REALM}"]\nworkers = 1\n'
            f'[routing]\ndefault_route = "sip:127.0.0.3:35080;transport=udp"\n'
            f'[database]\nurl = "sqlite://{work}/users.db"\n'
            f'[auth]\nscheme = "{"digest" if auth else "none"}"\nrealm = "{REALM}"\n'
            f'methods = ["INVITE", "REGISTER"]\n')


def resident_kib(binary, cfg):
    """VmRSS of a server started on `cfg` once its users are loaded."""
    p = subprocess.Popen([binary, "serve", "--config", cfg], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    p.stdout.readline()  # the banner: up, users loaded
    time.sleep(1)
    rss = next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmRSS"))
    p.terminate()
    p.wait()
    return rss


def kamailio_db(path, n):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE version (table_name TEXT PRIMARY KEY, table_version INTEGER)")
    db.execute("INSERT INTO version VALUES ('subscriber', 7)")
    db.execute("CREATE TABLE subscriber (id INTEGER PRIMARY KEY, username TEXT, domain TEXT, "
               "password TEXT, ha1 TEXT, ha1b TEXT)")
    db.execute("CREATE UNIQUE INDEX account_idx ON subscriber (username, domain)")
    db.execute("CREATE INDEX username_idx ON subscriber (username)")
    rows = ((f"user{i}", REALM, "", hashlib.md5(f"user{i}:{REALM}:pw{i}".encode()).hexdigest(), "")
            for i in range(n))
    db.executemany("INSERT INTO subscriber (username, domain, password, ha1, ha1b) "
                   "VALUES (?, ?, ?, ?, ?)", rows)
    db.commit()
    db.close()


def kamailio(work, auth, db, registrar=False):
    cfg = os.path.join(work, "kamailio.cfg")
    source = (os.path.join(KIT, "registrar.cfg") if registrar
              else os.path.join(KIT, "proxy.cfg"))
    shutil.copy(source, cfg)
    cmd = ["taskset", "-c", "0", "kamailio", "-DD", "-E", "-f", cfg, "-m", "512", "-M", "32",
           "-Y", work, "-w", work, "-A", 'NEXT_HOP="sip:127.0.0.3:35080"']
    if auth:
        cmd += ["-A", "WITH_AUTH", "-A", f'DB_URL="sqlite:///{db}"']  # Kamailio wants sqlite:////abs
    log = open(os.path.join(work, "kamailio.log"), "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=log)
    time.sleep(2)
    return p


def main():
    ap = parser(__doc__, users=1_000_000, rate=500, calls=4000, rounds=3)
    ap.add_argument("--kamailio", action="store_true")
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "users.csv"), "w") as f:
        f.write("username,password\n")
        f.writelines(f"user{i},pw{i}\n" for i in range(a.users))
    step = max(1, a.users // 1_000)
    with open(os.path.join(work, "callers.csv"), "w") as f:
        f.writelines(f"user{i},pw{i}\n" for i in range(0, a.users, step))
    cfgs = {}
    for auth in (False, True):
        cfgs[auth] = os.path.join(work, f"{'auth' if auth else 'none'}.toml")
        open(cfgs[auth], "w").write(config(work, auth))
    started = time.time()
    subprocess.run([binary, "users", "--config", cfgs[True], "import",
                    os.path.join(work, "users.csv")], check=True, stdout=subprocess.DEVNULL)
    import_s = time.time() - started
    rss = {auth: resident_kib(binary, cfgs[auth]) for auth in (False, True)}

    callers = ["--users", os.path.join(work, "callers.csv")]
    # Calls go to a domain that is not the server's, so they take the default route to the
    # UAS: the register rows leave bindings for these users that calls must not follow.
    elsewhere = ["--domain", "elsewhere.test"]
    rows = [
        ("call, no auth", ["--config", cfgs[False]] + elsewhere + callers),
        ("call, digest, challenged", ["--config", cfgs[True]] + elsewhere + callers),
        ("call, digest, nonce reused",
         ["--config", cfgs[True], "--auth-reuse"] + elsewhere + callers),
        ("register, no auth", ["--config", cfgs[False], "--scenario", "register"] + callers),
        ("register, digest, challenged", ["--config", cfgs[True], "--scenario", "register"] + callers),
        ("register, digest, nonce reused",
         ["--config", cfgs[True], "--scenario", "register", "--auth-reuse"] + callers),
    ]
    kam = []
    if a.kamailio:
        kdb = os.path.join(work, "kamailio.db")
        kamailio_db(kdb, a.users)
        kam = [("kamailio call, no auth", False, False), ("kamailio call, auth_db", True, False),
               ("kamailio register, no auth", False, True),
               ("kamailio register, auth_db", True, True)]
    res = {name: [] for name, _ in rows}
    res.update({name: [] for name, _, _ in kam})
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        for name, auth, registrar in kam:
            k = kamailio(work, auth, kdb, registrar)
            scenario = ["--scenario", "register"] if registrar else []
            try:
                res[name].append(bench(binary, ["--server-pid", str(k.pid), "--target",
                                                "127.0.0.1:5060", "--domain", REALM] + scenario
                                       + callers, a.rate, a.calls))
            finally:
                k.terminate()
                k.wait()
                time.sleep(1)
        for name, args in rows:
            res[name].append(bench(binary, args, a.rate, a.calls))
    med = {name: statistics.median(v) for name, v in res.items()}
    print(f"{a.users:,} users: `sipsec users import` took {import_s:.1f} s; server resident "
          f"memory {rss[False] / 1024:.0f} MiB without auth, {rss[True] / 1024:.0f} MiB with "
          f"the users loaded ({(rss[True] - rss[False]) * 1024 / a.users:.0f} B per user)")
    print(f"server CPU per operation, µs (median of {a.rounds} rounds; the rounds), "
          f"{a.rate}/s, {a.calls} operations")
    print("| configuration | µs/op | rounds | ÷ same without auth |")
    print("|---|---:|---|---:|")
    for name, vals in res.items():
        kind = "call" if "call" in name else "register"
        base = f"kamailio {kind}, no auth" if name.startswith("kamailio") else f"{kind}, no auth"
        rounds = ", ".join(f"{v:.0f}" for v in vals)
        print(f"| {name} | {med[name]:.1f} | {rounds} | {med[name] / med[base]:.2f} |")
    if kam:
        for kind in ("call", "register"):
            print(f"sipsec ÷ Kamailio, {kind} with digest (challenged): "
                  f"{med[f'{kind}, digest, challenged'] / med[f'kamailio {kind}, auth_db']:.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
