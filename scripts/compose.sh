#!/usr/bin/env bash
# Runs deploy/compose/docker-compose.yml for real with podman-compose and
# audits it the way an operator would (docs/operations.md, "Containers"):
#
#   1. brings up Mosquitto, Pulsar and three firstseen nodes, each in its own
#      container, from the images scripts/images.sh built;
#   2. checks every container: each node's compose health check passes, the
#      node runs as a non-root user on a read-only root filesystem, and the
#      three elect a leader;
#   3. replays the HSL capture into Mosquitto, kills one node's container
#      mid-replay and starts it again;
#   4. reads the topic back from the host with the official Python client
#      (counted per key) and runs `firstseen verify` in a node's container:
#      exactly one copy per key, or it fails;
#   5. stops and removes everything it started, volumes included (also on
#      Ctrl-C); --keep leaves the cluster running and prints how to stop it.
#
#   scripts/compose.sh [--keep]
#
# Published ports are free ones taken at start and bound to 127.0.0.1, and
# the project name is new each run, so an operator's own compose project is
# never touched. Exit 0 when the audit is clean, 1 when it is not.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

keep=0
[ "${1:-}" = --keep ] && keep=1
eval "$("$here/images.sh" env)"
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
[ -f "$data" ] || { log "capture not found: $data (set FIRSTSEEN_DATA)"; exit 2; }
pulsar_version=$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$here/pulsar/pom.xml")
export MOSQUITTO_IMAGE=localhost/firstseen/mosquitto:2
export PULSAR_IMAGE=localhost/firstseen/pulsar:$pulsar_version
for image in "$MOSQUITTO_IMAGE" "$PULSAR_IMAGE" localhost/firstseen:latest; do
  podman image exists "$image" || { log "image $image is missing: run scripts/images.sh first"; exit 2; }
done
"$here/setup.sh" >/dev/null
# The cluster secret and the peers' TLS material are made here, once, never
# shipped: a secret every clone shares is no secret (firstseen refuses the
# old placeholders), and a CA whose key is public vouches for anyone.
secrets="$root/deploy/compose/secrets"
if [ ! -s "$secrets/node-3.key" ] || [ ! -s "$secrets/cluster.secret" ]; then
  # Made by this user, so that make-secrets can read what it already made.
  if [ -d "$secrets" ] && [ "$(id -u)" != 0 ]; then podman unshare chown -R 0:0 "$secrets"; fi
  "$root/deploy/make-secrets.sh" "$secrets" 3 >/dev/null
  log "made a new cluster secret and TLS material in $secrets"
fi
# Compose mounts a file secret as it is on the host, and the node reads it as
# uid 10001 (deploy/Dockerfile): a key only its maker may read stops every
# node at start ("Permission denied"). So the files go to that uid, still
# readable by nobody else: as root, 10001 is the container's own uid;
# rootless, `podman unshare` maps it.
if [ "$(id -u)" = 0 ]; then
  chown -R 10001:10001 "$secrets"
else
  podman unshare chown -R 10001:10001 "$secrets"
fi

MQTT_PORT=$(free_port); PULSAR_PORT=$(free_port); PULSAR_WEB_PORT=$(free_port)
NODE1_PORT=$(free_port); NODE2_PORT=$(free_port); NODE3_PORT=$(free_port)
export MQTT_PORT PULSAR_PORT PULSAR_WEB_PORT NODE1_PORT NODE2_PORT NODE3_PORT
project="firstseen-check-$(date +%s)"
compose=(podman-compose --podman-run-args=--pull=never -p "$project" -f "$root/deploy/compose/docker-compose.yml")
topic=persistent://public/default/hfp
node_ports=("$NODE1_PORT" "$NODE2_PORT" "$NODE3_PORT")
out="$root/.compose/$project"
mkdir -p "$out"

container() { podman ps -a --filter "label=io.podman.compose.project=$project" \
  --filter "label=com.docker.compose.service=$1" --format '{{.Names}}' | head -1; }

down() {
  if [ "$keep" = 1 ]; then
    log "left running: stop it with: CONTAINERS_CONF=$CONTAINERS_CONF podman-compose -p $project -f $root/deploy/compose/docker-compose.yml down -v"
    return
  fi
  log "stopping the compose project $project (containers, network and volumes)"
  for s in firstseen-1 firstseen-2 firstseen-3 pulsar mosquitto; do
    c=$(container "$s"); [ -n "$c" ] && podman logs "$c" > "$out/$s.log" 2>&1 || true
  done
  "${compose[@]}" down -v -t 15 >"$out/down.log" 2>&1 || log "podman-compose down failed; see $out/down.log"
  # podman-compose 1.2 leaves the project's network behind.
  podman network rm -f "${project}_default" >>"$out/down.log" 2>&1 || true
}
trap down EXIT
trap 'exit 130' INT TERM

t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }

log "starting project $project: MQTT 127.0.0.1:$MQTT_PORT, Pulsar 127.0.0.1:$PULSAR_PORT, nodes on 127.0.0.1:${node_ports[*]}"
"${compose[@]}" up -d --no-build >"$out/up.log" 2>&1 || { log "podman-compose up failed:"; tail -30 "$out/up.log" >&2; exit 1; }
log "containers created in $(since)"

node_up() { curl -fsS "http://127.0.0.1:$1/readyz" >/dev/null; }
for p in "${node_ports[@]}"; do
  wait_for 240 node_up "$p" || { log "the node on port $p did not become ready"; exit 1; }
