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
source "$(dirname "$0")/kit.sh"
callgrind_setup "$@"

declare -A per_call
for t in udp tcp tls; do
  port=35060
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
  tls=()
  [ "$t" = tls ] && tls=("${TLS_ARGS[@]}")
  per_call[$t]=$(per_call "$t" "$t:127.0.0.1:$port" --role both --uas "$t:127.0.0.3:35080" "${tls[@]}")
  echo "$t: ${per_call[$t]} instructions per call in the worker"
done
echo "framing (TCP - UDP): $(( per_call[tcp] - per_call[udp] )) per call"
echo "TLS records (TLS - TCP): $(( per_call[tls] - per_call[tcp] )) per call, $(( (per_call[tls] - per_call[tcp]) / 13 )) per message"
