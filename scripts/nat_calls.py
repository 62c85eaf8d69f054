#!/usr/bin/env python3
"""Calls to phones behind a real NAT (issue 34's first bar): the share of calls that reach a
phone behind an nftables masquerading router, over UDP, TCP and TLS, right after it
registered and again after three conntrack timeouts of silence.

The topology is the NAT tests' (crates/sipsec/tests/common/netns.rs), built here in network
namespaces of its own (root; `ip`, `nft`): the phones in "home" (198.18.9.0/24), the router
masquerading them onto 198.19.9.1 with conntrack timeouts of --conntrack-s for UDP and for
established TCP (above the 10 s Flow-Timer the server gives outbound clients), and `sipsec serve` with the callers in "server" (198.19.9.0/24), which has
no route to the home network. The server pings its NATed UDP bindings (`[nat] ping =
"options"`) at a third of the conntrack timeout.

Per transport one phone registers user `<transport>phone` and answers: `sipsec load --role uas
--register` (with `--outbound`, so it keeps its flow alive as RFC 5626 says), or where that
build has no --register, SIPp with peers/sipp/phone.xml (UDP and TCP only; Debian's SIPp has
no TLS, nor keep-alives); or baresip (`--phone baresip`, an outbound client too). Then --calls calls at --rate from the server's network (`sipsec load`, UDP to the
server), an idle of three conntrack timeouts and a second, and --calls calls again.

    sudo scripts/nat_calls.py --calls 500 --rate 50 --conntrack-s 12

Prints one line per transport and phase: calls attempted, succeeded, the share, and the
failures by reason.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import wave

from kit import SIPP, parser

K = 9
HOME, PUBLIC, SERVER = f"198.18.{K}.2", f"198.19.{K}.1", f"198.19.{K}.2"
CALLER = f"198.19.{K}.3"
PORTS = {"udp": 5060, "tcp": 5060, "tls": 5061}
# The least Flow-Timer `[nat] flow_timer_s` allows: outbound clients keep their streams' mappings
# only where the conntrack timeout is longer (hence --conntrack-s 12 by default).
FLOW_TIMER_S = 10


def sh(*args, stdin=None):
    subprocess.run(args, check=True, input=stdin, text=True, capture_output=True)


def topology(prefix, conntrack_s):
    """The three namespaces, as the tests build them; their names."""
    home, router, server = (f"{prefix}-{n}" for n in ("home", "router", "server"))
    for ns in (home, router, server):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "-n", router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", home)
    sh("ip", "-n", router, "link", "add", "wan", "type", "veth", "peer", "name", "eth0", "netns", server)
    sh("ip", "-n", home, "addr", "add", f"{HOME}/24", "dev", "eth0")
    sh("ip", "-n", home, "link", "set", "eth0", "up")
    sh("ip", "-n", home, "route", "add", "default", "via", f"198.18.{K}.1")
    sh("ip", "-n", router, "addr", "add", f"198.18.{K}.1/24", "dev", "lan")
    sh("ip", "-n", router, "addr", "add", f"{PUBLIC}/24", "dev", "wan")
    for dev in ("lan", "wan"):
        sh("ip", "-n", router, "link", "set", dev, "up")
    for ip in (SERVER, CALLER):
        sh("ip", "-n", server, "addr", "add", f"{ip}/24", "dev", "eth0")
    sh("ip", "-n", server, "link", "set", "eth0", "up")
    nft = ('table ip nat {\n chain postrouting {\n  type nat hook postrouting priority 100;\n'
           '  oifname "wan" masquerade\n }\n}\n')
    sh("ip", "netns", "exec", router, "nft", "-f", "-", stdin=nft)
    t = str(conntrack_s)
    sh("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1",
       f"net.netfilter.nf_conntrack_udp_timeout={t}",
       f"net.netfilter.nf_conntrack_udp_timeout_stream={t}",
       f"net.netfilter.nf_conntrack_tcp_timeout_established={t}")
    return home, router, server


def teardown(names):
    """Kills what runs in the namespaces (all started here) and deletes them."""
    for ns in names:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        for pid in out.split():
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def baresip(work, home, user, t, n):
    """baresip as an RFC 5626 client (`sipnat=outbound`: CRLF keep-alives at the Flow-Timer)
    answering by itself, G.711 from a WAV file of silence at 8 kHz (the PCMU `sipsec load`
    offers; the sine source makes 48 kHz only); its command line."""
    d = f"{work}/{user}"
    os.makedirs(d, exist_ok=True)
    with wave.open(f"{d}/silence.wav", "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(bytes(2 * 8000 * 30))
    with open(f"{d}/uuid", "w") as f:
        f.write(str(uuid.uuid4()))
    with open(f"{d}/config", "w") as f:
        f.write(f"sip_listen {HOME}:{5070 + 2 * n}\nnet_interface {HOME}\nmodule_path /usr/lib/baresip/modules\n"
                "module g711.so\nmodule aufile.so\nmodule uuid.so\nmodule_app account.so\n"
                f"audio_source aufile,{d}/silence.wav\naudio_player aufile,/dev/null\naudio_alert aufile,/dev/null\n"
                f"sip_cafile {work}/ca.pem\n")
    with open(f"{d}/accounts", "w") as f:
        f.write(f'<sip:{user}@example.test>;outbound="sip:{SERVER}:{PORTS[t]};transport={t}";'
                "regint=600;answermode=auto;sipnat=outbound\n")
    return ["ip", "netns", "exec", home, "baresip", "-f", d, "-t", "3600"]


def has_register(sipsec):
    out = subprocess.run([sipsec, "load", "--help"], capture_output=True, text=True).stdout
    return "--register" in out


def main():
    ap = parser(__doc__, calls=500, rate=50, conntrack_s=12)
    ap.add_argument("--transports", default="udp,tcp,tls")
    ap.add_argument("--phone", choices=["auto", "load", "sipp", "baresip"], default="auto")
    ap.add_argument("--no-nat-table", action="store_true",
                    help="no [nat] table in the config (a build from before it, or its defaults)")
    a = ap.parse_args()
    sipsec = os.path.abspath(a.sipsec)
    phone = a.phone if a.phone != "auto" else ("load" if has_register(sipsec) else "sipp")
    work = tempfile.mkdtemp(prefix="nat-calls-")
    names = topology(f"natcalls-{os.getpid()}", a.conntrack_s)
    home, _, server = names
    procs = []
    try:
        sh(sipsec, "certs", "--name", SERVER, "--out", work)
        ping_ms = max(a.conntrack_s * 1000 // 3, 100)
        with open(f"{work}/sipsec.toml", "w") as f:
            f.write(f'[server]\nlisten = ["udp:{SERVER}:5060", "tcp:{SERVER}:5060", "tls:{SERVER}:5061"]\n'
                    'domains = ["example.test"]\nrecord_route = true\n'
                    f'[tls]\ncert = "{work}/server.pem"\nkey = "{work}/server-key.pem"\nca = "{work}/ca.pem"\n'
                    f'[database]\nurl = "sqlite://{work}/s.db"\n')
            if not a.no_nat_table:
                f.write(f'[nat]\nping = "options"\nping_interval_ms = {ping_ms}\n'
                        f'flow_timer_s = {FLOW_TIMER_S}\n')
        log = open(f"{work}/serve.log", "w")
        srv = subprocess.Popen(["ip", "netns", "exec", server, sipsec, "serve", "--config", f"{work}/sipsec.toml"],
                               stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, "SIPSEC_LOG": "info"})
        procs.append(srv)
        banner = srv.stdout.readline()
        if not banner.startswith("sipsec listening"):
            sys.exit(f"the server did not start: {banner!r}; see {work}/serve.log")
        transports = a.transports.split(",")

        def start_phone(t):
            user = f"{t}phone"
            if phone == "load":
                with open(f"{work}/{user}.csv", "w") as f:
                    f.write(f"{user},x,example.test\n")
                cmd = ["ip", "netns", "exec", home, sipsec, "load", "--role", "uas", "--register", "--outbound",
                       f"{t}:{SERVER}:{PORTS[t]}", "--users", f"{work}/{user}.csv", "--domain", "example.test",
                       "--local", HOME, "--duration", "3600", "--quiet"]
                cmd += ["--tls-ca", f"{work}/ca.pem"] if t == "tls" else []
            elif phone == "baresip":
                cmd = baresip(work, home, user, t, len(procs))
            else:
                cmd = ["ip", "netns", "exec", home, "sipp", f"{SERVER}:5060", "-sf", f"{SIPP}/phone.xml",
                       "-oocsf", f"{SIPP}/phone_uas.xml", "-s", user, "-i", HOME, "-p", str(5070 + len(procs)),
                       "-t", "u1" if t == "udp" else "t1", "-m", "1", "-d", "3600000", "-nostdin"]
            procs.append(subprocess.Popen(cmd, stdout=open(f"{work}/{user}.out", "w"),
                                          stderr=open(f"{work}/{user}.err", "w"),
                                          cwd=work))
            time.sleep(2)

        def run_calls(t, phase, n):
            out = f"{work}/calls-{t}-{n}.json"
            subprocess.run(["ip", "netns", "exec", server, sipsec, "load", f"udp:{SERVER}:5060", "--local", CALLER,
                            "--service", f"{t}phone", "--domain", "example.test", "--calls", str(a.calls),
                            "--rate", str(a.rate), "--drain-s", "10", "--quiet", "--json", out],
                           capture_output=True, cwd=work)
            s = json.load(open(out)) if os.path.exists(out) else {}
            att, ok = s.get("attempted", 0), s.get("succeeded", 0)
            share = 100.0 * ok / att if att else 0.0
            print(f"{t:4} {phase:24} attempted {att:6} succeeded {ok:6} = {share:6.2f}%  "
                  f"failures {json.dumps(s.get('failures_by_reason', {}))}", flush=True)

        # Each phone is called right after it registered (a stream's mapping would expire
        # while the others are called), then all again after three timeouts of silence.
        if phone == "sipp" and "tls" in transports:
            print("tls: skipped (Debian's SIPp has no TLS; needs sipsec load --register)")
            transports.remove("tls")
        for t in transports:
            start_phone(t)
            run_calls(t, "registered", 0)
        time.sleep(3 * a.conntrack_s + 1)
        for t in transports:
            run_calls(t, f"after 3 x {a.conntrack_s} s idle", 1)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        teardown(names)
    print(f"(work files in {work}; phone: {phone})")


if __name__ == "__main__":
    main()
