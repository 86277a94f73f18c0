#!/usr/bin/env bash
# The main job, on this machine: installs what is missing, starts Mosquitto,
# Apache Pulsar standalone and a three-zone firstseen cluster, replays the real HSL capture
# (../shared/data/hfp-5000.txt) twice with extra upstream duplicates, shows
# the deduplication live, and audits the Pulsar topic with `firstseen verify`.
#
#   scripts/demo.sh            run, print the result, stop everything
#   scripts/demo.sh --keep     leave the brokers and nodes running afterwards
#
# State lives in .demo/ (removed at the start of each run).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"
keep=0; [ "${1:-}" = "--keep" ] && keep=1
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
[ -f "$data" ] || { log "capture not found: $data (set FIRSTSEEN_DATA)"; exit 1; }

"$here/setup.sh"
cd "$root"
log "building firstseen"
cargo build -q --bin firstseen
bin="$root/target/debug/firstseen"

demo="$root/.demo"
stop_pid_file "$demo/pids" || true
[ -d "$demo/pulsar" ] && "$here/pulsar.sh" stop "$demo/pulsar" || true
rm -rf "$demo"; mkdir -p "$demo"
stop_all() {
  # Every node stops within its shutdown bound; one that does not is
  # killed, and the log says so.
  stop_pid_file "$demo/pids" || true
  "$here/pulsar.sh" stop "$demo/pulsar" || true
}
if [ "$keep" = 0 ]; then trap stop_all EXIT; fi

"$here/pulsar.sh" start "$demo/pulsar"
. "$demo/pulsar/env"

start_mosquitto "$demo/mosquitto" "$demo/pids"
log "Mosquitto listening on 127.0.0.1:$mqtt_port"
topic="persistent://public/default/hfp-demo"
start_cluster "$demo" "$bin" "$mqtt_port" "/hfp/v1/#" "$topic" "$demo/pids"
http_port=${http[1]}
leader=$(curl -fsS "http://127.0.0.1:$http_port/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')
log "three nodes ready in zones ${zones[*]}; node $leader leads; APIs on 127.0.0.1:${http[1]}, :${http[2]}, :${http[3]}"

log "replaying $(basename "$data") twice at its recorded pace (~1,500 msg/s), every 10th message sent twice more; every zone receives every copy"
python3 "$root/tests/tools/replay.py" --file "$data" --port "$mqtt_port" --times 2 --dup-every 10 > "$demo/replay.json" &
replay=$!
show() { "$bin" status --brief --url "http://127.0.0.1:$http_port" || true; }
while kill -0 "$replay" 2>/dev/null; do show; sleep 1; done
wait "$replay"
log "replay done: $(cat "$demo/replay.json")"
distinct=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["distinct"])' "$demo/replay.json")
until curl -fsS "http://127.0.0.1:$http_port/status" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if all(t["backlog"]==0 for t in s["topics"]) else 1)'; do sleep 0.5; done
show
echo
"$bin" status --url "http://127.0.0.1:$http_port"
echo
log "auditing $topic with firstseen verify (expecting $distinct messages)"
"$bin" verify --pulsar-url "$PULSAR_URL" --topic "$topic" --secret-file "$demo/cluster.secret" --expect "$distinct"
if [ "$keep" = 1 ]; then
  log "left running: Pulsar $PULSAR_URL, Mosquitto 127.0.0.1:$mqtt_port, node APIs on 127.0.0.1:${http[1]}, :${http[2]}, :${http[3]} (state in .demo/)"
fi
