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
