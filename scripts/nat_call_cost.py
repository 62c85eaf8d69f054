#!/usr/bin/env python3
"""What a call to a phone behind a NAT costs the server beside a call to a directly reachable
one: server CPU per stateful call at the same rate and offered load, rows alternated round by
round, the ratio per round with a Student t 95% interval over the rounds.

Rows (one `sipsec load --role both` process: its callee and its callers; a fresh server per
run, `--workers` of them (2 by default), record-routing, no authentication):

- `udp direct`: the callee registers its socket's address (`--register`): reachable as
  written.
- `udp nat`: the callee registers a private Contact (`--contact-addr 10.0.0.9:5060`), as a
  phone behind a NAT does: the server (`[nat] mode = "auto"`, the default) reaches it where
  its REGISTER came from, and its dialogs carry its flow token in our Record-Route (in-dialog
  requests routed by it). The callers are reachable, as a trunk or a phone on the open
  network is.
- `tls direct`: the callee listens for TLS (`--uas`) and the server reaches it by its
  default route over a persistent connection it opened: a directly reachable TLS phone.
- `tls nat`: the callee registers over TLS connections and listens nowhere (its Contact is
  `*.invalid`): every call goes over the phone's registering connection (default
  `mode = "auto"`), with flow tokens in the Record-Route.

Every row has as many phones as `--users` (1 by default): one registered flow, or one
connection the server opened to the listening callee, so the rows compare one phone reached
over its own flow with one reached at its address, not 50 connections with one.

CPU is the on-CPU time (schedstat) of the server's threads over the run, divided by the calls
that succeeded; a row with under 99% success is flagged.

With more than one worker, a NATed TLS phone's calls cross between workers when the worker
that accepted its connection is not the one that accepted the callers' (the kernel spreads
connections over the workers' listeners): each message then passes through a mailbox, whose
wake-up costs more than the message. The directly reachable TLS phone is reached by a
connection each worker opens, so its calls never cross. UDP calls cross too, NATed or not: a
caller's and a callee's datagrams reach the workers the kernel's hash of their addresses
picks. Each round says how many answers a call was handed between workers (the server's
`handoffs`), and the ratio is given apart for the rounds in which neither row's calls crossed:
those where the rows differ by the NAT machinery alone.

    cargo build --release --bin sipsec
    python3 scripts/nat_call_cost.py [--rate 2000] [--duration 10] [--rounds 5] [--users 1]
                                     [--workers 2]
"""
import json, os, re, socket, statistics, subprocess, tempfile, time

from kit import cpu_ns, parser, t_interval

def wait_port(port, proto):
    for _ in range(100):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", port))
            s.close()
            return
        except OSError:
            time.sleep(0.05)
        finally:
            s.close()


def run(a, tmp, row, port):
    transport = row.split()[0]
    callee = port + 10
    route = (f"[routing]\ndefault_route = \"sip:127.0.0.1:{callee};transport=tls\"\n"
             if row == "tls direct" else "")
    cfg = os.path.join(tmp, "s.toml")
    with open(cfg, "w") as f:
        f.write(f"""[server]
listen = ["udp:127.0.0.1:{port}", "tcp:127.0.0.1:{port}", "tls:127.0.0.1:{port + 1}"]
domains = ["nat.test"]
workers = {a.workers}
record_route = true
[tls]
cert = "{tmp}/c/server.pem"
key = "{tmp}/c/server-key.pem"
ca = "{tmp}/c/ca.pem"
[database]
url = "sqlite::memory:"
[flood]
rate = 0
{route}""")
    log = os.path.join(tmp, "server.log")
    server = subprocess.Popen([a.sipsec, "serve", "--config", cfg], stdout=subprocess.DEVNULL,
                              stderr=open(log, "w"))
    result = None
    try:
        wait_port(port, "tcp")
        target = (f"udp:127.0.0.1:{port}" if transport == "udp"
                  else f"tls:127.0.0.1:{port + 1}")
        out = os.path.join(tmp, "load.json")
        cmd = [a.sipsec, "load", target, "--role", "both", "--users",
               os.path.join(tmp, "users.csv"), "--domain",
               # The directly reachable callee is not a user here: its calls take the
               # default route (a domain of ours would look the user up, and find none).
               "route.test" if row == "tls direct" else "nat.test", "--rate", str(a.rate),
               "--duration", str(a.duration), "--quiet", "--json", out]
        if transport == "tls":
            cmd += ["--tls-ca", f"{tmp}/c/ca.pem", "--tls-cert", f"{tmp}/c/server.pem",
                    "--tls-key", f"{tmp}/c/server-key.pem"]
        if row == "tls direct":
            cmd += ["--uas", f"tls:127.0.0.1:{callee}"]
        else:
            cmd += ["--register"]
        if row == "udp nat":
            cmd += ["--contact-addr", "10.0.0.9:5060"]
        # Registrations (and the callee's listener) settle before the calls are counted;
        # the server's CPU is read around the whole run, so it includes them: a few
        # hundred messages against 2,000 calls a second.
        c0 = cpu_ns(server.pid)
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        c1 = cpu_ns(server.pid)
        if p.returncode != 0:
            print(f"  {row}: load failed: {p.stderr.strip()[-300:]}")
            return None
        r = json.load(open(out))
        ok = r["succeeded"]
        share = ok / max(r["attempted"], 1)
        result = ((c1 - c0) / 1e3 / max(ok, 1), share, max(ok, 1))
    finally:
        server.terminate()
        server.wait()
    # Answers the worker that read them passed to the one holding their transaction: a call
    # whose caller and callee connections two workers own crosses between them.
    stopped = open(log).read()
    handoffs = int(m.group(1)) if (m := re.search(r"handoffs=(\d+)", stopped)) else 0
    return result and (result[0], result[1], handoffs / result[2])


