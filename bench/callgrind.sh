#!/usr/bin/env bash
# Instructions per call spent in the engine (parser, transactions, proxy logic; no sockets),
# counted by callgrind: repeatable to the instruction whatever else the machine is doing.
# The in-memory driver (examples/engine_calls.rs) runs N calls; callgrind collects only
# inside Engine::on_message and Engine::on_tick, so the driver's own message building is
# excluded.
#
#   bench/callgrind.sh [N=3000]
set -euo pipefail
N=${1:-3000}
cd "$(dirname "$0")/.."
cargo build --release --example engine_calls >/dev/null 2>&1
for mode in stateful stateless; do
  # Count only inside the engine's entry points (kept out of line with #[inline(never)]),
  # so the figure does not depend on what the optimiser inlines.
  total=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      --toggle-collect='*Engine::on_message*' --toggle-collect='*Engine::on_tick*' \
      target/release/examples/engine_calls "$mode" "$N" 2>&1 | awk '/Collected/ {print $4}')
  echo "$mode: $(( total / N )) instructions per call in the engine (INVITE..BYE through a record-routing proxy)"
done
