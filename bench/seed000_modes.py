#!/usr/bin/env python3
"""Seed 000's matrix: server CPU per call in each connection mode (chain, outbound, inbound,
local) over TCP and TLS (plain, mutual, no resumption), as a ratio to UDP measured in the same
run, with Kamailio 5.6 beside sipsec where Kamailio can take the mode.

Every figure is `sipsec bench` (server pinned to CPU 0, load to CPU 1, user+sys CPU from
/proc over the successful calls). Rounds alternate the rows so drift hits all of them alike;
the table shows medians.

    python3 bench/seed000_modes.py [--rate 500] [--calls 5000] [--rounds 3] [--kamailio]
    python3 bench/seed000_modes.py --idle 20000     # UDP and TCP chain with 20k idle TCP conns

Kamailio opens one connection per destination and reuses it, so it runs the modes whose
outbound side is persistent (chain, outbound); it needs Debian's kamailio and
kamailio-tls-modules. Kamailio's TLS client does not verify the UAS here.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "../../shared/bench/kamailio")


def bench(binary, args, rate, calls):
    out = tempfile.mktemp(suffix=".json")
    cmd = [binary, "bench", "--rate", str(rate), "--calls", str(calls), "-q", "--json", out] + args
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = json.load(open(out))
    os.unlink(out)
    if r["ops"] < 0.99 * calls:
        print(f"  warning: {args}: only {r['ops']}/{calls} calls succeeded", file=sys.stderr)
    return r["server_cpu_us_per_op"]


def kamailio(work, transport, certs):
    cfg = open(os.path.join(SHARED, "proxy.cfg")).read()
    path = os.path.join(work, "kamailio.cfg")
    open(path, "w").write(cfg)
    tls_cfg = os.path.join(work, "tls.cfg")
    open(tls_cfg, "w").write(
        f"[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\n"
        f"private_key = {certs}/server-key.pem\ncertificate = {certs}/server.pem\n"
        f"ca_list = {certs}/ca.pem\n\n[client:default]\nmethod = TLSv1.2+\n"
        f"verify_certificate = no\nrequire_certificate = no\n")
    define = {"tcp": "WITH_TCP", "tls": "WITH_TLS"}[transport]
    cmd = ["taskset", "-c", "0", "kamailio", "-DD", "-E", "-f", path, "-m", "512", "-M", "32",
           "-Y", work, "-w", work, "-A", define, "-A", f'TLS_CFG="{tls_cfg}"',
           "-A", f'UAS_URI="sip:127.0.0.3:35080;transport={transport}"']
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", default="target/release/sipsec")
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kamailio", action="store_true")
    ap.add_argument("--idle", type=int, default=0,
                    help="measure UDP and TCP chain with this many idle TCP connections instead")
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    work = tempfile.mkdtemp()
    certs = os.path.join(work, "certs")
    subprocess.run([binary, "certs", "--out", certs, "--name", "localhost", "--name", "127.0.0.1",
                    "--name", "127.0.0.2", "--name", "127.0.0.3"], check=True,
                   stdout=subprocess.DEVNULL)
    tls = ["--transport", "tls", "--tls-dir", certs]
    rows = []
    if a.idle:
        idle = ["--idle-connections", str(a.idle)]
        rows += [("udp", []), (f"udp, {a.idle} idle", idle),
                 ("tcp chain", ["--transport", "tcp"]),
                 (f"tcp chain, {a.idle} idle", ["--transport", "tcp"] + idle)]
    else:
        rows.append(("udp", []))
        for mode in ["chain", "outbound", "inbound", "local"]:
            m = ["--mode", mode]
            rows.append((f"{mode} tcp", ["--transport", "tcp"] + m))
            rows.append((f"{mode} tls", tls + m))
            if mode != "chain":
                rows.append((f"{mode} tls mutual", tls + m + ["--mutual"]))
                rows.append((f"{mode} tls no resumption", tls + m + ["--tls-resumption", "off"]))
    kam_rows = []
    if a.kamailio and not a.idle:
        kam_rows = [(f"kamailio {mode} {t}", mode, t) for mode in ["chain", "outbound"]
                    for t in ["tcp", "tls"]]
    res = {name: [] for name, _ in rows}
    res.update({name: [] for name, _, _ in kam_rows})
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        for name, args in rows:
            res[name].append(bench(binary, args, a.rate, a.calls))
        for name, mode, t in kam_rows:
            k = kamailio(work, t, certs)
            try:
                target = {"tcp": "tcp:127.0.0.1:5060", "tls": "tls:127.0.0.1:5061"}[t]
                args = ["--server-pid", str(k.pid), "--target", target, "--transport", t,
                        "--mode", mode, "--tls-dir", certs]
                res[name].append(bench(binary, args, a.rate, a.calls))
            finally:
                k.terminate()
                k.wait()
                time.sleep(1)
    base = statistics.median(res["udp"])
    print(f"server CPU per call, µs (median of {a.rounds}; rounds); ratio to UDP; "
          f"{a.rate} calls/s, {a.calls} calls")
    print("| configuration | µs/call | rounds | ÷ UDP |")
    print("|---|---:|---|---:|")
    for name, vals in res.items():
        med = statistics.median(vals)
        rounds = ", ".join(f"{v:.0f}" for v in vals)
        print(f"| {name} | {med:.1f} | {rounds} | {med / base:.2f} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
