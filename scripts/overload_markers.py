#!/usr/bin/env python3
"""Can a flood switch overload control off by what it writes? (issue 32)

A server held to a quarter of a core (cgroup v1 CPU quota; root) carries legitimate calls at
~90% of its peak while a flood of new INVITEs arrives from another address. The flood is
plain, or carries a marker that once exempted it from shedding: `Resource-Priority: wps.0`
(RFC 4412), a To tag (looking in-dialog) with no Route of ours, or `oc` in its Via (RFC 7339,
announced but never honoured). Each case runs with `[auth] scheme` none and digest (the flood
unauthenticated, the callers with nonce reuse, as phones do). Reported: the legitimate
goodput (calls completed within 500 ms, per second of the run) per case, per binary, binaries alternated
case by case in every round.

    python3 scripts/overload_markers.py --binary before=/tmp/sipsec-main --binary after=target/release/sipsec \
        [--rate 2700] [--flood 6000] [--seconds 10] [--rounds 5] [--quota 0.25] \
        [--auth none,digest] [--cases plain,resource-priority,to-tag,oc]

--rate is the legitimate call rate (~90% of the peak at the quota:
`sipsec load 127.0.0.1:PORT --find-peak` against the same server). The bar: under every
marker, goodput >= 0.9 of what the plain flood leaves main's binary. Figures and their
reading: BENCHMARKS.md, "Floods that carry a marker".
"""
import argparse
import json
import os
import socket
import subprocess
import tempfile
import threading
import time

from kit import t_interval

PORT = 35260
UAS = f"127.0.0.3:{PORT + 20}"
FLOOD_FROM = "127.0.0.5"
REALM = "example.test"
CASES = ["plain", "resource-priority", "to-tag", "oc"]


def config(work, digest):
    return (f'[server]\nlisten = ["udp:127.0.0.1:{PORT}"]\ndomains = ["{REALM}"]\nworkers = 1\n'
            f'[routing]\ndefault_route = "sip:{UAS}"\n'
            f'[database]\nurl = "sqlite://{work}/server.db"\n'
            f'[auth]\nscheme = "{"digest" if digest else "none"}"\nrealm = "{REALM}"\n')


def flood_invite(n, case):
    """One new INVITE of the flood, with its case's marker."""
    via = f"SIP/2.0/UDP {FLOOD_FROM}:5999;branch=z9hG4bKf{n}"
    ruri, to_tag, extra = "sip:bob@elsewhere.test", "", ""
    if case == "resource-priority":
        extra = "Resource-Priority: wps.0\r\n"
    elif case == "to-tag":
        # Looks in-dialog; aimed at the callee (elsewhere than us), no Route of ours.
        ruri, to_tag = f"sip:bob@{UAS}", ";tag=t1"
    elif case == "oc":
        via += ";oc"
    return (f"INVITE {ruri} SIP/2.0\r\nVia: {via}\r\nMax-Forwards: 70\r\n"
            f"From: <sip:mallory@{REALM}>;tag=m{n}\r\nTo: <sip:bob@elsewhere.test>{to_tag}\r\n"
            f"Call-ID: flood-{n}@{FLOOD_FROM}\r\nCSeq: 1 INVITE\r\n"
            f"Contact: <sip:mallory@{FLOOD_FROM}:5999>\r\n{extra}Content-Length: 0\r\n\r\n"
            ).encode()


