#!/usr/bin/env bash
# User-space instructions per call in the server's worker for a call to a phone behind a NAT
# beside a call to a directly reachable one, over UDP and persistent TLS (stateful
# record-routing proxy, one worker, so no call crosses between workers; `[nat]` as it comes),
# counted by callgrind: the same figure whatever else the machine is doing. The rows are those
# of `scripts/nat_call_cost.py`:
#
# - udp direct: the callee registers its socket's address (`--register`);
# - udp nat: the callee registers a private Contact (`--contact-addr 10.0.0.9:5060`), as a
#   phone behind a NAT does: the server reaches it where its REGISTER came from, and its
#   dialogs carry its flow token in our Record-Route;
# - tls direct: the callee listens for TLS and the server reaches it over a connection it
#   opened, by its default route;
# - tls nat: the callee registers over TLS and listens nowhere (`*.invalid` Contact), calls
#   go over its registering connection, with flow tokens.
#
# Each row runs twice, with FEW and with MANY calls; the difference per call that succeeded
# leaves out what a run costs once (start-up, registration, the TLS handshakes).
#
#   cargo build --release
#   scripts/callgrind_nat.sh [FEW=200] [MANY=1000] [RATE=50]
set -euo pipefail
source "$(dirname "$0")/kit.sh"
callgrind_setup "$@"
echo "u0,pw0" > "$WORK/users.csv"

declare -A per_call
for row in "udp direct" "udp nat" "tls direct" "tls nat"; do
  t=${row%% *} route="" port=36060 domain=nat.test args=(--register) name=${row// /-}
  [ "$row" = "udp nat" ] && args+=(--contact-addr 10.0.0.9:5060)
  [ "$t" = tls ] && port=36061
  if [ "$row" = "tls direct" ]; then
    # Not a user here: its calls take the default route to the listening callee.
    route=$'[routing]\ndefault_route = "sip:127.0.0.3:36080;transport=tls"'
    domain=route.test args=(--uas "tls:127.0.0.3:36080")
  fi
  [ "$t" = tls ] && args+=("${TLS_ARGS[@]}")
  cat > "$WORK/$name.toml" <<EOT
[server]
listen = ["udp:127.0.0.1:36060", "tcp:127.0.0.1:36060", "tls:127.0.0.1:36061"]
domains = ["nat.test"]
workers = 1
stateful = true
record_route = true
[database]
url = "sqlite::memory:"
[tls]
cert = "$WORK/certs/server.pem"
key = "$WORK/certs/server-key.pem"
ca = "$WORK/certs/ca.pem"
[flood]
rate = 0
[overload]
# valgrind's pauses would look like overload.
enabled = false
$route
EOT
  per_call[$row]=$(per_call "$name" "$t:127.0.0.1:$port" --role both --users "$WORK/users.csv" \
    --domain "$domain" "${args[@]}")
  echo "$row: ${per_call[$row]} instructions per call in the worker"
done
for t in udp tls; do
  awk -v n="${per_call[$t nat]}" -v d="${per_call[$t direct]}" -v t="$t" \
    'BEGIN { printf "%s: nat / direct = %.3f\n", t, n / d }'
done
