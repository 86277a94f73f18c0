#!/usr/bin/env bash
# firstseen's benchmark: one command, one machine, every figure from the
# same run (docs/benchmarks.md explains them). Writes bench-results/result.json
# and prints a table.
#
#   scripts/bench.sh                 default profiles (a few minutes)
#   BENCH_PEAK_SECS=60 BENCH_STEPS="2000 4000 8000" scripts/bench.sh
#
# Profiles:
#   peak       the HSL peak: 2,000 msg/s of synthetic HFP for BENCH_PEAK_SECS, every
#              node ingesting the whole feed, 5% upstream duplicates on top
#   sustained  rising rates (BENCH_STEPS); the highest one the cluster keeps up
#              with: every message in Pulsar within BENCH_SLACK_SECS of the load's
#              end, and p99 latency under 1 s
#   naive      baseline (a): three forwarders without Raft or dedup, same steps
#   fanout     baseline (b): Mosquitto's delivery rate to three plain subscribers
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
peak_secs=${BENCH_PEAK_SECS:-30}
steps=${BENCH_STEPS:-"2000 4000 6000 8000 10000"}
step_secs=${BENCH_STEP_SECS:-10}
slack=${BENCH_SLACK_SECS:-5}

"$here/setup.sh"
cd "$root"
log "building release binaries"
cargo build -q --release -p firstseen -p firstseen-bench
fs="$root/target/release/firstseen"
bench="$root/target/release/firstseen-bench"

work="$root/.bench"
rm -rf "$work"; mkdir -p "$work" "$root/bench-results"
cleanup() {
  [ -f "$work/pids" ] && xargs -r kill < "$work/pids" 2>/dev/null || true
  "$here/pulsar.sh" stop "$work/pulsar" || true
}
trap cleanup EXIT
"$here/pulsar.sh" start "$work/pulsar"
. "$work/pulsar/env"
start_mosquitto "$work/mosquitto" "$work/pids"
run=$(date +%s)

