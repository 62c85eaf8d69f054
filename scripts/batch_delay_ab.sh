#!/usr/bin/env bash
# A/B of server.max_batch_delay_us: sipsec pinned to CPU 0 with one worker, SIPp UAC and UAS
# on CPU 1, 1,500 calls/s (INVITE..BYE through a record-routing proxy), alternated ROUNDS
# times. Prints user/sys/total server CPU microseconds per successful call.
#
#   scripts/batch_delay_ab.sh [ROUNDS=3] [STATEFUL=true] [DELAYS="0 500"]
set -euo pipefail
ROUNDS=${1:-3}; STATEFUL=${2:-true}; DELAYS=${3:-"0 500"}
HERE=$(cd "$(dirname "$0")/.." && pwd)
KIT="$HERE/peers/sipp"
BIN="$HERE/target/release/sipsec"
WORK=$(mktemp -d)
TCK=$(getconf CLK_TCK)
trap 'pkill -f "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT

measure() {
  local delay=$1
  cat > "$WORK/s.toml" <<EOT
[server]
listen = ["udp:127.0.0.1:35060"]
domains = ["bench.test"]
workers = 1
stateful = $STATEFUL
max_batch_delay_us = $delay
[routing]
default_route = "sip:127.0.0.3:35080;transport=udp"
[database]
url = "sqlite://$WORK/s-$delay.db"
EOT
  taskset -c 1 sipp -sf "$KIT/uas.xml" -i 127.0.0.3 -p 35080 -nostdin -buff_size 1048576 \
    -trace_err -error_file "$WORK/uas.err" >/dev/null 2>&1 &
  local uas=$!
  taskset -c 0 "$BIN" serve --config "$WORK/s.toml" >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  local uac=(taskset -c 1 sipp 127.0.0.1:35060 -sf "$KIT/uac.xml" -s bench -i 127.0.0.2 -p 35070
             -r 1500 -rp 1000 -l 15000 -nostdin -buff_size 1048576 -timeout 60s)
  "${uac[@]}" -m 3000 >/dev/null 2>&1 || true   # warm-up
  read -r u0 s0 < <(awk '{print $14, $15}' /proc/$srv/stat)
  "${uac[@]}" -m 18000 -trace_stat -stf "$WORK/st.csv" >/dev/null 2>&1 || true
  sleep 2
  read -r u1 s1 < <(awk '{print $14, $15}' /proc/$srv/stat)
  local ok
  ok=$(python3 -c "
rows=[l.strip().split(';') for l in open('$WORK/st.csv') if l.strip()]
print(dict(zip(rows[0], rows[-1]))['SuccessfulCall(C)'])")
  rm -f "$WORK/st.csv"
  kill -INT $srv; kill $uas; wait $srv $uas 2>/dev/null || true
  python3 -c "
u, s, ok, tck = $((u1-u0)), $((s1-s0)), $ok, $TCK
print(f'max_batch_delay_us={$delay:<4} stateful=$STATEFUL  user {u/tck/ok*1e6:6.1f}  sys {s/tck/ok*1e6:6.1f}  total {(u+s)/tck/ok*1e6:6.1f} us/call  ({ok} calls ok)')"
}

for _ in $(seq "$ROUNDS"); do
  for d in $DELAYS; do measure "$d"; done
done
