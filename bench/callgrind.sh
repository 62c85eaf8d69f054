#!/usr/bin/env bash
# Instructions per call spent in the engine (parser, transactions, proxy logic; no sockets),
# counted by callgrind: repeatable to the instruction whatever else the machine is doing.
# The in-memory driver (examples/engine_calls.rs) runs N calls; the inclusive cost of
# Engine::on_datagram and Engine::on_tick, divided by N, is the engine's cost per call (the
# driver's own message building is excluded).
#
#   bench/callgrind.sh [N=3000]
set -euo pipefail
N=${1:-3000}
cd "$(dirname "$0")/.."
cargo build --release --example engine_calls >/dev/null 2>&1
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for mode in stateful stateless; do
  valgrind --tool=callgrind --callgrind-out-file="$OUT" target/release/examples/engine_calls "$mode" "$N" >/dev/null 2>&1
  callgrind_annotate --inclusive=yes "$OUT" 2>/dev/null | awk -v n="$N" -v mode="$mode" '
    /sipsec::engine::Engine::on_datagram \[/ || /sipsec::engine::Engine::on_tick \[/ {
      gsub(",", "", $1); total += $1
    }
    END { printf "%s: %d instructions per call in the engine (INVITE..BYE through a record-routing proxy)\n", mode, total / n }'
done
