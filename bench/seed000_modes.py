#!/usr/bin/env python3
"""Seed 000's matrix: server CPU per call in each connection mode (chain, outbound, inbound,
local) over TCP and TLS (plain, mutual, no resumption, and the seed's own 2008 suite through
the OpenSSL backend), as a ratio to UDP measured in the same run, with Kamailio 5.6 beside
sipsec where Kamailio can take the mode, and the issue's bars evaluated.

Every figure is `sipsec bench` (server pinned to CPU 0, load to CPU 1, user+sys CPU from
/proc over the successful calls). Rounds alternate the rows so drift hits all of them alike;
the tables show medians.

    cargo build --release --features openssl --examples
    python3 bench/seed000_modes.py [--rate 500] [--calls 4000] [--rounds 5] [--kamailio]
    python3 bench/seed000_modes.py --idle 19950     # UDP and TCP chain with idle TCP conns
    python3 bench/seed000_modes.py --only 'tcp$|tls$|no resumption'   # rows matching (and UDP)
    python3 bench/seed000_modes.py --kamailio --only '^(kamailio )?chain (tcp|tls)$' --rate 1000
        # the persistent paths beside Kamailio's, and each server's stream overhead above UDP

The per-call bar compares the TLS cost per call above TCP in the same mode with the crypto
floor of the handshakes the proxy performs per call, from `target/release/examples/tls_floor`
(run here): outbound accepts one connection per call, inbound opens one, local does both.
The seed-suite rows need a sipsec built with `--features openssl`; without it they are
reported unavailable, as the seed's 3DES suite always is (OpenSSL 3.0 cannot negotiate it).

Kamailio opens one connection per destination and reuses it, so it runs the modes whose
outbound side is persistent (chain, outbound); it needs Debian's kamailio and
kamailio-tls-modules. Kamailio's TLS client does not verify the UAS here. Kamailio's UDP row
gives its stream overhead (chain minus UDP) to set beside sipsec's.
"""
import argparse, json, os, re, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "../../shared/bench/kamailio")
SEED_SUITE = "TLS_RSA_WITH_AES_128_CBC_SHA"
SEED_3DES = "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
MODES = ["chain", "outbound", "inbound", "local"]


class Unavailable(Exception):
    pass


def bench(binary, args, rate, calls):
    out = tempfile.mktemp(suffix=".json")
    cmd = [binary, "bench", "--rate", str(rate), "--calls", str(calls), "-q", "--json", out] + args
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0 or not os.path.exists(out):
        lines = p.stderr.strip().splitlines() or ["failed"]
        raise Unavailable(next((l for l in lines if "cipher" in l), lines[-1]))
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
    define = {"udp": [], "tcp": ["-A", "WITH_TCP"], "tls": ["-A", "WITH_TLS"]}[transport]
    cmd = ["taskset", "-c", "0", "kamailio", "-DD", "-E", "-f", path, "-m", "512", "-M", "32",
           "-Y", work, "-w", work] + define + ["-A", f'TLS_CFG="{tls_cfg}"',
           "-A", f'UAS_URI="sip:127.0.0.3:35080;transport={transport}"']
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    return p


def floors(binary_dir):
    """Server and client µs per handshake from tls_floor: {(certs, label): (server, client)}."""
    exe = os.path.join(binary_dir, "examples", "tls_floor")
    if not os.path.exists(exe):
        return {}
    text = subprocess.run([exe, "500"], capture_output=True, text=True, check=True).stdout
    found, certs = {}, None
    for line in text.splitlines():
        if line.endswith("(µs):"):
            certs = line.split()[0]
            continue
        m = re.match(r"\s+(.+?)\s{2,}(\S+)\s+([\d.]+)\s+([\d.]+)\s+\(", line)
        if m and m.group(2) in ("secp256r1", "RSA"):
            found[(certs, m.group(1))] = (float(m.group(3)), float(m.group(4)))
    return found


