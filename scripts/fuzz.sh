#!/usr/bin/env bash
# Fuzzes every decoder of bytes from the network or the disk, each for a
# bounded time, with libFuzzer through cargo-fuzz (fuzz/, docs/operations.md):
#
#   scripts/fuzz.sh                 every target, 60 s each
#   scripts/fuzz.sh peer_frame      one target
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#   FUZZ_JOBS=1 scripts/fuzz.sh     one target at a time (default: one per core)
#   FUZZ_DEV=1 scripts/fuzz.sh      targets built without optimisation (CI):
#                                   about three minutes of build instead of
#                                   eight on two cores, fewer runs per second,
#                                   and overflow checks on
#
# Targets: peer_frame (frame header and bincode body of peer requests and
# replies), handshake (both sides of the peer handshake, fed forged messages),
# stored (what a node reads back from its disk: Raft log entries, vote,
# purge and commit points, outbox messages, the applied marker,
# current.meta, guard slots), window_record (varints,
# window records, masks, outbox runs), snapshot_import (a snapshot stream into
# a fresh state database), config (config text and an environment override),
# json_key (the JSON-field dedup key on any payload).
# Each starts from its seeds in fuzz/corpus/<target>; what it learns goes to a
# temporary directory, so the repository is not touched. A crash leaves its
# input in fuzz/artifacts/<target>/ and fails the run (exit 1); replay it with
# `cargo fuzz run -s none --fuzz-dir fuzz <target> <file>`.
#
# cargo-fuzz wants a nightly compiler for its sanitizer flags. These machines
# have only stable Rust, so it runs with `-s none` (libFuzzer's coverage
# guidance, no AddressSanitizer: safe Rust needs it little) and
# RUSTC_BOOTSTRAP=1, which lets the stable compiler take the `-Z` flags
# cargo-fuzz passes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

seconds=${FUZZ_SECONDS:-60}
profile=()
[ -z "${FUZZ_DEV:-}" ] || profile=(--dev)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(peer_frame handshake stored window_record snapshot_import config json_key)

if ! cargo fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz (first run only)"
  cargo install -q --locked cargo-fuzz --version 0.13.2
fi
command -v protoc >/dev/null || "$here/setup.sh"
export RUSTC_BOOTSTRAP=1
cd "$root"
log "building the fuzz targets"
cargo fuzz build -s none "${profile[@]}" --fuzz-dir fuzz
work=$(mktemp -d -t firstseen-fuzz-XXXXXX)
trap 'rm -rf "$work"' EXIT
# One target per core at a time: each libFuzzer run is one process, so on
# CI's two cores two targets run in the time of one, with the same fuzzing
# each.
jobs=${FUZZ_JOBS:-$(nproc)}
fuzz_one() {
  local t=$1
  mkdir -p "$work/$t" "fuzz/artifacts/$t"
  # -rss_limit_mb: an input that makes a decoder allocate without bound is
  # a finding, not an out-of-memory machine.
  if cargo fuzz run -s none "${profile[@]}" --fuzz-dir fuzz "$t" "$work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="fuzz/artifacts/$t/" >"$work/$t.log" 2>&1; then
    echo ok > "$work/$t.result"
  else
    echo failed > "$work/$t.result"
  fi
}
running=0
for t in "${targets[@]}"; do
  log "fuzzing $t for ${seconds}s"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
status=0
for t in "${targets[@]}"; do
  if [ "$(cat "$work/$t.result" 2>/dev/null)" != ok ]; then
    log "$t FAILED; the last lines of its log:"
    tail -40 "$work/$t.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/$t.log" \
      | sed "s/^/[$t] /" || true
  fi
done
[ "$status" = 0 ] && log "fuzzing found nothing in ${#targets[@]} target(s), ${seconds}s each"
exit "$status"
