"""What the scripts here share: where the peers' files are (`peers/sipp`, `peers/kamailio`),
a process and its descendants from /proc (their CPU time and wake-ups), the command line
every script starts from, a Student t interval over rounds, and starting `sipsec serve`.
"""

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SIPP = os.path.join(ROOT, "peers", "sipp")
KAMAILIO = os.path.join(ROOT, "peers", "kamailio")


def tree(pid):
    """`pid` and every process descended from it."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def threads(pids):
    """The /proc directory of every thread of each of `pids`."""
    for p in pids:
        try:
            names = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in names:
            yield f"/proc/{p}/task/{t}"


def threads_cpu_ns(pids):
    """On-CPU nanoseconds (schedstat) of every thread of each of `pids`."""
    ns = 0
    for d in threads(pids):
        try:
            ns += int(open(f"{d}/schedstat").read().split()[0])
        except OSError:
            pass
    return ns


def cpu_ns(pid):
    """On-CPU nanoseconds (schedstat) of every thread of `pid` and its descendants."""
    return threads_cpu_ns(tree(pid))


def wakeups(pid):
    """Voluntary context switches of every thread of `pid` and its descendants."""
    n = 0
    for d in threads(tree(pid)):
        try:
            for line in open(f"{d}/status"):
                if line.startswith("voluntary_ctxt_switches"):
                    n += int(line.split()[1])
        except OSError:
            pass
    return n


def serve(sipsec, work, name, text, prefix=()):
    """`sipsec serve` on config `text` (written to `work/NAME.toml`, its log to
    `work/NAME.log`), run under `prefix` (e.g. `ip netns exec NS`), once it printed its
    banner; exits with its log if it did not start."""
    cfg = os.path.join(work, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(text)
    p = subprocess.Popen([*prefix, sipsec, "serve", "--config", cfg], stdout=subprocess.PIPE,
                         stderr=open(os.path.join(work, f"{name}.log"), "w"), text=True)
    banner = p.stdout.readline()
    if not banner.startswith("sipsec listening"):
        sys.exit(f"{name} did not start: {banner!r}\n" + open(os.path.join(work, f"{name}.log")).read())
    return p


def clean_domain(db, domain, check=True):
    """Deletes every binding in `domain` from the PostgreSQL database `db` (`psql`): what
    earlier runs of a script left in a shared table."""
    subprocess.run(["psql", db, "-q", "-c",
                    f"DELETE FROM location_bindings WHERE aor LIKE '%@{domain}'"], check=check)


def parser(doc, **ints):
    """A command line described by `doc`, with `--sipsec` (the binary) and an integer option
    for each of `ints` (`rate=1000` is `--rate`, default 1000)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sipsec", default=os.path.join(ROOT, "target", "release", "sipsec"))
    for name, default in ints.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return ap


# Student t quantiles for a two-sided 95% interval, by degrees of freedom (n - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(values):
    """The mean of `values` and the half-width of its Student t 95% interval (n - 1 degrees
    of freedom; 2.0 past the table), NaN under two values."""
    n = len(values)
    mean = statistics.mean(values)
    if n < 2:
        return mean, float("nan")
    return mean, T95.get(n - 1, 2.0) * statistics.stdev(values) / n ** 0.5