def flood(case, rate, seconds, stop):
    """Sends `rate` INVITEs a second in 10 ms batches, never answering anything."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((FLOOD_FROM, 5999))
    s.setblocking(False)
    start, n = time.monotonic(), 0
    while not stop.is_set() and time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * rate)
        while n < due:
            try:
                s.sendto(flood_invite(n, case), ("127.0.0.1", PORT))
            except BlockingIOError:
                pass
            n += 1
        try:
            while True:
                s.recv(65536)  # drain the answers
        except BlockingIOError:
            pass
        time.sleep(0.01)
    s.close()
    return n


def run(binary, work, case, digest, a):
    """Legitimate goodput (calls/s) under one flood case."""
    cfg = os.path.join(work, f"{'digest' if digest else 'none'}.toml")
    open(cfg, "w").write(config(work, digest))
    if digest:
        subprocess.run([binary, "users", "--config", cfg, "import",
                        os.path.join(work, "users.csv")], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    env = dict(os.environ, SIPSEC_LOG="error")
    server = subprocess.Popen(["taskset", "-c", "0", binary, "serve", "--config", cfg],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    cg = f"/sys/fs/cgroup/cpu/sipsec-markers-{os.getpid()}"
    uas = None
    try:
        time.sleep(1.0)
        os.makedirs(cg, exist_ok=True)
        open(f"{cg}/cpu.cfs_period_us", "w").write("10000")
        open(f"{cg}/cpu.cfs_quota_us", "w").write(str(int(a.quota * 10000)))
        open(f"{cg}/cgroup.procs", "w").write(str(server.pid))
        uas = subprocess.Popen(["taskset", "-c", "1", binary, "load", "--role", "uas",
                                "--uas", UAS, "-q"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        stop = threading.Event()
        flooder = threading.Thread(target=flood, args=(case, a.flood, a.seconds + 1, stop))
        flooder.start()
        time.sleep(0.5)  # the flood first, as an attack would be
        out = os.path.join(work, "legit.json")
        callers = ["--users", os.path.join(work, "users.csv"), "--auth-reuse"] if digest else []
        subprocess.run(["taskset", "-c", "1", binary, "load", f"127.0.0.1:{PORT}",
                        "--domain", "elsewhere.test",
                        "--rate", str(a.digest_rate if digest else a.rate),
                        "--duration", str(a.seconds), "--drain-s", "5", "-q",
                        "--json", out] + callers,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        stop.set()
        flooder.join()
        summary = json.load(open(out))
        return summary_goodput(summary, a.seconds)
    finally:
        for p in (uas, server):
            if p:
                p.terminate()
                p.wait()
        try:
            os.rmdir(cg)
        except OSError:
            pass


def summary_goodput(summary, seconds):
    """Calls completed within T1 (500 ms; goodput as seed 004 counts it), per second of the
    run, from `sipsec load --json`."""
    return summary["on_time"] / seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", action="append", required=True,
                    help="NAME=PATH, repeatable; alternated case by case")
    ap.add_argument("--rate", type=int, default=2700)
    ap.add_argument("--digest-rate", type=int, help="the legitimate rate with digest (default --rate)")
    ap.add_argument("--flood", type=int, default=6000)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quota", type=float, default=0.25)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--auth", default="none,digest")
    a = ap.parse_args()
    a.digest_rate = a.digest_rate or a.rate
    binaries = [b.split("=", 1) for b in a.binary]
    work = tempfile.mkdtemp(prefix="sipsec-markers.")
    with open(os.path.join(work, "users.csv"), "w") as f:
        f.writelines(f"user{i},pw{i}\n" for i in range(100))
    cases = a.cases.split(",")
    auths = [x == "digest" for x in a.auth.split(",")]
    results = {}
    for r in range(a.rounds):
        for digest in auths:
            for case in cases:
                order = binaries if r % 2 == 0 else binaries[::-1]
                for name, path in order:
                    g = run(os.path.realpath(path), work, case, digest, a)
                    results.setdefault((name, digest, case), []).append(g)
                    print(f"round {r + 1} {'digest' if digest else 'none':6} {case:17} "
                          f"{name:8} {g:7.1f} calls/s", flush=True)
    def cell(v, digits):
        m, h = t_interval(v)
        return f"{m:.{digits}f} [{m - h:.{digits}f}, {m + h:.{digits}f}]"

    print(f"\nlegitimate goodput, calls/s: mean [95% t-interval] of {a.rounds} rounds; rate "
          f"{a.rate}/s ({a.digest_rate}/s with digest), flood {a.flood}/s from {FLOOD_FROM}, quota {a.quota} core, {a.seconds} s")
    for digest in auths:
        for case in cases:
            cells = [f"{name} {cell(results[(name, digest, case)], 1)}" for name, _ in binaries]
            print(f"{'digest' if digest else 'none':6} {case:17} " + "   ".join(cells))
    print("\nagainst the plain flood under the first binary, round by round (the bar: >= 0.9):")
    for digest in auths:
        base = results[(binaries[0][0], digest, "plain")]
        for case in cases:
            ratios = [f"{name} {cell([g / b for g, b in zip(results[(name, digest, case)], base)], 2)}"
                      for name, _ in binaries]
            print(f"{'digest' if digest else 'none':6} {case:17} " + "   ".join(ratios))
    print("\nagainst the offered rate (the share the legitimate calls kept):")
    for digest in auths:
        rate = a.digest_rate if digest else a.rate
        for case in cases:
            kept = [f"{name} {cell([g / rate for g in results[(name, digest, case)]], 2)}"
                    for name, _ in binaries]
            print(f"{'digest' if digest else 'none':6} {case:17} " + "   ".join(kept))


if __name__ == "__main__":
    main()