done
log "all three nodes ready $(since) after start"

fail=0
check() { if "$@"; then :; else log "FAILED: $*"; fail=1; fi; }
for i in 1 2 3; do
  c=$(container "firstseen-$i")
  # The compose file's own health check, run the way the engine runs it.
  check podman healthcheck run "$c"
  uid=$(podman exec "$c" id -u)
  [ "$uid" != 0 ] || { log "FAILED: firstseen-$i runs as root"; fail=1; }
  ro=$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$c")
  [ "$ro" = true ] || { log "FAILED: firstseen-$i has a writable root filesystem"; fail=1; }
  if podman exec "$c" sh -c 'touch /probe' 2>/dev/null; then
    log "FAILED: firstseen-$i could write to its root filesystem"; fail=1
  fi
  log "firstseen-$i: health check passed, uid $uid, read-only root $ro"
done
leader=$(curl -fsS "http://127.0.0.1:$NODE1_PORT/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"] or "")')
[ -n "$leader" ] || { log "FAILED: no leader"; exit 1; }
log "leader: node $leader"

# Replay at a steady pace so the kill lands mid-replay; kill a follower
# (a leader kill is the other tests' business, and both are covered there).
victim=$(( leader % 3 + 1 ))
log "replaying $data into Mosquitto; node $victim's container is killed mid-replay"
python3 "$root/tests/tools/replay.py" --file "$data" --port "$MQTT_PORT" --pace 500 > "$out/replay.json" &
replay=$!
# Kill once the group holds part of the capture (not after a fixed sleep),
# and fail if the replay had already ended: the kill must land mid-replay.
some_keys() {
  curl -fsS "http://127.0.0.1:${node_ports[$((leader - 1))]}/status" | python3 -c '
import json, sys
sys.exit(0 if json.load(sys.stdin)["totals"]["window_keys"] >= 1000 else 1)'
}
wait_for 60 some_keys || { log "FAILED: the leader took no part of the replay in 60 s"; exit 1; }
vc=$(container "firstseen-$victim")
podman kill "$vc" >/dev/null
kill -0 "$replay" 2>/dev/null || { log "FAILED: the replay ended before the kill"; exit 1; }
log "killed $vc with $(curl -fsS "http://127.0.0.1:${node_ports[$((leader - 1))]}/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["window_keys"])') keys in the window"
# Down for a few seconds, as a crashed container before its restart policy
# brings it back; the replay goes on meanwhile.
sleep 3
# podman says it cannot schedule health checks without systemd; the
# script runs them itself, above and below.
podman start "$vc" >/dev/null 2>"$out/start.log"
log "started $vc again"
wait "$replay"
distinct=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["distinct"])' "$out/replay.json")
wait_for 120 node_up "${node_ports[$((victim - 1))]}" || { log "FAILED: node $victim did not come back ready"; fail=1; }
check podman healthcheck run "$vc"

# Published: every key in the leader's window and its outbox empty.
published() {
  curl -fsS "http://127.0.0.1:${node_ports[$((leader - 1))]}/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)["totals"]
sys.exit(0 if s["window_keys"] >= int(sys.argv[1]) and s["outbox_messages"] == 0 else 1)' "$distinct"
}
if ! wait_for 180 published; then
  log "the leader's outbox did not drain in 180 s; auditing what is there"
  # Say why, so that a failed run names its cause: the leader's own reason,
  # and what Pulsar last complained of (a bookie that went read-only on a
  # nearly full disk, for one, stops every write).
  curl -fsS "http://127.0.0.1:${node_ports[$((leader - 1))]}/status" | python3 -c '
import json, sys
print("leader not ready:", json.load(sys.stdin).get("not_ready_reason"))' >&2 || true
  pc=$(container pulsar)
  [ -n "$pc" ] && podman logs "$pc" 2>&1 | grep -E " ERROR " | tail -3 >&2 || true
fi
log "replay published and drained $(since) after start"

python3 "$root/tests/tools/pulsar_read.py" --url "pulsar://127.0.0.1:$PULSAR_PORT" --listener external \
  --topic "$topic" > "$out/read.json"
python3 - "$out/read.json" "$distinct" <<'PY' || fail=1
import json, sys
r = json.load(open(sys.argv[1])); want = int(sys.argv[2])
ok = r["count"] == want and r["distinct_keys"] == want and r["keys_with_copies"] == 0
print(f"official client: {r['count']} messages, {r['distinct_keys']} keys, "
      f"{r['keys_with_copies']} keys with copies; the replay had {want} distinct: "
      f"{'exactly once' if ok else 'NOT exactly once'}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
c1=$(container firstseen-1)
if podman exec "$c1" firstseen verify --config /etc/firstseen/firstseen.toml --expect "$distinct" --idle-secs 10 > "$out/verify.txt" 2>&1; then
  log "firstseen verify (in $c1): $(grep -E '^(messages|duplicates|gaps|verdict) ' "$out/verify.txt" | tr -s ' ' | paste -sd ';' -)"
else
  log "FAILED: firstseen verify:"; cat "$out/verify.txt" >&2; fail=1
fi
if [ "$fail" = 0 ]; then
  log "compose audit: exactly once through a node kill, $(since) in all; output in $out"
else
  log "compose audit FAILED; output in $out"
fi
exit "$fail"
