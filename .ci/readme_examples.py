#!/usr/bin/env python3
"""Run every ```sh block of README.md as written, in order, and fail on the first that fails.

README is a tutorial: a newcomer copies its blocks into a shell one after another, in one
directory. So do we: every block runs with `bash -e -o pipefail` in one scratch directory
shared by all blocks (files one block makes, the next may use), with `sipsec` on PATH (the
release build of this checkout), on loopback only. Whatever a block starts in the background
(`sipsec serve ... &`) is stopped when the block ends, so each block must start what it uses.

A block may be preceded by an HTML comment (invisible on GitHub) saying how it is judged:

    <!-- example: in-repo -->            run in the repository root, not the scratch directory
    <!-- example: serves PATTERN -->     a server in the foreground: it must print PATTERN
                                         (a regex), still run 2 s later, then stop cleanly
                                         (exit 0) on SIGINT, as Ctrl-C would stop it
    <!-- example: runs-for SECONDS -->   a long job (the two-hour lab run): it must not fail
                                         within SECONDS; then it is interrupted
    <!-- example: in-ci -->              commands `.ci/run` itself runs (README's test command,
                                         the lab's quick run): not run again here, but each of
                                         the block's lines must be a line of .ci/run

Words may be combined, comma separated: `<!-- example: in-repo, serves listening -->`.
Without a comment a block must exit 0 within 300 s (a server: print its pattern within 900 s).

    python3 .ci/readme_examples.py            # after `cargo build --release`
    python3 .ci/readme_examples.py --list     # the blocks and how each is judged
"""

import argparse
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_LIMIT_S = 300
SERVES_LIMIT_S = 900  # `cargo run` may have to build first
ANNOTATION = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->\s*$")


class Block:
    def __init__(self, line, text, how):
        self.line = line  # README line of the opening fence
        self.text = text
        self.in_repo = False
        self.serves = None  # regex the server prints once it is up
        self.runs_for = None
        self.in_ci = False
        for word in filter(None, (w.strip() for w in how.split(","))):
            if word == "in-repo":
                self.in_repo = True
            elif word.startswith("serves "):
                self.serves = re.compile(word[len("serves "):].strip())
            elif word.startswith("runs-for "):
                self.runs_for = float(word[len("runs-for "):])
            elif word == "in-ci":
                self.in_ci = True
            else:
                raise SystemExit(f"README.md:{line}: unknown example annotation {word!r}")

    def describe(self):
        how = []
        if self.in_repo:
            how.append("in the repository")
        if self.serves:
            how.append(f"serves until /{self.serves.pattern}/, then SIGINT")
        if self.runs_for:
            how.append(f"must not fail within {self.runs_for:g} s")
        if self.in_ci:
            how.append("run by .ci/run itself (checked against it)")
        return "; ".join(how) or "runs to exit 0"


def blocks(readme):
    """Every ```sh block, indented ones (inside list items) included, with its annotation."""
    lines = readme.splitlines()
    found, i = [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped == "```sh":
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            prev = lines[i - 1].strip() if i else ""
            m = ANNOTATION.match(prev)
            body, j = [], i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            found.append(Block(i + 1, "\n".join(body) + "\n", m.group(1) if m else ""))
            i = j
        i += 1
    return found


def stop(proc, sig=signal.SIGTERM, grace=10.0):
    """Stops the block's whole process group (its background servers too)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def drain(proc, out, wait_s):
    """Appends what the block has printed (its background servers may hold the pipe open)."""
    for _ in range(64):
        ready, _, _ = select.select([proc.stdout], [], [], wait_s)
        if not ready:
            return
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            return
        out += chunk
        wait_s = 0.0


def run(block, scratch, env):
    """Runs one block; returns None when it passed, else why it failed and its output."""
    if block.in_ci:
        ci = open(os.path.join(REPO, ".ci", "run")).read().splitlines()
        for cmd in block.text.splitlines():
            cmd = cmd.split("#")[0].strip()
            if cmd and cmd not in (line.strip() for line in ci):
                return f"`{cmd}` is not a line of .ci/run, so CI does not run it", ""
        return None
    cwd = REPO if block.in_repo else scratch
    if re.search(r"^\s*cargo\s", block.text, re.M):
        # cargo runs with the caller's own PATH: build.rs looks at PATH (which peers are
        # installed), so another PATH would rebuild the crate.
        env = dict(os.environ)
    proc = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    out = bytearray()
    limit = block.runs_for or (SERVES_LIMIT_S if block.serves else DEFAULT_LIMIT_S)
    start = time.time()
    up_at = None
    why = None
    while True:
        drain(proc, out, 0.2)
        if block.serves and up_at is None and block.serves.search(out.decode("utf-8", "replace")):
            up_at = time.time()
        status = proc.poll()
        if status is not None:
            drain(proc, out, 0.0)
            if block.serves:
                why = f"the server exited ({status}) instead of serving"
            elif status != 0:
                why = f"exit status {status}"
            break
        if up_at is not None and time.time() - up_at >= 2.0:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                status = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                why = "the server did not stop within 15 s of SIGINT"
                break
            out += proc.stdout.read()
            if status != 0:
                why = f"the server exited {status} on SIGINT, not 0"
            break
        if time.time() - start >= limit:
            if block.runs_for:
                break  # still running after its time, without having failed: as it should
            why = f"still running after {limit:g} s" + (
                f" without printing /{block.serves.pattern}/" if block.serves else "")
            break
    stop(proc)
    if why:
        return why, out.decode("utf-8", "replace")
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="list the blocks and how each is judged")
    parser.add_argument("--from-line", type=int, default=0, help="skip blocks above this README line")
    parser.add_argument("--keep-going", action="store_true", help="run every block, report all failures")
    parser.add_argument("--to-line", type=int, default=1 << 30, help="skip blocks below this README line")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (its path is printed)")
    args = parser.parse_args()

    found = blocks(open(os.path.join(REPO, "README.md")).read())
    if args.list:
        for b in found:
            print(f"README.md:{b.line}: {b.describe()}")
            print("    " + b.text.strip().replace("\n", "\n    "))
        return 0

    binary = os.path.join(REPO, "target", "release", "sipsec")
    if not os.access(binary, os.X_OK):
        print(f"{binary} is missing: run `cargo build --release` first", file=sys.stderr)
        return 2
    bindir = tempfile.mkdtemp(prefix="readme-bin-")
    os.symlink(binary, os.path.join(bindir, "sipsec"))
    scratch = tempfile.mkdtemp(prefix="readme-examples-")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
    env.pop("SIPSEC_LOG", None)

    failed = 0
    try:
        for b in found:
            if not args.from_line <= b.line <= args.to_line:
                continue
            t0 = time.time()
            result = run(b, scratch, env)
            took = time.time() - t0
            first = b.text.strip().splitlines()[0] if b.text.strip() else ""
            if result is None:
                print(f"ok    README.md:{b.line} ({took:.1f} s) {first}", flush=True)
                continue
            why, output = result
            failed += 1
            print(f"FAIL  README.md:{b.line} ({took:.1f} s): {why}\n  the block:", flush=True)
            print("    " + b.text.strip().replace("\n", "\n    "))
            if output:
                print("  its output (last 40 lines):")
                print("    " + "\n    ".join(output.rstrip().splitlines()[-40:]))
            if not args.keep_going:
                break
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
        if args.keep:
            print(f"the scratch directory: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{len(found)} README blocks, {failed} failed" if args.keep_going or failed == 0
          else "README examples: stopped at the first failure")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
