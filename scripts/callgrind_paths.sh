#!/usr/bin/env bash
# User-space instructions per call in the server's worker over UDP, persistent TCP and
# persistent TLS (stateful record-routing proxy, one worker), counted by callgrind: the same
# figure whatever else the machine is doing. The server runs under valgrind, collecting only
# inside the worker loop (`Worker::run`: reading, framing, TLS records, the engine, writing),
# and `sipsec load --role both` drives calls through it at a rate valgrind keeps up with.
# Each transport runs twice, with FEW and with MANY calls; the difference per call leaves out
# what a run costs once (start-up, the TLS handshakes). TCP − UDP is the cost of framing
# streams; TLS − TCP is the cost of the records (one per message each way: 6 received and
# 7 sent per call).
#
#   cargo build --release
#   scripts/callgrind_paths.sh [FEW=200] [MANY=1000] [RATE=50]
set -euo pipefail
FEW=${1:-200}
MANY=${2:-1000}
RATE=${3:-50}
HERE=$(cd "$(dirname "$0")/.." && pwd)
BIN="$HERE/target/release/sipsec"
WORK=$(mktemp -d)
trap 'pkill -f "$WORK" 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$BIN" certs --out "$WORK/certs" --name 127.0.0.1 --name 127.0.0.3 >/dev/null

# run TRANSPORT CALLS: prints the instructions counted in the worker.
run() {
  local t=$1 CALLS=$2 port=35060
  [ "$t" = tls ] && port=35061
  cat > "$WORK/$t.toml" <<EOT
[server]
listen = ["udp:127.0.0.1:35060", "tcp:127.0.0.1:35060", "tls:127.0.0.1:35061"]
domains = ["bench.test"]
workers = 1
stateful = true
record_route = true
[routing]
default_route = "sip:127.0.0.3:35080;transport=$t"
[database]
url = "sqlite://$WORK/$t.db"
[tls]
cert = "$WORK/certs/server.pem"
key = "$WORK/certs/server-key.pem"
ca = "$WORK/certs/ca.pem"
EOT
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$t.cg" \
    --toggle-collect='*Worker::run*' "$BIN" serve --config "$WORK/$t.toml" \
    >"$WORK/$t.out" 2>"$WORK/$t.err" &
  local server=$!
  for _ in $(seq 100); do grep -q "listening" "$WORK/$t.out" 2>/dev/null && break; sleep 0.2; done
  local tls=()
  [ "$t" = tls ] && tls=(--tls-ca "$WORK/certs/ca.pem" --tls-cert "$WORK/certs/server.pem"
                         --tls-key "$WORK/certs/server-key.pem")
  "$BIN" load "$t:127.0.0.1:$port" --role both --uas "$t:127.0.0.3:35080" \
    --rate "$RATE" --calls "$CALLS" "${tls[@]}" -q \
    >"$WORK/$t.load" 2>&1 || { cat "$WORK/$t.load"; exit 1; }
  kill -TERM "$server"
  wait "$server" || true
  grep -q " $CALLS succeeded" "$WORK/$t.load" || { echo "$t: not every call succeeded" >&2; cat "$WORK/$t.load" >&2; exit 1; }
  awk '/^(summary|totals):/ {print $2; exit}' "$WORK/$t.cg"
}

declare -A per_call
for t in udp tcp tls; do
  few=$(run "$t" "$FEW")
  many=$(run "$t" "$MANY")
  per_call[$t]=$(( (many - few) / (MANY - FEW) ))
  echo "$t: ${per_call[$t]} instructions per call in the worker"
done
echo "framing (TCP - UDP): $(( per_call[tcp] - per_call[udp] )) per call"
echo "TLS records (TLS - TCP): $(( per_call[tls] - per_call[tcp] )) per call, $(( (per_call[tls] - per_call[tcp]) / 13 )) per message"
