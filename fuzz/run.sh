#!/usr/bin/env bash
# Runs each fuzz target for SECONDS (default 30) with its corpus: what CI does briefly, and how
# to run long (README.md, "Fuzzing"). Needs cargo-fuzz (`cargo install cargo-fuzz`); stable
# Rust is enough, as no sanitizer is used.
#
#   fuzz/run.sh [SECONDS] [TARGET...]      targets: parser framing digest proxychain engine identity
#
# Corpora grow in fuzz/corpus/TARGET (not committed); the parser and framing start from the
# RFC 4475 torture messages, digest, proxychain and identity from fuzz/seeds/. A crash stops the run
# with the input in fuzz/artifacts/TARGET/; `cargo fuzz run --sanitizer none -O -a TARGET
# FILE` replays it.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(parser framing digest proxychain engine identity); fi
torture=../testdata/rfc4475
if [ ! -d "$torture" ]; then
  echo "fuzz/run.sh: $torture (the RFC 4475 messages) is missing" >&2
  exit 1
fi
# -O: optimised; -a: with debug assertions, so arithmetic overflow is a crash too.
flags=(--sanitizer none -O -a)
cargo fuzz build "${flags[@]}"
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  case $t in
    parser | framing) seeds=("$torture") ;;
    digest | proxychain | identity) seeds=("seeds/$t") ;;
    *) seeds=() ;;
  esac
  echo "fuzz/run.sh: $t for ${secs}s"
  log="corpus/$t.log"
  if ! cargo fuzz run "${flags[@]}" "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1; then
    grep -E -A12 'panicked|SUMMARY' "$log" >&2 || tail -n 30 "$log" >&2
    echo "fuzz/run.sh: $t failed; the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' "$log"
done
