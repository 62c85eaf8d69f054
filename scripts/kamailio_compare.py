#!/usr/bin/env python3
"""Server CPU per call of sipsec and of the reference Kamailio (peers/kamailio/proxy.cfg), under the same
SIPp load (peers/sipp/uac.xml and uas.xml: a call through a record-routing proxy), alternated
round by round in one run; prints each round and the median ratio.

    python3 scripts/kamailio_compare.py --sipsec target/release/sipsec \
        [--scenario stateful|stateless] [--rate 1500] [--calls 18000] [--rounds 3]

The server under test is pinned to CPU 0 with one worker; SIPp (caller and callee) runs on
CPU 1. CPU per call is the user+system time, from /proc, of the server's whole process tree
(Kamailio forks a dozen) over the measured calls, divided by the calls SIPp counts successful.
Each measurement is preceded by a warm-up of two seconds of calls. Compare at one rate only:
on these VMs wake-ups dominate at low rates. Needs `kamailio` and `sip-tester` (Debian).

Also a library: scripts/harness_check.py and scripts/harness_isolate.py import it.
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from kit import KAMAILIO, SIPP, tree  # noqa: F401  (tree: used by the scripts importing this one)
TICKS = os.sysconf("SC_CLK_TCK")
WORK = tempfile.mkdtemp(prefix="sipsec-compare-")
# The server, the SIPp caller and the SIPp callee, each on its own loopback address.
PROXY, UAC, UAS = ("127.0.0.1", 35060), ("127.0.0.2", 35070), ("127.0.0.3", 35080)
procs = []


def start(cmd, cpu):
    """Starts `cmd` pinned to `cpu`, its output in WORK; remembered in `procs`."""
    log = open(os.path.join(WORK, f"proc{len(procs)}.log"), "w")
    p = subprocess.Popen(["taskset", "-c", str(cpu), *cmd], cwd=WORK, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def stop(p):
    """SIGTERM, then SIGKILL after 10 s."""
    if p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _died(p):
    if p.poll() is not None:
        sys.exit(f"the server exited at start; its log is in {WORK}")


def wait_bound(p, port):
    """Until something binds UDP `port` (Kamailio answers nothing to a stray OPTIONS)."""
    for _ in range(100):
        _died(p)
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind((PROXY[0], port))
        except OSError:
            time.sleep(0.5)  # its children start after the main process binds
            return
        finally:
            probe.close()
        time.sleep(0.2)
    sys.exit(f"nothing bound UDP port {port}")


def _answers_options():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(0.5)
    port = s.getsockname()[1]
    req = (f"OPTIONS sip:{PROXY[0]}:{PROXY[1]} SIP/2.0\r\n"
           f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{uuid.uuid4().hex[:16]}\r\n"
           f"Max-Forwards: 70\r\nFrom: <sip:probe@127.0.0.1>;tag=p\r\nTo: <sip:{PROXY[0]}>\r\n"
           f"Call-ID: {uuid.uuid4().hex}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n")
    try:
        s.sendto(req.encode(), PROXY)
        s.recvfrom(65536)
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_ready(p):
    """Until the server answers an OPTIONS (sipsec answers one addressed to itself)."""
    for _ in range(100):
        _died(p)
        if _answers_options():
            return
        time.sleep(0.2)
    sys.exit("the server never answered OPTIONS")



def cpu(pids):
    """User+system seconds of `pids` (those that have exited count nothing)."""
    total = 0
    for p in pids:
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def sipp(rate, calls):
    """SIPp's caller through the server on CPU 1: (successful, failed) calls."""
    stats = os.path.join(WORK, f"stat-{uuid.uuid4().hex[:8]}.csv")
    subprocess.run(["taskset", "-c", "1", "sipp", f"{PROXY[0]}:{PROXY[1]}",
                    "-sf", os.path.join(SIPP, "uac.xml"), "-s", "bench",
                    "-i", UAC[0], "-p", str(UAC[1]), "-r", str(rate), "-rp", "1000",
                    "-m", str(calls), "-l", str(rate * 10), "-buff_size", "1048576",
                    "-trace_stat", "-stf", stats, "-fd", "1", "-nostdin",
                    "-timeout", f"{calls // rate + 30}s"],
                   cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [line.strip().split(";") for line in open(stats) if line.strip()]
    last = dict(zip(lines[0], lines[-1]))
    return int(last["SuccessfulCall(C)"]), int(last["FailedCall(C)"])


def sipp_uas():
    """SIPp's callee on CPU 1."""
    return start(["sipp", "-sf", os.path.join(SIPP, "uas.xml"), "-i", UAS[0], "-p", str(UAS[1]),
                  "-nostdin", "-timeout", "3600s", "-buff_size", "1048576"], 1)


def kamailio(stateless):
    """The reference Kamailio on CPU 0, listening on PROXY, relaying to UAS."""
    cmd = ["kamailio", "-DD", "-E", "-f", os.path.join(KAMAILIO, "proxy.cfg"), "-m", "512", "-M", "32",
           "-Y", WORK, "-w", WORK, "-A", f"LISTEN=udp:{PROXY[0]}:{PROXY[1]}",
           "-A", f'NEXT_HOP="sip:{UAS[0]}:{UAS[1]};transport=udp"']
    return start(cmd + (["-A", "STATELESS"] if stateless else []), 0)


def sipsec(binary, stateless):
    """sipsec on CPU 0 with the equivalent configuration (WORK/sipsec.toml)."""
    path = os.path.join(WORK, "sipsec.toml")
    with open(path, "w") as f:
        f.write(f"""[server]
listen = ["udp:{PROXY[0]}:{PROXY[1]}"]
domains = ["bench.test"]
mode = "proxy"
stateful = {"false" if stateless else "true"}
record_route = true
workers = 1
[routing]
default_route = "sip:{UAS[0]}:{UAS[1]};transport=udp"
[database]
url = "sqlite://{WORK}/sipsec-{uuid.uuid4().hex[:8]}.db"
""")
    return start([os.path.abspath(binary), "serve", "--config", path], 0)


def measure(starter, rate, calls, answers_options):
    """Starts a server, warms it up, measures CPU per successful call in µs, stops it."""
    p = starter()
    if answers_options:
        wait_ready(p)
    else:
        wait_bound(p, PROXY[1])
    sipp(rate, min(calls, rate * 2))
    time.sleep(1)
    before = cpu(tree(p.pid))
    ok, failed = sipp(rate, calls)
    time.sleep(2)  # let the last transactions' timers run on the server's clock
    after = cpu(tree(p.pid))
    stop(p)
    if ok < 0.99 * calls:
        print(f"  warning: {ok} of {calls} calls succeeded ({failed} failed)")
    return (after - before) * 1e6 / max(ok, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", required=True, help="the sipsec binary")
    ap.add_argument("--scenario", choices=["stateful", "stateless"], default="stateful")
    ap.add_argument("--rate", type=int, default=1500, help="calls per second")
    ap.add_argument("--calls", type=int, default=18000, help="calls measured per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    stateless = a.scenario == "stateless"
    uas = sipp_uas()
    time.sleep(0.8)
    kam, sec = [], []
    try:
        for r in range(1, a.rounds + 1):
            kam.append(measure(lambda: kamailio(stateless), a.rate, a.calls, False))
            sec.append(measure(lambda: sipsec(a.sipsec, stateless), a.rate, a.calls, True))
            print(f"round {r}: kamailio {kam[-1]:.1f} µs/call, sipsec {sec[-1]:.1f} µs/call, "
                  f"ratio {sec[-1] / kam[-1]:.2f}")
    finally:
        stop(uas)
        for p in procs:
            stop(p)
        shutil.rmtree(WORK, ignore_errors=True)
    k, s = statistics.median(kam), statistics.median(sec)
    print(f"{a.scenario} UDP proxy, {a.rate} calls/s, median of {a.rounds}: sipsec {s:.1f} "
          f"µs/call, kamailio {k:.1f} µs/call, ratio {s / k:.2f}")


if __name__ == "__main__":
    main()
