#!/usr/bin/env bash
# The test command: installs what is missing, starts one Apache Pulsar
# standalone shared by every test, runs the whole workspace's tests, and stops
# the broker. Tests start their own Mosquitto and firstseen processes on free
# ports. Then the nemesis's unit tests and a short seeded nemesis campaign
# (scripts/nemesis.sh: 4 minutes at 300 msg/s, a new seed each run, printed
# so a failure can be replayed). Extra arguments go to `cargo test` (e.g. a
# test name filter) and skip the campaign; FIRSTSEEN_NEMESIS=0 skips it too.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

"$here/setup.sh"
cd "$root"
log "building"
cargo build --workspace --all-targets

run_dir=$(mktemp -d -t firstseen-test-XXXXXX)
cleanup() { "$here/pulsar.sh" stop "$run_dir/pulsar" || true; rm -rf "$run_dir"; }
trap cleanup EXIT
"$here/pulsar.sh" start "$run_dir/pulsar"
. "$run_dir/pulsar/env"
export FIRSTSEEN_TEST_PULSAR_URL="$PULSAR_URL"
export FIRSTSEEN_TEST_PULSAR_ADMIN_URL="$PULSAR_ADMIN_URL"
# A missing broker fails the run instead of skipping tests.
export FIRSTSEEN_REQUIRE_BROKERS=1

log "running tests"
status=0
cargo test --workspace --no-fail-fast "$@" -- --test-threads="${FIRSTSEEN_TEST_THREADS:-2}" || status=$?
"$here/pulsar.sh" stop "$run_dir/pulsar" || true

log "nemesis unit tests (schedule, checker, broker-log tap)"
python3 -m unittest discover -s "$root/tests/nemesis" || status=1
log "benchmark report unit tests (bench/py)"
python3 -m unittest discover -s "$root/bench/py" || status=1

if [ $# -eq 0 ] && [ "${FIRSTSEEN_NEMESIS:-1}" != 0 ]; then
  log "a short nemesis campaign (docs/reliability.md)"
  "$here/nemesis.sh" --minutes "${FIRSTSEEN_NEMESIS_MINUTES:-4}" --rate 300 || status=1
fi
exit "$status"
