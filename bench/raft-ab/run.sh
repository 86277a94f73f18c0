#!/usr/bin/env bash
# openraft 0.9 vs 0.10 replication A/B: builds both harness binaries in
# release and runs the matrix, versions interleaved so that noise on this
# shared machine lands on both; prints one table at the end.
#
# Environment (defaults are the reported matrix):
#   SECS=20 WARMUP=5 ENTRY=2000   per-run window, warm-up, entry bytes
#   DELAYS="0 1 10" RATES="100 400 1600"
#   REPEATS=2                     passes over the 10 ms rows (the first is the matrix's)
#   SEARCH=1                      find each version's highest rate kept up at 10 ms
#   OUT=<file>                    where the JSON lines go (default under $CARGO_TARGET_DIR)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/raft-ab-target}"
SECS="${SECS:-20}"
WARMUP="${WARMUP:-5}"
ENTRY="${ENTRY:-2000}"
DELAYS="${DELAYS:-0 1 10}"
RATES="${RATES:-100 400 1600}"
REPEATS="${REPEATS:-2}"
SEARCH="${SEARCH:-1}"
OUT="${OUT:-$CARGO_TARGET_DIR/raft-ab-$(date +%Y%m%d-%H%M%S).jsonl}"

for v in v09 v10; do
    (cd "$here/$v" && cargo build --release --locked --quiet)
done
bin="$CARGO_TARGET_DIR/release"
mkdir -p "$(dirname "$OUT")"
: >"$OUT"

# run TAG BINARY DELAY RATE [--sequential]: one run, its JSON line tagged.
run() {
    local tag="$1" b="$2" d="$3" r="$4"
    shift 4
    local line load
    # The machine's 1-minute load average as the run starts (2 cores):
    # above ~2 the harness competes with other work for CPU.
    load="$(cut -d' ' -f1 /proc/loadavg)"
    line="$("$bin/raft-ab-$b" --delay-ms "$d" --rate "$r" --secs "$SECS" \
        --warmup-secs "$WARMUP" --entry-bytes "$ENTRY" "$@" 2>>"$OUT.stderr")"
    echo "{\"tag\":\"$tag\",\"load1\":$load,\"run\":$line}" >>"$OUT"
    echo "$tag $b $* delay=$d rate=$r: $line" >&2
    # The last field tells the caller whether the run kept up.
    [[ "$line" == *'"kept_up":true'* ]]
}

for d in $DELAYS; do
    for r in $RATES; do
        run matrix v09 "$d" "$r" || true
        run matrix v10 "$d" "$r" || true
        if [[ "$d" == 10 ]]; then
            run matrix v10 "$d" "$r" --sequential || true
        fi
    done
done

for ((rep = 2; rep <= REPEATS; rep++)); do
    for r in $RATES; do
        run "repeat$rep" v09 10 "$r" || true
        run "repeat$rep" v10 10 "$r" || true
        run "repeat$rep" v10 10 "$r" --sequential || true
    done
done

if [[ "$SEARCH" == 1 ]]; then
    # Double from 400 until a run falls behind, the three variants in turn.
    up09=1 up10=1 up10s=1
    for r in 400 800 1600 3200 6400 12800; do
        ((up09 || up10 || up10s)) || break
        if ((up09)); then run search v09 10 "$r" || up09=0; fi
        if ((up10)); then run search v10 10 "$r" || up10=0; fi
        if ((up10s)); then run search v10 10 "$r" --sequential || up10s=0; fi
    done
fi

python3 "$here/table.py" "$OUT"
echo "JSON lines: $OUT" >&2
