#!/usr/bin/env bash
# A nemesis campaign: a three-zone cluster under random, overlapping faults
# from a seeded schedule, checked by an independent checker against the
# history of what was published and acked (docs/reliability.md).
#
#   scripts/nemesis.sh                              short profile: 4 min at 300 msg/s, new seed
#   scripts/nemesis.sh --seed 1234                  replay a seed's fault schedule
#   scripts/nemesis.sh --profile soak --minutes 60 --rate 1000 --release --no-broker-log
#                                                   the hour-long soak (docs/reliability.md)
#
# Options (all optional): --seed N, --minutes M, --rate R, --profile short|soak|dense
# (dense: the old soak density, for replaying seeds found with it),
# --out DIR (default .nemesis/<seed>), --no-broker-log (do not read
# Mosquitto's debug log, for high rates), --release (optimised builds, for
# high rates), --zone-delay-ms N (N ms one way between the zones' peer links,
# through a relay per node: `firstseen-bench delay`, since this kernel has no
# netem). Exit 0 when the verdict is OK, 1
# when the checker found a violation, 2 when the campaign could not run.
# Everything it starts (Pulsar, Mosquitto, nodes, crashfs mounts, network
# namespaces, a bridge) it stops and removes, also on Ctrl-C.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

seed="" minutes=4 rate=300 profile=short out="" broker_log=1 build=debug zone_delay_ms=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --minutes) minutes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-broker-log) broker_log=0; shift ;;
    --release) build=release; shift ;;
    --zone-delay-ms) zone_delay_ms=$2; shift 2 ;;
    *) echo "unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$seed" ] || seed=$(python3 -c 'import random; print(random.SystemRandom().randrange(1 << 31))')
[ -n "$out" ] || out="$root/.nemesis/$seed"
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
[ -f "$data" ] || { log "capture not found: $data (set FIRSTSEEN_DATA)"; exit 2; }
[ "$(id -u)" = 0 ] || { log "the campaign makes network namespaces and mounts: run it as root"; exit 2; }

"$here/setup.sh"
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  log "installing matplotlib (the campaign's timeline plot)"
  python3 -m pip install -q --disable-pip-version-check "matplotlib==3.9.2"
fi
cd "$root"
log "building firstseen and firstseen-crashfs ($build)"
if [ "$build" = release ]; then
  cargo build -q --release -p firstseen --bin firstseen && cargo build -q --release -p firstseen-crashfs
  if [ "$zone_delay_ms" != 0 ]; then cargo build -q --release -p firstseen-bench; fi
else
  # The same command as scripts/test.sh's build, so that after it this is a
  # no-op (0.9 s): `-p firstseen` alone did not reuse that build and took
  # 8 min 15 s in a clean-clone CI run.
  cargo build -q --workspace --all-targets
fi
log "nemesis seed $seed: $profile profile, $minutes min at $rate msg/s; output in $out"
args=(--seed "$seed" --minutes "$minutes" --rate "$rate" --profile "$profile" --out "$out"
      --bin "$root/target/$build/firstseen" --crashfs "$root/target/$build/firstseen-crashfs"
      --template "$data")
[ "$broker_log" = 1 ] && args+=(--broker-log)
if [ "$zone_delay_ms" != 0 ]; then
  args+=(--zone-delay-ms "$zone_delay_ms" --delay-bin "$root/target/$build/firstseen-bench")
  # The nodes are told the distance as an operator would tell them
  # (cluster.round_trip_ms, here through the environment the campaign
  # passes on): there and back through two relays.
  export FIRSTSEEN__CLUSTER__ROUND_TRIP_MS="${FIRSTSEEN__CLUSTER__ROUND_TRIP_MS:-$((2 * zone_delay_ms))}"
fi
set +e
python3 "$root/tests/nemesis/campaign.py" "${args[@]}"
code=$?
set -e
if [ -f "$out/summary.json" ]; then
  log "summary: $out/summary.json; timeline: $out/timeline.png"
fi
if [ "$code" != 0 ]; then
  # What a CI log needs to tell a firstseen fault from a sick broker or a
  # full machine: the output directory is gone with the clean clone.
  log "disk space where the campaign ran:"; df -h "$out" >&2 || true
  for f in "$out"/node-*/node.log; do
    [ -f "$f" ] || continue
    log "last warnings and errors of $f:"
    grep -a -E ' (WARN|ERROR) ' "$f" | grep -v 'message will be ignored' | tail -25 >&2 || true
  done
  if [ -f "$out/pulsar/pulsar.log" ]; then
    log "last errors of Pulsar ($out/pulsar/pulsar.log):"
    grep -a -E ' ERROR |Exception:' "$out/pulsar/pulsar.log" | tail -25 | cut -c1-300 >&2 || true
  fi
  delay=""; [ "$zone_delay_ms" != 0 ] && delay=" --zone-delay-ms $zone_delay_ms"
  log "the campaign failed (exit $code); replay it with: scripts/nemesis.sh --seed $seed --minutes $minutes --rate $rate --profile $profile$delay"
fi
exit "$code"
