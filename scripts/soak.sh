#!/usr/bin/env bash
# Soak: sipsec serve with digest authentication, loaded at a fraction (default 80%) of one
# core's capacity for DURATION seconds (default 1800) with authenticated calls and
# registrations mixed, while the server's resident memory is sampled every 10 s (rss.txt).
# The load generators' summaries go to soak-calls.json and soak-register.json.
#
#   scripts/soak.sh [DURATION_S] [FRACTION]       # e.g. scripts/soak.sh 1800 0.8
#
# The server runs pinned to CPU 0 with one worker; the load generators and the callee share
# CPU 1. Needs only the sipsec binary (SIPSEC, default target/release/sipsec).
set -euo pipefail
. "$(dirname "$0")/kit.sh"
DURATION=${1:-1800}
FRACTION=${2:-0.8}
PORT=${PORT:-15060}
work_in soak

# 2,000 users: calls go from user n to user n+1 in another domain (routed to the callee),
# registrations refresh user n's binding in ours. Both are challenged (digest, MD5).
for i in $(seq 0 1999); do echo "user$i,pw$i"; done >users.csv
# The 2,000 phones all register from one address here: no per-source cap on bindings.
{ server_toml soak.db; printf '[auth]\nscheme = "digest"\nmethods = ["INVITE", "REGISTER"]\n[registrar]\nmax_bindings_per_source = 0\n'; } >soak.toml
"$BIN" users --config soak.toml import users.csv >/dev/null

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
start_server() {
  SIPSEC_LOG=warn taskset -c 0 "$BIN" serve --config soak.toml >serve.out 2>>serve.log &
  server=$!
  pids+=("$server")
  sleep 1
}
start_server
taskset -c 1 "$BIN" load --role uas --uas "127.0.0.3:$((PORT + 20))" -q >uas.log 2>&1 &
pids+=($!)
sleep 0.5

# Capacity by CPU: 10 s of the same mix at a rate well below the peak, and the share of its
# core the server used; the soak rate gives FRACTION of the core. (The peak search's short
# trials overshoot, and its last trials leave the server overloaded.)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$server/stat"; }
mix() { # calls/s, registrations/s, seconds, name
  taskset -c 1 "$BIN" load "127.0.0.1:$PORT" --users users.csv --domain elsewhere.test \
    --rate "$1" --duration "$3" --json "$4-calls.json" >"$4-calls.log" 2>&1 &
  local c=$!
  taskset -c 1 "$BIN" load "127.0.0.1:$PORT" --users users.csv --domain example.test \
    --scenario register --rate "$2" --duration "$3" --json "$4-register.json" \
    >"$4-register.log" 2>&1 &
  local r=$!
  pids+=("$c" "$r")
}
t0=$(cpu_ticks)
mix 3000 300 10 calibrate
sleep 10
t1=$(cpu_ticks)
wait "${pids[@]: -2}" || true
hz=$(getconf CLK_TCK)
calls=$(python3 -c "u = ($t1 - $t0) / $hz / 10; print(int(3000 * $FRACTION / u))")
regs=$((calls / 10))
echo "calibration: 3000 calls/s and 300 registrations/s used $(python3 -c "print(round(($t1 - $t0) / $hz / 10, 3))") of a core; soak at $calls calls/s and $regs registrations/s for $DURATION s" | tee plan.txt
sleep 35

rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
echo "elapsed_s rss_kb" >rss.txt
echo "0 $(rss)" >>rss.txt
mix "$calls" "$regs" "$DURATION" soak
calls_pid=${pids[-2]}
start=$(date +%s)
while kill -0 "$calls_pid" 2>/dev/null; do
  sleep 10
  echo "$(($(date +%s) - start)) $(rss)" >>rss.txt
done
wait "$calls_pid" || true
sleep 2
kill -INT "$server"
wait "$server" || true
python3 - <<'EOF'
import json
rows = [l.split() for l in open("rss.txt").read().splitlines()[1:]]
rss = [(int(t), int(k)) for t, k in rows if k]
warm = [k for t, k in rss if t >= min(120, rss[-1][0])]
for name in ("soak-calls", "soak-register"):
    j = json.load(open(f"{name}.json"))
    print(f"{name}: {j['succeeded']} of {j['attempted']} succeeded, "
          f"retransmissions {j['retransmissions']}, latency ms {j['latency_ms']}")
print(f"RSS: {rss[0][1]} kB at start, after warm-up (120 s) {min(warm)}-{max(warm)} kB, "
      f"at the end {rss[-1][1]} kB")
EOF
