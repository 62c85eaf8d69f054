#!/usr/bin/env bash
# Overload soak: sipsec held to a quarter of a core (cgroup v1 CPU quota; root) is offered
# three times its peak for 60 s, with its resident memory sampled every 2 s, between two
# 20 s spells at half the peak: does memory stay flat under overload, and how soon after the
# overload ends are calls as fast as before it?
#
#   scripts/overload_soak.sh [PEAK_PER_S] [QUOTA]      # e.g. scripts/overload_soak.sh 2400 0.25
#
# PEAK_PER_S is the server's peak at that quota (`sipsec bench --cpu-quota 0.25 --find-peak`).
# OVERLOAD=off runs the same with overload control off. Results in OUT (default a temp dir):
# rss.txt, the load's per-second progress lines (load.log) and its summaries.
set -euo pipefail
. "$(dirname "$0")/kit.sh"
PEAK=${1:-2400}
QUOTA=${2:-0.25}
PORT=${PORT:-15160}
OVERLOAD=${OVERLOAD:-on}
work_in overload
enabled=$([ "$OVERLOAD" = on ] && echo true || echo false)
{ server_toml overload.db; printf '[overload]\nenabled = %s\n' "$enabled"; } >server.toml
pids=()
cg=/sys/fs/cgroup/cpu/sipsec-overload-$$
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
SIPSEC_LOG=warn taskset -c 0 "$BIN" serve --config server.toml >serve.out 2>serve.log &
server=$!
pids+=("$server")
sleep 1
mkdir -p "$cg"
echo 10000 >"$cg/cpu.cfs_period_us"
quota_us=$(python3 -c "print(int($QUOTA * 10000))")
echo "$quota_us" >"$cg/cpu.cfs_quota_us"
echo "$server" >"$cg/cgroup.procs"
taskset -c 1 "$BIN" load --role uas --uas "127.0.0.3:$((PORT + 20))" -q >uas.log 2>&1 &
pids+=($!)
sleep 0.5

rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
half=$(python3 -c "print(round($PEAK * 0.5))")
triple=$(python3 -c "print(round($PEAK * 3))")
phase() { # rate seconds name
  taskset -c 1 "$BIN" load "127.0.0.1:$PORT" --domain elsewhere.test --rate "$1" \
    --duration "$2" --drain-s 35 --json "$3.json" >"$3.log" 2>&1
}
echo "elapsed_s rss_kb" >rss.txt
phase "$half" 20 before
(
  start=$(date +%s)
  for _ in $(seq 1 32); do
    echo "$(($(date +%s) - start)) $(rss)" >>rss.txt
    sleep 2
  done
) &
sampler=$!
phase "$triple" 60 overload &
over=$!
wait "$over" || true
wait "$sampler" || true
phase "$half" 20 after
python3 - "$PEAK" <<'PY'
import json, re, sys
peak = float(sys.argv[1])
rss = [int(l.split()[1]) for l in open("rss.txt").read().splitlines()[1:] if len(l.split()) == 2]
for name in ("before", "overload", "after"):
    j = json.load(open(f"{name}.json"))
    print(f"{name}: offered {j['attempted']} in {j['elapsed_s']:.0f} s, {j['succeeded']} succeeded, "
          f"{j['on_time']} within 500 ms ({j['on_time'] / max(j['elapsed_s'], 1) / peak:.2f} × peak per s), "
          f"retransmissions {j['retransmissions']}, latency ms p50 {j['latency_ms']['p50']} p99 {j['latency_ms']['p99']}")
print(f"RSS during the overload: {min(rss)}-{max(rss)} kB over {len(rss)} samples "
      f"(first {rss[0]}, last {rss[-1]})")
lines = [l for l in open("after.log") if l.startswith("[")]
print("after the overload, per second (p50 / p99 ms):")
for l in lines[:10]:
    m = re.search(r"\[\s*([\d.]+)s\].*p50 ([\d.]+) ms p99 ([\d.]+) ms", l)
    if m:
        print(f"  {m.group(1)} s: {m.group(2)} / {m.group(3)}")
PY
