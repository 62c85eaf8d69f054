#!/usr/bin/env python3
"""What keeping NAT mappings open costs: the server's CPU with BINDINGS UDP bindings behind a
NAT, pinged every `[nat] ping_interval_ms`, beside the same server with the same bindings and
pings off — two servers running side by side, measured over the same windows.

Each server gets BINDINGS registrations, each a private Contact (`sip:uN@10.x.y.z`) sent with
`rport` from one UDP socket of this script: the "NAT" every binding is reached through. The
script answers every OPTIONS ping on that socket with a 200, as phones do, and counts them.
Then, for ROUNDS windows of WINDOW seconds, it reads both servers' CPU time (schedstat of
every thread) and reports, per window, the pings received per second and the difference of
the two servers' CPU as a share of one core, with the mean and a Student t 95% interval over
the windows (n = ROUNDS; t for n - 1 degrees of freedom).

    cargo build --release --bin sipsec
    python3 scripts/nat_keepalive_cost.py [--bindings 100000] [--interval-ms 25000]
                                          [--rounds 5] [--window 25] [--ping options|crlf]
"""
import os, select, socket, statistics, subprocess, sys, tempfile, time

from kit import cpu_ns, parser, t_interval

def start(sipsec, port, ping, interval, bindings, tmp):
    cfg = os.path.join(tmp, f"s{port}.toml")
    with open(cfg, "w") as f:
        f.write(f"""[server]
listen = ["udp:127.0.0.1:{port}"]
domains = ["nat.test"]
[database]
url = "sqlite::memory:"
[registrar]
max_bindings = {bindings * 2}
max_bindings_per_source = 0
max_expires = 86400
[nat]
ping = "{ping}"
ping_interval_ms = {interval}
ping_timeout_ms = 0
[overload]
enabled = false
""")
    p = subprocess.Popen([sipsec, "serve", "--config", cfg], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return p


def answer(data):
    """A 200 to an OPTIONS ping, from its own lines."""
    lines = data.decode(errors="replace").split("\r\n")
    keep = [l for l in lines if l.split(":", 1)[0] in ("Via", "From", "To", "Call-ID", "CSeq")]
    return ("SIP/2.0 200 OK\r\n" + "\r\n".join(keep) + "\r\nContent-Length: 0\r\n\r\n").encode()


def register_all(sock, server, n):
    """Registers n private contacts through `sock`, a few hundred in flight at a time."""
    host, port = sock.getsockname()
    sent = ok = 0
    while ok < n:
        while sent < n and sent - ok < 400:
            i = sent
            contact = f"sip:u{i}@10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:5060"
            msg = (f"REGISTER sip:nat.test SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;rport;branch=z9hG4bKr{i}\r\n"
                   f"Max-Forwards: 70\r\nFrom: <sip:u{i}@nat.test>;tag=t{i}\r\nTo: <sip:u{i}@nat.test>\r\n"
                   f"Call-ID: reg{i}@{host}\r\nCSeq: 1 REGISTER\r\nContact: <{contact}>\r\nExpires: 86400\r\n"
                   f"Content-Length: 0\r\n\r\n")
            sock.sendto(msg.encode(), server)
            sent += 1
        r, _, _ = select.select([sock], [], [], 2.0)
        if not r:
            sys.exit(f"registrations stalled at {ok}/{n}")
        while True:
            try:
                data, _ = sock.recvfrom(65535)
            except BlockingIOError:
                break
            if data.startswith(b"SIP/2.0 200"):
                ok += 1
            elif data.startswith(b"OPTIONS"):
                sock.sendto(answer(data), server)


def main():
    ap = parser(__doc__, bindings=100_000, interval_ms=25_000, rounds=5, window=25,
                port=46060)
    ap.add_argument("--ping", default="options", choices=["options", "crlf"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="sipsec-natping-")
    servers = {"on": a.port, "off": a.port + 1}
    procs, socks = {}, {}
    try:
        for name, port in servers.items():
            procs[name] = start(a.sipsec, port, a.ping if name == "on" else "off",
                                a.interval_ms, a.bindings, tmp)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            s.setblocking(False)
            socks[name] = s
            t0 = time.time()
            register_all(s, ("127.0.0.1", port), a.bindings)
            print(f"{name}: {a.bindings} bindings registered in {time.time() - t0:.1f} s",
                  flush=True)
        # One interval for the phases to settle into their trickle.
        deadline = time.time() + a.interval_ms / 1000
        pings = 0

        def pump(until):
            nonlocal pings
            while time.time() < until:
                r, _, _ = select.select(list(socks.values()), [], [], 0.05)
                for s in r:
                    while True:
                        try:
                            data, src = s.recvfrom(65535)
                        except BlockingIOError:
                            break
                        if data.startswith(b"OPTIONS"):
                            pings += 1
                            s.sendto(answer(data), src)
                        elif data.strip(b"\r\n") == b"":
                            pings += 1

        pump(deadline)
        shares, rates = [], []
        for w in range(a.rounds):
            c0 = {n: cpu_ns(p.pid) for n, p in procs.items()}
            pings, t0 = 0, time.time()
            pump(t0 + a.window)
            dt = time.time() - t0
            c1 = {n: cpu_ns(p.pid) for n, p in procs.items()}
            on = (c1["on"] - c0["on"]) / 1e9 / dt
            off = (c1["off"] - c0["off"]) / 1e9 / dt
            shares.append(on - off)
            rates.append(pings / dt)
            print(f"window {w + 1}: {pings / dt:.0f} pings/s; CPU on {on * 100:.2f}% "
                  f"off {off * 100:.2f}% of a core; pings cost {(on - off) * 100:.2f}%", flush=True)
        n = len(shares)
        mean, half = t_interval(shares)
        print(f"\n{a.bindings} bindings, {a.ping} every {a.interval_ms} ms: "
              f"{statistics.mean(rates):.0f} pings/s; their cost {mean * 100:.2f}% of one core "
              f"(95% t-interval {(mean - half) * 100:.2f}..{(mean + half) * 100:.2f}%, n={n}); "
              f"{mean / statistics.mean(rates) * 1e6:.2f} us of CPU per ping")
    finally:
        for p in procs.values():
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
