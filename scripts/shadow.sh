#!/usr/bin/env bash
# A shadow run, on this machine: the pipeline HSL runs today beside a
# three-zone firstseen cluster, on the same Mosquitto and the same feed, and
# `firstseen compare` on what each wrote. The guide it belongs to is
# docs/migrating-from-transitdata.md.
#
# The old pipeline is a stand-in (tests/tools/transitdata_standin.py): two
# gateways wrapping every message in the transitdata envelope into one topic,
# and a deduplicator with a bounded in-memory cache that a restart forgets.
# firstseen writes the same envelope (routes[].format = "transitdata").
#
# Mid-run, as a bad afternoon would have it: one gateway is killed (and
# started again later), the deduplicator crashes and restarts, the MQTT broker
# restarts, and the firstseen leader is killed and restarted.
#
#   scripts/shadow.sh              run, print the comparison, stop everything
#   SHADOW_PASSES=N scripts/shadow.sh   N passes of the capture (default 8),
#                                  each later in time, at SHADOW_RATE msg/s
#                                  (default 500)
#
# State lives in .shadow/ (removed at the start of each run).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
[ -f "$data" ] || { log "capture not found: $data (set FIRSTSEEN_DATA)"; exit 1; }
passes=${SHADOW_PASSES:-8}
rate=${SHADOW_RATE:-500}

"$here/setup.sh"
cd "$root"
log "building firstseen"
cargo build -q --bin firstseen
bin="$root/target/debug/firstseen"
standin="$root/tests/tools/transitdata_standin.py"

dir="$root/.shadow"
stop_pid_file "$dir/pids" || true
[ -d "$dir/pulsar" ] && "$here/pulsar.sh" stop "$dir/pulsar" || true
rm -rf "$dir"; mkdir -p "$dir"
stop_all() {
  stop_pid_file "$dir/pids" || true
  "$here/pulsar.sh" stop "$dir/pulsar" || true
}
# SHADOW_KEEP=1 leaves Pulsar running afterwards, to read the topics.
if [ "${SHADOW_KEEP:-0}" != 1 ]; then trap stop_all EXIT; else trap 'stop_pid_file "$dir/pids" || true' EXIT; fi

"$here/pulsar.sh" start "$dir/pulsar"
. "$dir/pulsar/env"
start_mosquitto "$dir/mosquitto" "$dir/pids"
mosquitto_pid=$(tail -n 1 "$dir/pids")
log "Mosquitto listening on 127.0.0.1:$mqtt_port"

run_id=$(date +%s)
gateways="persistent://public/default/shadow-gateways-$run_id"
old="persistent://public/default/shadow-old-$run_id"
new="persistent://public/default/shadow-firstseen-$run_id"
filter="/hfp/v1/#"

ROUTE_FORMAT=transitdata start_cluster "$dir" "$bin" "$mqtt_port" "$filter" "$new" "$dir/pids"
leader=$(curl -fsS "http://127.0.0.1:${http[1]}/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
log "firstseen: three nodes ready, node $leader leads, writing transitdata envelopes to $new"

# Starts a stand-in in the background; its pid in the named file and in pids.
spawn() {
  local name=$1; shift
  python3 "$standin" "$@" >> "$dir/$name.log" 2>&1 &
  echo $! > "$dir/$name.pid"
  echo $! >> "$dir/pids"
}
gateway() {
  spawn "gateway-$1" gateway --url "$PULSAR_URL" --topic "$gateways" \
    --mqtt-port "$mqtt_port" --filter "$filter" --client-id "gateway-$1"
}
dedup() {
  spawn dedup dedup --url "$PULSAR_URL" --source "$gateways" --sink "$old"
}
gateway a; gateway b; dedup
# The gateways are subscribed once their MQTT session is up.
sleep 3
log "old pipeline: gateways a and b into $gateways, the deduplicator into $old"

total=$(( passes * 5000 ))
log "replaying $(basename "$data") $passes times at $rate msg/s (~$(( total / rate )) s), each pass later in time"
python3 "$root/tests/tools/replay.py" --file "$data" --port "$mqtt_port" --times "$passes" \
  --later-passes --pace "$rate" > "$dir/replay.json" &
replay=$!
echo $replay >> "$dir/pids"
at() { # waits until $1 seconds into the replay
  local due=$(( start + $1 ))
  while [ "$(date +%s)" -lt "$due" ] && kill -0 "$replay" 2>/dev/null; do sleep 0.2; done
}
start=$(date +%s)
span=$(( total / rate ))
at $(( span * 15 / 100 )); log "fault: gateway b killed (SIGKILL)"; kill -9 "$(cat "$dir/gateway-b.pid")"
at $(( span * 30 / 100 )); log "gateway b started again"; gateway b
at $(( span * 40 / 100 )); log "fault: the deduplicator crashes (SIGKILL) and restarts with an empty cache"
kill -9 "$(cat "$dir/dedup.pid")"; sleep 1; dedup
at $(( span * 55 / 100 )); log "fault: the MQTT broker restarts (its persistent sessions kept on disk)"
stop_pids "$mosquitto_pid"
mosquitto -c "$dir/mosquitto/mosquitto.conf" >> "$dir/mosquitto/log" 2>&1 &
mosquitto_pid=$!; echo $mosquitto_pid >> "$dir/pids"
wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$mqtt_port"
at $(( span * 70 / 100 ))
leader=$(curl -fsS "http://127.0.0.1:${http[1]}/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
log "fault: the firstseen leader, node $leader, killed (SIGKILL)"
kill -9 "$(cat "$dir/node-$leader.pid")"
at $(( span * 85 / 100 ))
log "node $leader started again"
"$bin" run --config "$dir/node-$leader.toml" >> "$dir/node-$leader.log" 2>&1 &
echo $! >> "$dir/pids"; echo $! > "$dir/node-$leader.pid"
wait "$replay"
log "replay done: $(cat "$dir/replay.json")"

other=1; [ "$leader" = 1 ] && other=2
until curl -fsS "http://127.0.0.1:${http[$other]}/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s["topics"] and all(t["backlog"]==0 for t in s["topics"]) else 1)'; do sleep 0.5; done
log "firstseen has published everything; letting the old pipeline drain"
sleep 10
for p in gateway-a gateway-b dedup; do stop_pids "$(cat "$dir/$p.pid")"; done
cat "$dir"/gateway-*.log "$dir"/dedup.log >&2

echo
log "firstseen compare: the old pipeline's topic beside firstseen's"
set +e
"$bin" compare --pulsar-url "$PULSAR_URL" --a "$old" --a-name old-pipeline \
  --b "$new" --b-name firstseen --margin-secs 5 | tee "$dir/compare.txt"
code=$?
set -e
echo
log "firstseen verify on firstseen's topic (every key again from inside its envelope)"
"$bin" verify --pulsar-url "$PULSAR_URL" --topic "$new" --secret-file "$dir/cluster.secret" --key topic+payload \
  --expect "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["distinct"])' "$dir/replay.json")" \
  | tee "$dir/verify.txt"
log "compare exit code $code (1: the topics differ); state in .shadow/"
