#!/usr/bin/env bash
# The test command: installs what is missing, starts one Apache Pulsar
# standalone shared by every test, runs the whole workspace's tests, and stops
# the broker. Tests start their own Mosquitto and firstseen processes on free
# ports. Extra arguments go to `cargo test` (e.g. a test name filter).
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
cargo test --workspace --no-fail-fast "$@" -- --test-threads="${FIRSTSEEN_TEST_THREADS:-2}"