def main():
    ap = parser(__doc__, rate=2000, duration=10, rounds=5, port=47060, users=1, workers=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sipsec-natcall-")
    subprocess.run([a.sipsec, "certs", "--out", f"{tmp}/c"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(tmp, "users.csv"), "w") as f:
        f.writelines(f"u{i},pw{i}\n" for i in range(a.users))
    rows = ["udp direct", "udp nat", "tls direct", "tls nat"]
    cost = {r: [] for r in rows}
    crossed = {r: [] for r in rows}
    for k in range(a.rounds):
        order = rows if k % 2 == 0 else rows[::-1]
        for i, row in enumerate(order):
            got = run(a, tmp, row, a.port + 20 * i)
            if got is None:
                continue
            us, share, crossings = got
            cost[row].append(us)
            crossed[row].append(crossings >= 0.5)
            flag = "" if share >= 0.99 else f"  (only {share * 100:.1f}% succeeded)"
            print(f"round {k + 1} {row:10}: {us:6.1f} us of server CPU per call; "
                  f"{crossings:.2f} answers a call handed between workers{flag}", flush=True)
    print()
    for t in ("udp", "tls"):
        d, n = cost[f"{t} direct"], cost[f"{t} nat"]
        ratios = [x / y for x, y in zip(n, d)]
        print(f"{t}: direct {statistics.median(d):.1f} us, nat {statistics.median(n):.1f} us per "
              f"call (medians); nat/direct {interval(ratios)} at {a.rate} calls/s")
        # Where the rows differ only by the NAT machinery: rounds in which neither row's
        # calls crossed between workers (with one worker, every round).
        cn, cd = crossed[f"{t} nat"], crossed[f"{t} direct"]
        kept = [x for x, a_, b_ in zip(ratios, cn, cd) if not a_ and not b_]
        if len(kept) < len(ratios):
            print(f"{t}: rounds in which neither row's calls crossed between workers: "
                  f"nat/direct {interval(kept)}")
            for row in (f"{t} direct", f"{t} nat"):
                stay = [x for x, c in zip(cost[row], crossed[row]) if not c]
                cross = [x for x, c in zip(cost[row], crossed[row]) if c]
                if stay and cross:
                    print(f"  {row}: {statistics.mean(cross):.1f} us per call in the "
                          f"{len(cross)} rounds whose calls crossed, "
                          f"{statistics.mean(stay):.1f} us in the {len(stay)} that did not")


def interval(ratios):
    """The mean of `ratios` with its Student t 95% interval, or why there is none."""
    if len(ratios) < 2:
        return f"too few rounds (n={len(ratios)})"
    m, half = t_interval(ratios)
    return f"{m:.3f} (95% t-interval {m - half:.3f}..{m + half:.3f}, n={len(ratios)} rounds)"


if __name__ == "__main__":
    main()
