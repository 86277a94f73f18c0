#!/usr/bin/env bash
# The rolling upgrade from the previous release (tests/upgrade.rs): builds
# that release's binary from git history, starts a Pulsar standalone, runs
# the test against it, and stops the broker.
#
#   UPGRADE_FROM   the commit of the previous release (default: c982241, the
#                  last release before cluster levels)
#
# The build is kept in target/previous/<commit> and reused. It shares this
# tree's target directory, so the dependencies both releases use at the same
# versions are compiled once (on a clean clone after the tests, about a
# minute instead of seven on two cores). A clone without that commit (a
# shallow one) skips the test, saying so.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

from=${UPGRADE_FROM:-c982241}
cd "$root"
if ! commit=$(git rev-parse --verify --quiet "$from^{commit}"); then
  log "SKIPPED the upgrade test: commit $from is not in this clone (a shallow clone?); fetch the history to run it"
  exit 0
fi
short=${commit:0:12}
prev="$root/target/previous/$short"
bin="$prev/firstseen"
if [ ! -x "$bin" ]; then
  log "building the previous release ($short) into $prev"
  rm -rf "$prev/src"
  mkdir -p "$prev/src"
  git archive "$commit" | tar -x -C "$prev/src"
  # In this tree's target directory: the previous release's own crates get
  # artifacts of their own (their paths differ), the dependencies they share
  # with this tree are reused. Its binary lands where this tree's does, so
  # it is copied out, and this tree's is linked back in place.
  (cd "$prev/src" && CARGO_TARGET_DIR="$root/target" cargo build --locked --bin firstseen)
  cp "$root/target/debug/firstseen" "$bin.partial"
  mv "$bin.partial" "$bin"
  cargo build --bin firstseen
  if cmp -s "$bin" "$root/target/debug/firstseen"; then
    echo "target/debug/firstseen is still the previous release after rebuilding this tree" >&2
    exit 1
  fi
fi
log "previous release: $("$bin" --version 2>/dev/null || echo "$short")"

run_dir=$(mktemp -d -t firstseen-upgrade-XXXXXX)
cleanup() { "$here/pulsar.sh" stop "$run_dir/pulsar" || true; rm -rf "$run_dir"; }
trap cleanup EXIT
"$here/pulsar.sh" start "$run_dir/pulsar"
. "$run_dir/pulsar/env"
export FIRSTSEEN_TEST_PULSAR_URL="$PULSAR_URL"
export FIRSTSEEN_TEST_PULSAR_ADMIN_URL="$PULSAR_ADMIN_URL"
export FIRSTSEEN_REQUIRE_BROKERS=1
export FIRSTSEEN_PREVIOUS_BIN="$bin"
log "the rolling upgrade from $short to this tree"
cargo test --test upgrade -- --nocapture