cpu_secs() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
peak_rss_mb() { awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# One step: load at $1 msg/s for $2 s into topic routed by the running
# setup; the probe reads topic $3 expecting every unique message. Prints the
# probe's JSON; the step is sustained if the probe finished within the slack.
step() {
  local rate=$1 secs=$2 topic=$3 id=$4
  local expect=$((rate * secs))
  "$bench" probe --pulsar "$PULSAR_URL" --topic "$topic" --expect "$expect" --idle-secs $((slack + 5)) --run "$id" > "$work/probe-$id.json" &
  local probe=$!
  # The probe reads from the latest message on: wait for its subscription.
  wait_for 30 bash -c "curl -fsS '$PULSAR_ADMIN_URL/admin/v2/persistent/${topic#persistent://}/stats' | grep -q bench-probe"
  "$bench" load --port "$mqtt_port" --template "$data" --rate "$rate" --secs "$secs" --dup-every 20 --run "$id" > "$work/load-$id.json"
  wait "$probe"
  python3 - "$work/load-$id.json" "$work/probe-$id.json" "$secs" "$slack" <<'PY'
import json, sys
load = json.load(open(sys.argv[1])); probe = json.load(open(sys.argv[2]))
secs, slack = float(sys.argv[3]), float(sys.argv[4])
# Keeping up: every message arrives, the last within the slack after the
# load ends, and p99 latency stays under a second (no queue building up).
kept_up = (probe["unique"] == probe["expected"] and probe["secs"] <= secs + 1 + slack
           and (probe["latency_ms"]["p99"] or 1e9) < 1000)
print(json.dumps({"load": load, "probe": probe, "kept_up": kept_up}))
PY
}

log "cluster: three nodes in three zones"
topic="persistent://public/default/bench-$run"
start_cluster "$work" "$fs" "$mqtt_port" "/hfp/#" "$topic" "$work/pids"
for i in 1 2 3; do cpu0[$i]=$(cpu_secs "$(cat "$work/node-$i.pid")"); done

log "profile peak: 2000 msg/s for ${peak_secs}s"
peak=$(step 2000 "$peak_secs" "$topic" "$run-peak")
for i in 1 2 3; do
  pid=$(cat "$work/node-$i.pid")
  cpu[$i]=$(python3 -c "print(round($(cpu_secs "$pid") - ${cpu0[$i]}, 2))")
  rss[$i]=$(peak_rss_mb "$pid")
done
status=$(curl -fsS "http://127.0.0.1:${http[1]}/status")
echo "$peak" > "$work/peak.json"; echo "$status" > "$work/status.json"

log "profile sustained: steps $steps (${step_secs}s each)"
: > "$work/sustained.jsonl"
for rate in $steps; do
  r=$(step "$rate" "$step_secs" "$topic" "$run-s$rate")
  echo "$r" >> "$work/sustained.jsonl"
  log "  $rate msg/s: $(echo "$r" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("kept up" if d["kept_up"] else "fell behind", "p99", round(d["probe"]["latency_ms"]["p99"],1), "ms")')"
done

log "stopping the cluster for the baselines"
for i in 1 2 3; do kill "$(cat "$work/node-$i.pid")" 2>/dev/null || true; done
for i in 1 2 3; do wait_for 60 bash -c "! kill -0 $(cat "$work/node-$i.pid") 2>/dev/null"; done

log "baseline naive: three forwarders without Raft or dedup"
ntopic="persistent://public/default/bench-naive-$run"
naive_pids=()
for i in 1 2 3; do
  "$bench" naive --port "$mqtt_port" --client-id "naive-$i-$run" --pulsar "$PULSAR_URL" --topic "$ntopic" > "$work/naive-$i.log" 2>&1 &
  echo $! >> "$work/pids"
  naive_pids+=($!)
done
sleep 3
: > "$work/naive.jsonl"
for rate in $steps; do
  r=$(step "$rate" "$step_secs" "$ntopic" "$run-n$rate")
  echo "$r" >> "$work/naive.jsonl"
  log "  $rate msg/s: $(echo "$r" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("kept up" if d["kept_up"] else "fell behind", "copies/msg", round(d["probe"]["copies_per_message"],2))')"
done

for pid in "${naive_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
log "baseline fanout: Mosquitto to three subscribers (nothing else subscribed)"
"$bench" fanout --port "$mqtt_port" --subs 3 --count 100000 > "$work/fanout.json"

python3 - "$work" "$peak_secs" "$root/bench-results/result.json" "${cpu[1]}" "${cpu[2]}" "${cpu[3]}" "${rss[1]}" "${rss[2]}" "${rss[3]}" <<'PY'
import json, os, platform, sys
work, peak_secs, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
cpu = [float(x) for x in sys.argv[4:7]]; rss = [float(x) for x in sys.argv[7:10]]
peak = json.load(open(f"{work}/peak.json")); status = json.load(open(f"{work}/status.json"))
sus = [json.loads(l) for l in open(f"{work}/sustained.jsonl")]
naive = [json.loads(l) for l in open(f"{work}/naive.jsonl")]
fan = json.load(open(f"{work}/fanout.json"))
best = lambda rows: max([r["load"]["unique"] / r["load"]["secs"] for r in rows if r["kept_up"]] or [0])
keys = status["totals"]["window_keys"]
result = {
  "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
  "peak": {
    "rate": 2000, "secs": peak_secs,
    "latency_ms": peak["probe"]["latency_ms"],
    "exactly_once": peak["probe"]["verify_clean"] and peak["probe"]["unique"] == peak["probe"]["expected"],
    "copies_per_message": peak["probe"]["copies_per_message"],
    "cpu_seconds_per_node": cpu, "cpu_share_per_node": [round(c / peak_secs, 3) for c in cpu],
    "peak_rss_mb_per_node": rss,
    "disk_bytes_per_key": round(status["disk_bytes"] / keys, 1) if keys else None,
    "window_keys": keys,
  },
  "sustained": {"steps": sus, "max_rate": best(sus)},
  "naive": {"steps": naive, "max_rate": best(naive)},
  "fanout": fan,
}
result["ratios"] = {
  "cluster_vs_naive": round(result["sustained"]["max_rate"] / result["naive"]["max_rate"], 3) if result["naive"]["max_rate"] else None,
  "cluster_vs_fanout": round(result["sustained"]["max_rate"] / fan["rate_per_subscriber"], 3) if fan["rate_per_subscriber"] else None,
}
json.dump(result, open(out, "w"), indent=2)
p = result["peak"]
print()
print(f"{'figure':<44} {'value':>14}")
print(f"{'HSL peak p50 / p99 / max latency (ms)':<44} {p['latency_ms']['p50']:>5.1f} / {p['latency_ms']['p99']:.1f} / {p['latency_ms']['max']:.0f}")
print(f"{'HSL peak exactly once (verify)':<44} {str(p['exactly_once']):>14}")
print(f"{'HSL peak CPU share per node':<44} {', '.join(str(c) for c in p['cpu_share_per_node']):>14}")
print(f"{'HSL peak RSS per node (MB)':<44} {', '.join(str(r) for r in p['peak_rss_mb_per_node']):>14}")
print(f"{'disk bytes per key in window':<44} {str(p['disk_bytes_per_key']):>14}")
print(f"{'max sustained, 3-node cluster (msg/s)':<44} {result['sustained']['max_rate']:>14.0f}")
print(f"{'max sustained, naive HA forwarders (msg/s)':<44} {result['naive']['max_rate']:>14.0f}")
print(f"{'mosquitto fan-out to 3 subscribers (msg/s)':<44} {fan['rate_per_subscriber']:>14.0f}")
print(f"{'cluster / naive':<44} {str(result['ratios']['cluster_vs_naive']):>14}")
print(f"{'cluster / fan-out ceiling':<44} {str(result['ratios']['cluster_vs_fanout']):>14}")
print(f"\nwritten to {out}")
PY
