#!/usr/bin/env bash
# Instructions per call and per REGISTER spent in the engine (parser, transactions, proxy and
# registrar logic; no sockets), counted by callgrind: repeatable to the instruction whatever
# else the machine is doing. The in-memory drivers (examples/engine_calls.rs,
# examples/engine_registers.rs) run N of each; callgrind collects only inside
# Engine::handle_message and Engine::handle_timeout, so the drivers' own message building is
# excluded.
#
#   scripts/callgrind.sh [N=3000]
set -euo pipefail
N=${1:-3000}
cd "$(dirname "$0")/.."
cargo build --release --example engine_calls >/dev/null 2>&1
for mode in stateful stateless; do
  # Count only inside the engine's entry points (kept out of line with #[inline(never)]),
  # so the figure does not depend on what the optimiser inlines.
  total=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      --toggle-collect='*Engine::handle_message*' --toggle-collect='*Engine::handle_timeout*' \
      target/release/examples/engine_calls "$mode" "$N" 2>&1 | awk '/Collected/ {print $4}')
  echo "$mode: $(( total / N )) instructions per call in the engine (INVITE..BYE through a record-routing proxy)"
done
# Registrations: 1,000 users refreshing (examples/engine_registers.rs), store writes excluded.
cargo build --release --example engine_registers >/dev/null 2>&1
total=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    --toggle-collect='*Engine::handle_message*' --toggle-collect='*Engine::handle_timeout*' \
    target/release/examples/engine_registers "$N" 2>&1 | awk '/Collected/ {print $4}')
echo "register: $(( total / N )) instructions per REGISTER in the engine (1,000 users refreshing)"
