# What the shell scripts here share (sourced, not run).

# server_toml DB: the [server], [routing] and [database] tables of a one-worker UDP proxy on
# 127.0.0.1:$PORT for example.test, routing to the callee on 127.0.0.3:$((PORT + 20)), its
# SQLite database the file DB.
server_toml() {
  cat <<TOML
[server]
listen = ["udp:127.0.0.1:$PORT"]
domains = ["example.test"]
workers = 1
[routing]
default_route = "sip:127.0.0.3:$((PORT + 20))"
[database]
url = "sqlite://$1"
TOML
}

# work_in NAME: from the repository's root, BIN the sipsec binary ($SIPSEC, default
# target/release/sipsec) as an absolute path; then the results directory OUT (default a new
# /tmp/sipsec-NAME.XXXXXX) made, announced and entered.
work_in() {
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  BIN=$(realpath "${SIPSEC:-target/release/sipsec}")
  OUT=${OUT:-$(mktemp -d "/tmp/sipsec-$1.XXXXXX")}
  mkdir -p "$OUT"
  echo "results in $OUT"
  cd "$OUT"
}

# callgrind_setup: for the callgrind scripts, FEW, MANY and RATE from their arguments (200,
# 1000 and 50 by default), BIN the sipsec binary, WORK a scratch directory removed on exit
# (with whatever still runs from it), and a test CA and certificate for 127.0.0.1 and
# 127.0.0.3 in $WORK/certs (TLS_ARGS: what `sipsec load` needs to use them).
callgrind_setup() {
  FEW=${1:-200}
  MANY=${2:-1000}
  RATE=${3:-50}
  BIN=$(realpath "${SIPSEC:-$(dirname "${BASH_SOURCE[0]}")/../target/release/sipsec}")
  WORK=$(mktemp -d)
  trap 'pkill -f "$WORK" 2>/dev/null || true; rm -rf "$WORK"' EXIT
  "$BIN" certs --out "$WORK/certs" --name 127.0.0.1 --name 127.0.0.3 >/dev/null
  TLS_ARGS=(--tls-ca "$WORK/certs/ca.pem" --tls-cert "$WORK/certs/server.pem"
            --tls-key "$WORK/certs/server-key.pem")
}

# worker_instructions NAME CALLS LOAD_ARGS...: runs the server on $WORK/NAME.toml under
# callgrind, counting only inside its worker loop (`Worker::run`: reading, framing, TLS
# records, the engine, writing), drives CALLS calls through it with `sipsec load LOAD_ARGS...
# --calls CALLS --rate $RATE`, and prints the instructions counted and the calls that
# succeeded. Fails when under 98% of them did.
worker_instructions() {
  local name=$1 calls=$2 ok
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.cg" \
    --toggle-collect='*Worker::run*' "$BIN" serve --config "$WORK/$name.toml" \
    >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local server=$!
  for _ in $(seq 100); do grep -q "listening" "$WORK/$name.out" 2>/dev/null && break; sleep 0.2; done
  "$BIN" load "$@" --calls "$calls" --rate "$RATE" -q >"$WORK/$name.load" 2>&1 || true
  kill -TERM "$server"
  wait "$server" || true
  ok=$(sed -n 's/.* attempted, \([0-9]*\) succeeded.*/\1/p' "$WORK/$name.load")
  if [ -z "$ok" ] || [ $(( ok * 50 )) -lt $(( calls * 49 )) ]; then
    echo "$name: under 98% of $calls calls succeeded" >&2
    cat "$WORK/$name.load" >&2
    return 1
  fi
  echo "$(awk '/^(summary|totals):/ {print $2; exit}' "$WORK/$name.cg") $ok"
}

# per_call NAME LOAD_ARGS...: instructions per call in the worker for $WORK/NAME.toml, from
# a run of FEW calls and one of MANY: the difference per call that succeeded, which leaves
# out what a run costs once (start-up, registration, TLS handshakes).
per_call() {
  local name=$1 few few_ok many many_ok out
  shift
  out=$(worker_instructions "$name" "$FEW" "$@")
  read -r few few_ok <<< "$out"
  out=$(worker_instructions "$name" "$MANY" "$@")
  read -r many many_ok <<< "$out"
  echo $(( (many - few) / (many_ok - few_ok) ))
}