def floor_per_call(fl, mode, variant):
    """The crypto floor of the handshakes the proxy performs per call in a per-call mode."""
    if variant == "2008 suite":
        key = ("Rsa2048", "seed 000 suite, resumed")
    elif variant == "no resumption":
        key = ("EcdsaP256", "TLS 1.3 full")
    else:  # resumed after the first, with or without client certificates
        key = ("EcdsaP256", "TLS 1.3 resumed (ticket, PSK-DHE)")
    if key not in fl:
        return None
    server, client = fl[key]
    return {"outbound": server, "inbound": client, "local": server + client}[mode]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", default="target/release/sipsec")
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kamailio", action="store_true")
    ap.add_argument("--idle", type=int, default=0,
                    help="measure UDP and TCP chain with this many idle TCP connections instead")
    ap.add_argument("--only", help="regular expression: run only the rows it finds (and UDP)")
    a = ap.parse_args()
    binary = os.path.abspath(a.sipsec)
    work = tempfile.mkdtemp()
    certs, rsa = os.path.join(work, "certs"), os.path.join(work, "rsa")
    for d, key in [(certs, "ecdsa-p256"), (rsa, "rsa-2048")]:
        subprocess.run([binary, "certs", "--out", d, "--key", key, "--name", "localhost",
                        "--name", "127.0.0.1", "--name", "127.0.0.2", "--name", "127.0.0.3"],
                       check=True, stdout=subprocess.DEVNULL)
    tls = ["--transport", "tls", "--tls-dir", certs]
    seed = ["--transport", "tls", "--tls-dir", rsa, "--tls-backend", "openssl",
            "--tls-version", "1.2", "--tls-cipher-suite"]
    rows = []
    if a.idle:
        idle = ["--idle-connections", str(a.idle)]
        rows += [("udp", []), (f"udp, {a.idle} idle", idle),
                 ("chain tcp", ["--transport", "tcp"]),
                 (f"chain tcp, {a.idle} idle", ["--transport", "tcp"] + idle)]
    else:
        rows.append(("udp", []))
        for mode in MODES:
            m = ["--mode", mode]
            rows.append((f"{mode} tcp", ["--transport", "tcp"] + m))
            rows.append((f"{mode} tls", tls + m))
            if mode != "chain":
                rows.append((f"{mode} tls mutual", tls + m + ["--mutual"]))
                rows.append((f"{mode} tls no resumption", tls + m + ["--tls-resumption", "off"]))
            rows.append((f"{mode} tls 2008 suite", seed + [SEED_SUITE] + m))
    if a.only:
        rows = [(n, r) for n, r in rows if n == "udp" or re.search(a.only, n)]
    unavailable = {}
    if not a.idle and (not a.only or re.search(a.only, "chain tls 2008 suite")):
        try:
            bench(binary, seed + [SEED_3DES, "--mode", "chain"], a.rate, 100)
        except Unavailable as e:
            unavailable[f"chain tls 3DES suite ({SEED_3DES})"] = str(e)
    kam_rows = []
    if a.kamailio and not a.idle:
        kam_rows = [("kamailio udp", "chain", "udp")]
        kam_rows += [(f"kamailio {mode} {t}", mode, t) for mode in ["chain", "outbound"]
                     for t in ["tcp", "tls"]]
        if a.only:
            kam_rows = [r for r in kam_rows if r[0] == "kamailio udp" or re.search(a.only, r[0])]
    res = {name: [] for name, _ in rows}
    res.update({name: [] for name, _, _ in kam_rows})
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        for name, args in rows:
            if name in unavailable:
                continue
            try:
                res[name].append(bench(binary, args, a.rate, a.calls))
            except Unavailable as e:
                unavailable[name] = str(e)
                del res[name]
        for name, mode, t in kam_rows:
            k = kamailio(work, t, certs)
            try:
                target = {"udp": "127.0.0.1:5060", "tcp": "tcp:127.0.0.1:5060",
                          "tls": "tls:127.0.0.1:5061"}[t]
                args = ["--server-pid", str(k.pid), "--target", target, "--transport", t,
                        "--mode", mode, "--tls-dir", certs]
                res[name].append(bench(binary, args, a.rate, a.calls))
            finally:
                k.terminate()
                k.wait()
                time.sleep(1)
    med = {name: statistics.median(v) for name, v in res.items() if v}
    base = med["udp"]
    print(f"server CPU per call, µs (median of {a.rounds} rounds; the rounds); ratio to UDP; "
          f"{a.rate} calls/s, {a.calls} calls")
    print("| configuration | µs/call | rounds | ÷ UDP |")
    print("|---|---:|---|---:|")
    for name, vals in res.items():
        rounds = ", ".join(f"{v:.0f}" for v in vals)
        print(f"| {name} | {med[name]:.1f} | {rounds} | {med[name] / base:.2f} |")
    for name, why in unavailable.items():
        print(f"| {name} | unavailable: {why} | | |")
    if a.idle:
        print(f"\nidle bar (< 10%): UDP {med[f'udp, {a.idle} idle'] / med['udp']:.2f}x, "
              f"TCP chain {med[f'chain tcp, {a.idle} idle'] / med['chain tcp']:.2f}x")
        shutil.rmtree(work, ignore_errors=True)
        return
    if "chain tls" in med:
        print(f"\nchain bar (TLS <= 1.25x UDP): {med['chain tls'] / base:.2f}x")
    fl = floors(os.path.dirname(binary))
    print("\nper-call bar: TLS cost per call above TCP in the same mode <= 1.5x the crypto floor")
    print("| mode, variant | TLS - TCP µs | floor µs | ÷ floor |")
    print("|---|---:|---:|---:|")
    for mode in ["outbound", "inbound", "local"]:
        for variant in ["tls", "tls mutual", "tls no resumption", "tls 2008 suite"]:
            name = f"{mode} {variant}"
            if name not in med or f"{mode} tcp" not in med:
                continue
            extra = med[name] - med[f"{mode} tcp"]
            floor = floor_per_call(fl, mode, variant[4:] or "tls")
            ratio = f"{extra / floor:.2f}" if floor else "no floor"
            print(f"| {name} | {extra:.1f} | {floor or 0:.1f} | {ratio} |")
    if kam_rows:
        print("\nbeside Kamailio (sipsec ÷ Kamailio, same mode; bar for TLS: <= 0.5)")
        for mode in ["chain", "outbound"]:
            for t in ["tcp", "tls"]:
                k = f"kamailio {mode} {t}"
                if k in med and f"{mode} {t}" in med:
                    print(f"  {mode} {t}: {med[f'{mode} {t}'] / med[k]:.2f}")
        if "kamailio udp" in med:
            print("\nstream overhead, chain minus UDP, µs per call (sipsec's ÷ Kamailio's; "
                  "bar for TLS: <= 0.5)")
            for t in ["tcp", "tls"]:
                if f"chain {t}" in med and f"kamailio chain {t}" in med:
                    ours = med[f"chain {t}"] - base
                    theirs = med[f"kamailio chain {t}"] - med["kamailio udp"]
                    ratio = f"{ours / theirs:.2f}" if theirs > 0 else "n/a (Kamailio's is not positive)"
                    print(f"  {t}: sipsec {ours:.1f}, Kamailio {theirs:.1f}: {ratio}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
