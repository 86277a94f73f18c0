#!/usr/bin/env bash
# firstseen's benchmark: one command, one machine, every figure from the
# same run (docs/benchmarks.md explains them). Writes bench-results/result.json
# and prints a table.
#
#   scripts/bench.sh                 default profiles (about 8 minutes)
#   BENCH_PEAK_SECS=300 scripts/bench.sh     the 5-minute soak for RSS
#   BENCH_ONLY_PEAK=1 scripts/bench.sh       the peak alone, with the latency
#                    split at the producer's send and the stage histograms
#   BENCH_PERF=1     adds a perf profile of the nodes over the peak
#   BENCH_BROKER_THREADS=1  where the broker's CPU went over each system's
#                    peak: the Pulsar JVM's threads' CPU from /proc, before
#                    and after, by thread pool (bench/py/brokerthreads.py)
#   BENCH_PEAK_RATE  the peak profiles' rate (2000)
#   BENCH_FLAME=1    records the leader's call stacks over the peak and draws
#                    bench-results/flame-peak.svg (perf and inferno)
#   BENCH_BENTHOS=0  leaves out the Benthos baselines
#   BENCH_PIN=1      the measured system on core 1, the brokers, load and
#                    probe on core 0
#   BENCH_ZONE_DELAY_MS=10  zones apart: every peer link of the firstseen
#                    clusters crosses a relay that delays each direction this
#                    long (this kernel has no netem; `firstseen-bench delay`).
#                    The baselines have no peer links and pay nothing.
#   BENCH_PEER_TLS=1 the clusters' peers talk mutual TLS, as in production
#                    (cluster.tls; a throwaway CA and node certificate made
#                    with openssl under .bench/tls). With BENCH_ZONE_DELAY_MS
#                    the nodes are also told the distance (cluster.round_trip_ms,
#                    twice the delay), so a distance row is the production setup
#   BENCH_PULSAR_WARMUP_SECS=60  load through a naive forwarder before
#                    anything is measured, so that no system pays for
#                    Pulsar's start-up JIT (0: none, as runs before 4 December
#                    2026); firstseen's kind of traffic still makes the broker
#                    compile over firstseen's peak, logged as "of which JIT"
#
# Profiles, in order, on one cluster:
#   peak       the HSL peak: 2,000 msg/s of synthetic HFP for BENCH_PEAK_SECS
#              after a BENCH_WARMUP_SECS warm-up, every node ingesting the whole
#              feed, 5% upstream duplicates on top; RSS sampled every 5 s
#   naive peak the same peak (and warm-up) through three naive forwarders on a
#              fresh Mosquitto: the latency the brokers and the machine give
#              without Raft or dedup, in the same run
#   sustained  rising rates (BENCH_STEPS); the highest one the cluster keeps up
#              with: every message in Pulsar within BENCH_SLACK_SECS of the load's
#              end, and p99 latency under 1 s
#   failover   SIGKILL the leader under load: time until Pulsar receives again;
#              then restart it and time its catch-up; BENCH_FAILOVERS times
#              (default 3), every run reported, with the median
#   outage     stop Pulsar, load into the outbox, start Pulsar: drain rate
#   verify     `firstseen verify` over everything the cluster published
#   naive      baseline (a): three forwarders without Raft or dedup, same steps,
#              on a fresh Mosquitto (the clusters' persistent sessions would
#              otherwise go on queuing every message during its steps)
#   benthos    baseline (c), what users run instead: Benthos v4.27 (mqtt ->
#              dedupe -> pulsar) built from the Go module proxy, alone with a
#              memory cache (default and tuned max_in_flight) and three
#              sharing a Redis cache; the same peak, and in the full run the
#              same steps
#   fanout     baseline (b): Mosquitto's delivery rate to three plain
#              subscribers, on a fresh Mosquitto too
#   sync       what one durable flush costs on this disk: sled's flush alone
#              against sled's flush + fdatasync
#   window     disk bytes per key of the dedup window at BENCH_WINDOW_KEYS keys,
#              on the real state machine (no cluster)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"
data="${FIRSTSEEN_DATA:-$root/../shared/data/hfp-5000.txt}"
peak_secs=${BENCH_PEAK_SECS:-60}
# The peak profiles' rate (the HSL peak); another rate, with BENCH_ONLY_PEAK
# and BENCH_FLAME, profiles the node nearer its ceiling.
peak_rate=${BENCH_PEAK_RATE:-2000}
warm_secs=${BENCH_WARMUP_SECS:-10}
steps=${BENCH_STEPS:-"2000 4000 8000 12000 14000 16000"}
step_secs=${BENCH_STEP_SECS:-10}
slack=${BENCH_SLACK_SECS:-5}
window_keys=${BENCH_WINDOW_KEYS:-500000}
# The peak profile's cluster runs with a dedup window shorter than the
# profile, so it reaches the steady state an operator lives in (keys expire as
# fast as they arrive) and RSS and disk are read there, not while the window
# is still filling. The other profiles run on a second cluster with the
# default window (1 h): overload steps leave upstream backlogs older than a
# short window, whose late copies would rightly count as new messages.
peak_window=${BENCH_WINDOW_SECS:-30}

"$here/setup.sh"
cd "$root"
log "building release binaries"
cargo build -q --release -p firstseen -p firstseen-bench
# BENCH_FIRSTSEEN_BIN runs another build of the node (an older commit, for a
# before/after) under the same benchmark.
fs="${BENCH_FIRSTSEEN_BIN:-$root/target/release/firstseen}"
bench="$root/target/release/firstseen-bench"
export ZONE_DELAY_MS=${BENCH_ZONE_DELAY_MS:-0} DELAY_BIN="$bench"

work="$root/.bench"
rm -rf "$work"; mkdir -p "$work" "$root/bench-results"
# The nodes read these through their FIRSTSEEN__ environment overrides
# (scripts/lib.sh's start_cluster writes the same config either way).
# BENCH_TELL_ROUND_TRIP=0 leaves it out, for a BENCH_FIRSTSEEN_BIN from before
# cluster.round_trip_ms (which would refuse the unknown setting).
if [ "$ZONE_DELAY_MS" != 0 ] && [ "${BENCH_TELL_ROUND_TRIP:-1}" != 0 ]; then
  export FIRSTSEEN__CLUSTER__ROUND_TRIP_MS=$((2 * ZONE_DELAY_MS))
fi
if [ "${BENCH_PEER_TLS:-0}" != 0 ]; then
  command -v openssl >/dev/null || { log "BENCH_PEER_TLS needs openssl"; exit 1; }
  tls="$work/tls"; mkdir -p "$tls"
  # One CA and one certificate for all three nodes: each presents it and
  # checks the others' against the CA and the name firstseen-peer.
  (cd "$tls"
   ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
   openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 -subj "/CN=firstseen bench CA" 2>/dev/null
   openssl req "${ec[@]}" -keyout node.key -out node.csr -subj "/CN=firstseen-peer" 2>/dev/null
   printf 'subjectAltName=DNS:firstseen-peer,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' > ext.cnf
   openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 2 -extfile ext.cnf 2>/dev/null)
  export FIRSTSEEN__CLUSTER__TLS__CERT_FILE="$tls/node.crt" \
         FIRSTSEEN__CLUSTER__TLS__KEY_FILE="$tls/node.key" \
         FIRSTSEEN__CLUSTER__TLS__CA_FILE="$tls/ca.crt"
  log "peers over mutual TLS (certificates in $tls)"
fi
cleanup() {
  stop_pid_file "$work/pids" || true
  "$here/pulsar.sh" stop "$work/pulsar" || true
}
trap cleanup EXIT
"$here/pulsar.sh" start "$work/pulsar"
. "$work/pulsar/env"
start_mosquitto "$work/mosquitto" "$work/pids"
tail -n 1 "$work/pids" > "$work/mosquitto-pid"
run=$(date +%s)

# BENCH_PIN=1: the system measured (the three nodes, or a baseline's
# processes) gets core 1 to itself, and everything else (Pulsar, Mosquitto,
# the load and the probe) shares core 0: the ceiling of one group when the
# brokers are not on its cores, as far as two cores allow. Everything this
# script starts inherits core 0; pin_system moves a process to core 1.
if [ -n "${BENCH_PIN:-}" ]; then
  taskset -p -c 0 $$ > /dev/null
fi
pin_system() {
  [ -n "${BENCH_PIN:-}" ] || return 0
  local p
  for p in "$@"; do taskset -a -p -c 1 "$p" > /dev/null; done
}

# Baseline (c): Benthos v4.27.0, built from the Go module proxy
# (bench/benthos), and Debian's Redis for its shared cache.
benthos_bin="$root/target/benthos-4.27"
if [ "${BENCH_BENTHOS:-1}" != 0 ]; then
  if [ ! -x "$benthos_bin" ] || [ "$root/bench/benthos/go.sum" -nt "$benthos_bin" ]; then
    log "building Benthos v4.27.0 from the Go module proxy (bench/benthos)"
    (cd "$root/bench/benthos" && go build -o "$benthos_bin" .)
  fi
  if ! command -v redis-server >/dev/null; then
    log "installing redis-server with apt"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  fi
fi
if [ "${BENCH_FLAME:-0}" != 0 ] && ! command -v inferno-flamegraph >/dev/null; then
  log "installing inferno (flame graphs) from crates.io"
  cargo install -q --locked inferno
fi

cpu_secs() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
# Pulsar's own CPU (core-seconds): the broker and bookie share one JVM.
pulsar_cpu() { cpu_secs "$(cat "$work/pulsar/pid")"; }
# Of it, the CPU of the JVM's JIT compiler threads (core-seconds), logged
# beside each system's broker CPU: over firstseen's peak, which comes first,
# they took about half of it, and over the Benthos peaks after it almost
# nothing ("Half the broker's CPU over firstseen's peak is its JIT compiler's" in
# docs/benchmarks.md). Only threads alive at the reading count, so a compiler
# thread that exited between two readings makes their difference meaningless
# (printed as 0); a thread gone between its name and its ticks is skipped.
pulsar_jit_cpu() {
  local t name pid
  pid=$(cat "$work/pulsar/pid")
  for t in /proc/"$pid"/task/*; do
    name=$(cat "$t/comm" 2>/dev/null) || continue
    case "$name" in
      "C1 CompilerThre"*|"C2 CompilerThre"*) sed 's/.*) //' "$t/stat" 2>/dev/null ;;
    esac
  done | awk '{ s += $12 + $13 } END { printf "%.2f", s / 100 }'
}
# $1 and $2 readings of pulsar_jit_cpu over $3 seconds, as core-s/s, never
# below zero.
jit_share() { awk -v a="$2" -v b="$1" -v s="$3" 'BEGIN { d = (a - b) / s; printf "%.3f", (d > 0 ? d : 0) }'; }
# BENCH_BROKER_THREADS=1: every broker thread's CPU ticks (utime + stime)
# into $work/broker-threads/<system>.<when>, as "tid name ticks" lines. Read
# from /proc, so measuring costs the broker nothing (a flight recording's
# start cost more than the peak it was to explain).
broker_threads() {
  [ "${BENCH_BROKER_THREADS:-0}" != 0 ] || return 0
  local pid t dir="$work/broker-threads"
  pid=$(cat "$work/pulsar/pid")
  mkdir -p "$dir"
  for t in /proc/"$pid"/task/*; do
    # The name may hold spaces; the ticks are fields 14 and 15 after it.
    echo "${t##*/} $(tr ' ' '_' < "$t/comm") $(sed 's/.*) //' "$t/stat" | awk '{ print $12 + $13 }')"
  done > "$dir/$1.$2" 2>/dev/null || true
}
# Core-seconds per second between two readings $1 and $2 over $3 seconds.
share() { awk -v a="$2" -v b="$1" -v s="$3" 'BEGIN { printf "%.3f", (a - b) / s }'; }
peak_rss_mb() { awk '/VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
rss_mb() { awk '/VmRSS/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0; }
# Sum of one metric's series on node $1 (HTTP port).
metric() { curl -fsS "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.0f", s }'; }
# The benchmark's arithmetic and reports (bench/py/benchreport.py, tested).
report() { python3 "$root/bench/py/benchreport.py" "$@"; }
# One named field of node $1's /status (benchreport.STATUS_QUERIES).
status_field() { curl -fsS "http://127.0.0.1:$1/status" | report status "$2"; }
leader_index() {
  local i l
  for i in 1 2 3; do
    l=$(status_field "${http[$i]}" leader 2>/dev/null) || continue
    [ "$l" != 0 ] && { echo "$l"; return; }
  done
  return 1
}

# One step: load at $1 msg/s for $2 s into topic routed by the running
# setup; the probe reads topic $3 expecting every unique message. Prints the
# probe's JSON; the step is sustained if the probe finished within the slack.
step() {
  local rate=$1 secs=$2 topic=$3 id=$4 during=${5:-}
  local expect=$((rate * secs))
  "$bench" probe --pulsar "$PULSAR_URL" --topic "$topic" --expect "$expect" --idle-secs $((slack + 5)) --run "$id" --mark-file "$work/mark-$id" > "$work/probe-$id.json" &
  local probe=$!
  # The probe reads from the latest message on: wait for its subscription.
  wait_for 30 bash -c "curl -fsS '$PULSAR_ADMIN_URL/admin/v2/persistent/${topic#persistent://}/stats' | grep -q bench-probe"
  "$bench" load --port "$mqtt_port" --template "$data" --rate "$rate" --secs "$secs" --dup-every 20 --run "$id" > "$work/load-$id.json" &
  local load=$!
  # A fault injected while the load runs (the failover profile).
  [ -n "$during" ] && $during
  wait "$load"
  wait "$probe"
  report step "$work/load-$id.json" "$work/probe-$id.json" "$secs" "$slack"
}

# Pulsar's JIT compiles its hot paths during the first minutes of load, and
# the system measured first would pay for that in latency and in Pulsar's
# CPU (the compiler threads are Pulsar's). So every system meets a broker
# already warm: load through one naive forwarder, on a Mosquitto of its own
# (its persistent session would otherwise queue everything after it).
pulsar_warm=${BENCH_PULSAR_WARMUP_SECS:-60}
if [ "$pulsar_warm" -gt 0 ]; then
  log "Pulsar warm-up: 2000 msg/s for ${pulsar_warm}s through a naive forwarder (not measured)"
  main_mqtt=$mqtt_port
  start_mosquitto "$work/mosquitto-warm" "$work/pids"
  warm_mosquitto=$(tail -n 1 "$work/pids")
  "$bench" naive --port "$mqtt_port" --client-id "warm-$run" --pulsar "$PULSAR_URL" --topic "persistent://public/default/bench-warm-$run" > "$work/pulsar-warm.log" 2>&1 &
  warm_forwarder=$!; echo "$warm_forwarder" >> "$work/pids"
  sleep 3
  "$bench" load --port "$mqtt_port" --template "$data" --rate 2000 --secs "$pulsar_warm" --dup-every 20 --run "$run-pulsar-warm" > /dev/null
  stop_pids "$warm_forwarder" "$warm_mosquitto" || true
  mqtt_port=$main_mqtt
fi

log "cluster: three nodes in three zones"
topic="persistent://public/default/bench-$run"
cdir="$work/peak"; mkdir -p "$cdir"
FIRSTSEEN__DEDUP__WINDOW_SECS=$peak_window start_cluster "$cdir" "$fs" "$mqtt_port" "/hfp/#" "$topic" "$work/pids"
pin_system "$(cat "$cdir/node-1.pid")" "$(cat "$cdir/node-2.pid")" "$(cat "$cdir/node-3.pid")"
pin_system "$(cat "$cdir/node-1.pid")" "$(cat "$cdir/node-2.pid")" "$(cat "$cdir/node-3.pid")"

log "warm-up: $peak_rate msg/s for ${warm_secs}s (not measured)"
"$bench" load --port "$mqtt_port" --template "$data" --rate "$peak_rate" --secs "$warm_secs" --dup-every 20 --run "$run-warm" > /dev/null
l=$(leader_index)
for i in 1 2 3; do cpu0[$i]=$(cpu_secs "$(cat "$cdir/node-$i.pid")"); done
raft0=("$(metric "${http[$l]}" firstseen_raft_log_entries_total)" "$(metric "${http[$l]}" firstseen_raft_log_bytes_total)")
# Log syncs (one fdatasync each) and their total time, on every node.
sync_stats() {
  local i
  for i in 1 2 3; do
    curl -fsS "http://127.0.0.1:${http[$i]}/metrics" | awk '
      $1 ~ /^firstseen_raft_log_flushes_total/ { f += $2 }
      $1 ~ /^firstseen_disk_sync_seconds_sum/ && $1 ~ /db="log"/ { s += $2 }
      $1 ~ /^firstseen_disk_sync_seconds_count/ && $1 ~ /db="log"/ { c += $2 }
      END { printf "%.0f %.6f %.0f ", f, s, c }'
  done
}
sync0=($(sync_stats))
# Every node's metrics before and after the peak: the stage histograms
# (commit, publish batch) over the peak alone are their difference.
for i in 1 2 3; do curl -fsS "http://127.0.0.1:${http[$i]}/metrics" > "$work/metrics0-$i.txt"; done

log "profile peak: $peak_rate msg/s for ${peak_secs}s (window ${peak_window}s, zones ${ZONE_DELAY_MS} ms apart, peer TLS ${BENCH_PEER_TLS:-0})"
# RSS of every node every 5 s: flat at a constant rate, or growing?
(
  t0=$(date +%s)
  while sleep 5; do
    echo "$(( $(date +%s) - t0 )) $(for i in 1 2 3; do rss_mb "$(cat "$cdir/node-$i.pid")"; echo -n " "; done)"
  done
) > "$work/rss.txt" &
sampler=$!
# BENCH_PERF=1: a flat CPU profile of the three nodes over the peak
# (perf record at 499 Hz), printed per node and symbol at the end.
if [ "${BENCH_FLAME:-0}" != 0 ]; then
  # The leader alone, with call stacks unwound from DWARF CFI (the release
  # build keeps its symbols and .eh_frame), at 99 Hz to keep the file small.
  perf record -q -F 99 --call-graph dwarf,16384 -o "$work/flame.data" \
    -p "$(cat "$cdir/node-$l.pid")" -- sleep "$((peak_secs + warm_secs))" > "$work/flame.log" 2>&1 &
  flame_pid=$!
fi
if [ -n "${BENCH_PERF:-}" ]; then
  perf record -q -F 499 -o "$work/perf.data" \
    -p "$(cat "$cdir/node-1.pid"),$(cat "$cdir/node-2.pid"),$(cat "$cdir/node-3.pid")" \
    -- sleep "$((peak_secs + warm_secs))" > "$work/perf.log" 2>&1 &
  perf_pid=$!
fi
pulsar0=$(pulsar_cpu); jit0=$(pulsar_jit_cpu)
broker_threads firstseen before
peak=$(step "$peak_rate" "$peak_secs" "$topic" "$run-peak")
broker_threads firstseen after
share "$pulsar0" "$(pulsar_cpu)" "$peak_secs" > "$work/pulsar-cpu-firstseen.txt"
jit_share "$jit0" "$(pulsar_jit_cpu)" "$peak_secs" > "$work/pulsar-jit-firstseen.txt"
log "  broker CPU over the peak: $(cat "$work/pulsar-cpu-firstseen.txt") core-s/s, of which $(cat "$work/pulsar-jit-firstseen.txt") in its JIT compilers"
kill "$sampler"
if [ -n "${BENCH_PERF:-}" ]; then
  kill -INT "$perf_pid" 2>/dev/null || true
  wait "$perf_pid" || true
fi
if [ "${BENCH_FLAME:-0}" != 0 ]; then
  kill -INT "$flame_pid" 2>/dev/null || true
  wait "$flame_pid" || true
  perf script -i "$work/flame.data" 2>/dev/null | inferno-collapse-perf > "$work/flame.folded"
  inferno-flamegraph --title "firstseen leader, $peak_rate msg/s (run $run)" < "$work/flame.folded" > "$root/bench-results/flame-peak.svg"
  log "flame graph: bench-results/flame-peak.svg"
fi
for i in 1 2 3; do
  pid=$(cat "$cdir/node-$i.pid")
  cpu[$i]=$(awk -v a="$(cpu_secs "$pid")" -v b="${cpu0[$i]}" 'BEGIN { printf "%.2f", a - b }')
  rss[$i]=$(peak_rss_mb "$pid")
done
awk -v a="${cpu[1]}" -v b="${cpu[2]}" -v c="${cpu[3]}" -v s="$peak_secs" 'BEGIN { printf "%.3f", (a + b + c) / s }' > "$work/cpu-firstseen.txt"
raft1=("$(metric "${http[$l]}" firstseen_raft_log_entries_total)" "$(metric "${http[$l]}" firstseen_raft_log_bytes_total)")
echo "{\"entries\": $((raft1[0] - raft0[0])), \"bytes\": $((raft1[1] - raft0[1]))}" > "$work/raft.json"
sync1=($(sync_stats))
for i in 1 2 3; do curl -fsS "http://127.0.0.1:${http[$i]}/metrics" > "$work/metrics1-$i.txt"; done
report stages "$work" > "$work/stages.json"
report syncs "$peak_secs" "${sync0[*]}" "${sync1[*]}" > "$work/syncs.json"
curl -fsS "http://127.0.0.1:${http[$l]}/status" > "$work/status.json"
echo "$peak" > "$work/peak.json"
# How long each snapshot export held up apply (the node logs say).
sed 's/\x1b\[[0-9;]*m//g' "$cdir"/node-*.log | grep "state exported for a snapshot" | sed 's/.*ms=\([0-9]*\).*/\1/' > "$work/export-ms.txt" || true

stop_cluster() {
  stop_pids "$(cat "$cdir/node-1.pid")" "$(cat "$cdir/node-2.pid")" "$(cat "$cdir/node-3.pid")" || true
}

# A Mosquitto of its own for what comes next (its port becomes $mqtt_port).
fresh_mosquitto() {
  stop_pids "$(tail -n 1 "$work/mosquitto-pid")" || true
  rm -rf "$work/mosquitto-$1"
  start_mosquitto "$work/mosquitto-$1" "$work/pids"
  tail -n 1 "$work/pids" > "$work/mosquitto-pid"
}

# Three naive forwarders (no Raft, no dedup) on topic $1, run id $2.
start_naive() {
  naive_pids=()
  local i
  for i in 1 2 3; do
    "$bench" naive --port "$mqtt_port" --client-id "naive-$i-$2" --pulsar "$PULSAR_URL" --topic "$1" > "$work/naive-$i-$2.log" 2>&1 &
    echo $! >> "$work/pids"
    naive_pids+=($!)
  done
  sleep 3
}

# The same peak through the naive forwarders, on a fresh Mosquitto, with the
# same warm-up: the latency the brokers and this machine give by themselves,
# measured in the same run. The cluster's peak latency is read against it.
log "the same peak through three naive forwarders (no Raft, no dedup)"
stop_cluster
fresh_mosquitto naive-peak
nptopic="persistent://public/default/bench-naive-peak-$run"
start_naive "$nptopic" "$run-np"
pin_system "${naive_pids[@]}"
"$bench" load --port "$mqtt_port" --template "$data" --rate "$peak_rate" --secs "$warm_secs" --dup-every 20 --run "$run-np-warm" > /dev/null
# Their CPU over the same peak: the baseline for the nodes' CPU.
for i in 0 1 2; do ncpu0[$i]=$(cpu_secs "${naive_pids[$i]}"); done
pulsar0=$(pulsar_cpu)
step "$peak_rate" "$peak_secs" "$nptopic" "$run-naive-peak" > "$work/naive-peak.json"
share "$pulsar0" "$(pulsar_cpu)" "$peak_secs" > "$work/pulsar-cpu-naive.txt"
for i in 0 1 2; do
  awk -v a="$(cpu_secs "${naive_pids[$i]}")" -v b="${ncpu0[$i]}" -v s="$peak_secs" 'BEGIN { printf "%.3f ", (a - b) / s }'
done > "$work/naive-cpu.txt"
awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s }' "$work/naive-cpu.txt" > "$work/cpu-naive.txt"
stop_pids "${naive_pids[@]}" || true
# Their persistent sessions would queue the next profiles' messages.
fresh_mosquitto after-naive-peak

# Benthos instance $1 with cache $2 (memory or redis) and the Pulsar
# output's max_in_flight $3, into topic $4, named after run $5. The dedupe
# key is the payload's xxhash64, Benthos's own cheap hash (firstseen keys on
# blake3). Appends the pid to benthos_pids.
start_benthos() {
  local i=$1 cache=$2 inflight=$3 topic=$4 id=$5 conf="$work/benthos-$5-$1.yaml"
  {
    cat <<YAML
http:
  enabled: false
logger:
  level: warn
input:
  mqtt:
    urls: [ "tcp://127.0.0.1:$mqtt_port" ]
    topics: [ "/hfp/#" ]
    client_id: "benthos-$i-$id"
    qos: 1
pipeline:
  processors:
    - dedupe:
        cache: keys
        key: '\${! content().hash("xxhash64").encode("hex") }'
output:
  pulsar:
    url: "$PULSAR_URL"
    topic: "$topic"
    max_in_flight: $inflight
cache_resources:
  - label: keys
YAML
    if [ "$cache" = redis ]; then
      printf '    redis:\n      url: "redis://127.0.0.1:%s"\n      default_ttl: 60s\n' "$redis_port"
    else
      printf '    memory:\n      default_ttl: 60s\n'
    fi
  } > "$conf"
  "$benthos_bin" -c "$conf" > "$work/benthos-$id-$i.log" 2>&1 &
  echo $! >> "$work/pids"
  benthos_pids+=($!)
}

# A Benthos baseline: $1 instances, $2 cache, $3 max_in_flight, $4 the run
# id, $5 its topic. Starts Redis for the redis cache (its pid in redis_pid,
# or empty). Sets benthos_pids.
start_competitor() {
  local n=$1 cache=$2 inflight=$3 id=$4 topic=$5 i
  benthos_pids=(); redis_pid=""
  if [ "$cache" = redis ]; then
    redis_port=$(free_port)
    redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no > "$work/redis-$id.log" 2>&1 &
    redis_pid=$!; echo "$redis_pid" >> "$work/pids"
    wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$redis_port"
  fi
  for i in $(seq 1 "$n"); do start_benthos "$i" "$cache" "$inflight" "$topic" "$id"; done
  pin_system "${benthos_pids[@]}" $redis_pid
  sleep 3
}
stop_competitor() { stop_pids "${benthos_pids[@]}" $redis_pid || true; }

# Core-seconds so far of every process in "$@".
cpu_sum() {
  local p total=0
  for p in "$@"; do total=$(awk -v a="$total" -v b="$(cpu_secs "$p")" 'BEGIN { print a + b }'); done
  echo "$total"
}

# Steps of BENCH_STEPS against topic $1 (run ids $2<rate>), one row each
# into $3, for a system that settles by itself (the baselines); the log says
# copies per message.
baseline_steps() {
  local topic=$1 prefix=$2 out=$3 rate r
  : > "$out"
  for rate in $steps; do
    r=$(step "$rate" "$step_secs" "$topic" "$prefix$rate")
    echo "$r" >> "$out"
    log "  $rate msg/s: $(echo "$r" | report describe-step naive)"
  done
}

# The competitors as "name instances cache max_in_flight".
competitors=()
if [ "${BENCH_BENTHOS:-1}" != 0 ]; then
  competitors=("benthos 1 memory 64" "benthos-tuned 1 memory 1024" "benthos-ha 3 redis 64")
fi
for c in "${competitors[@]}"; do
  read -r name n cache inflight <<< "$c"
  log "the same peak through $name ($n instance(s), $cache cache, max_in_flight $inflight)"
  fresh_mosquitto "$name-peak"
  ctopic="persistent://public/default/bench-$name-peak-$run"
  start_competitor "$n" "$cache" "$inflight" "$run-$name-peak" "$ctopic"
  "$bench" load --port "$mqtt_port" --template "$data" --rate "$peak_rate" --secs "$warm_secs" --dup-every 20 --run "$run-$name-warm" > /dev/null
  c0=$(cpu_sum "${benthos_pids[@]}")
  r0=0; [ -n "$redis_pid" ] && r0=$(cpu_secs "$redis_pid")
  pulsar0=$(pulsar_cpu); jit0=$(pulsar_jit_cpu)
  broker_threads "$name" before
  step "$peak_rate" "$peak_secs" "$ctopic" "$run-$name-peak" > "$work/$name-peak.json"
  broker_threads "$name" after
  share "$pulsar0" "$(pulsar_cpu)" "$peak_secs" > "$work/pulsar-cpu-$name.txt"
  jit_share "$jit0" "$(pulsar_jit_cpu)" "$peak_secs" > "$work/pulsar-jit-$name.txt"
  c1=$(cpu_sum "${benthos_pids[@]}")
  r1=0; [ -n "$redis_pid" ] && r1=$(cpu_secs "$redis_pid")
  echo "$(share "$c0" "$c1" "$peak_secs") $(share "$r0" "$r1" "$peak_secs")" > "$work/cpu-$name.txt"
  stop_competitor
  log "  $(report describe-peak "$work/$name-peak.json") CPU $(cat "$work/cpu-$name.txt") Pulsar $(cat "$work/pulsar-cpu-$name.txt") (of which JIT $(cat "$work/pulsar-jit-$name.txt"))"
done
fresh_mosquitto after-competitor-peaks

# Waits until the cluster is idle: the leader's outbox is empty and no node
# has proposed anything for 3 s (a node behind on its upstream backlog is
# still proposing late copies). Profiles start from quiet, not from the
# previous one's tail.
settle() {
  local l last="" now same=0 i
  for i in $(seq 1 240); do
    l=$(leader_index) || { sleep 0.5; continue; }
    now=$(status_field "${http[$l]}" observed-outbox) || { sleep 0.5; continue; }
    if [ "$now" = "$last" ] && [ "${now#* }" = 0 ]; then
      same=$((same + 1)); [ "$same" -ge 6 ] && return 0
    else
      same=0
    fi
    last=$now; sleep 0.5
  done
  log "  the cluster did not settle within 2 minutes; going on"
}

if [ -n "${BENCH_ONLY_PEAK:-}" ]; then
  # A quick look at the peak profile alone, while working on latency.
  report peak-summary "$work" "$peak_secs" "${cpu[1]}" "${cpu[2]}" "${cpu[3]}"
  report competitors "$work" "$peak_secs"
  if [ "${BENCH_BROKER_THREADS:-0}" != 0 ]; then
    echo "Where the broker's CPU went over each peak (core-seconds by thread pool):"
    python3 "$root/bench/py/brokerthreads.py" "$work/broker-threads"
  fi
  if [ -n "${BENCH_PERF:-}" ]; then
    echo "CPU profile of the nodes over the peak (perf, by process and symbol):"
    perf report -q -i "$work/perf.data" --sort pid,sym --percent-limit 0.7 2>/dev/null | head -80
  fi
  exit 0
fi

log "a second cluster, default window, for the other profiles"
stop_cluster
cdir="$work/main"; mkdir -p "$cdir"
topic="persistent://public/default/bench-$run-main"
start_cluster "$cdir" "$fs" "$mqtt_port" "/hfp/#" "$topic" "$work/pids"
pin_system "$(cat "$cdir/node-1.pid")" "$(cat "$cdir/node-2.pid")" "$(cat "$cdir/node-3.pid")"
"$bench" load --port "$mqtt_port" --template "$data" --rate 2000 --secs "$warm_secs" --dup-every 20 --run "$run-warm2" > /dev/null
settle

log "profile sustained: steps $steps (${step_secs}s each)"
: > "$work/sustained.jsonl"
for rate in $steps; do
  r=$(step "$rate" "$step_secs" "$topic" "$run-s$rate")
  echo "$r" >> "$work/sustained.jsonl"
  settle
  log "  $rate msg/s: $(echo "$r" | report describe-step)"
done

# Largest last_applied among the nodes that answer.
max_applied() {
  local i best=0 a
  for i in 1 2 3; do
    a=$(status_field "${http[$i]}" last-applied 2>/dev/null) || continue
    [ "$a" -gt "$best" ] && best=$a
  done
  echo "$best"
}

# Times the catch-up of node $1, restarted at $2 (ms since epoch): until it
# has applied what the cluster had applied at the restart ($4), having missed
# everything since the kill ($3). Prints {"missed_entries", "secs",
# "entries_per_sec", "caught_up"}; the time includes the process start.
catch_up() {
  report catch-up "http://127.0.0.1:${http[$1]}/status" "$2" "$3" "$4"
}

# During a failover load: SIGKILL the leader 5 s in, restart it 8 s later
# and time its catch-up. Output goes to files; stdout belongs to step().
# $1 names the run.
failover() {
  sleep 5
  local k at_kill target restarted; k=$(leader_index)
  echo "$k" > "$work/failover-killed-$1"
  date +%s%3N > "$work/mark.tmp"
  kill -9 "$(cat "$cdir/node-$k.pid")"
  mv "$work/mark.tmp" "$work/mark-$run-failover-$1"
  at_kill=$(max_applied)
  sleep 8
  target=$(max_applied)
  restarted=$(date +%s%3N)
  "$fs" run --config "$cdir/node-$k.toml" >> "$cdir/node-$k.log" 2>&1 &
  echo $! >> "$work/pids"; echo $! > "$cdir/node-$k.pid"
  pin_system $!
  catch_up "$k" "$restarted" "$at_kill" "$target" > "$work/catchup-$1.json"
} >&2

failovers=${BENCH_FAILOVERS:-3}
: > "$work/failovers.jsonl"
for f in $(seq 1 "$failovers"); do
  settle
  log "profile failover $f/$failovers: SIGKILL the leader under 2000 msg/s, restart it 8 s later"
  step 2000 20 "$topic" "$run-failover-$f" "failover $f" > "$work/failover-$f.json"
  report failover "$work/failover-$f.json" "$work/catchup-$f.json" "$work/failover-killed-$f" >> "$work/failovers.jsonl"
  log "  $(report describe-failover "$work/failover-$f.json" "$work/catchup-$f.json")"
  wait_for 60 curl -fsS "http://127.0.0.1:${http[$(cat "$work/failover-killed-$f")]}/readyz" >/dev/null
done

settle
log "profile outage: Pulsar stopped while 2000 msg/s for 10 s are committed"
l=$(leader_index)
last_seq() { status_field "${http[$l]}" last-seq; }
seq0=$(last_seq)
"$here/pulsar.sh" stop "$work/pulsar"
"$bench" load --port "$mqtt_port" --template "$data" --rate 2000 --secs 10 --dup-every 20 --run "$run-outage" > /dev/null
wait_for 60 bash -c "[ \$(curl -fsS http://127.0.0.1:${http[$l]}/status | python3 '$root/bench/py/benchreport.py' status last-seq) -ge $((seq0 + 20000)) ]"
buffered=$(status_field "${http[$l]}" outbox)
t_start=$(date +%s%3N)
"$here/pulsar.sh" start "$work/pulsar" > /dev/null
t_ready=$(date +%s%3N)
wait_for 300 bash -c "[ \$(curl -fsS http://127.0.0.1:${http[$l]}/status | python3 '$root/bench/py/benchreport.py' status outbox) = 0 ]"
t_done=$(date +%s%3N)
echo "{\"buffered\": $buffered, \"pulsar_start_ms\": $((t_ready - t_start)), \"drain_ms\": $((t_done - t_ready))}" > "$work/outage.json"
log "  $(cat "$work/outage.json")"

log "verify: every message the cluster published, read back from Pulsar"
total=$(last_seq)
"$fs" verify --pulsar-url "$PULSAR_URL" --topic "$topic" --secret-file "$cdir/cluster.secret" --expect "$total" --json --idle-secs 15 > "$work/verify.json" 2> "$work/verify.log" \
  && echo true > "$work/verify.ok" || echo false > "$work/verify.ok"
log "  $total messages expected; clean: $(cat "$work/verify.ok")"

log "stopping the cluster for the baselines"
stop_cluster
# The clusters' six persistent sessions would go on queuing every message
# published during the baselines (costing Mosquitto the work of six more
# subscribers): each baseline gets a Mosquitto of its own.
fresh_mosquitto naive

log "baseline naive: three forwarders without Raft or dedup"
ntopic="persistent://public/default/bench-naive-$run"
start_naive "$ntopic" "$run"
pin_system "${naive_pids[@]}"
baseline_steps "$ntopic" "$run-n" "$work/naive.jsonl"

stop_pids "${naive_pids[@]}" || true

for c in "${competitors[@]}"; do
  read -r name n cache inflight <<< "$c"
  fresh_mosquitto "$name"
  log "baseline $name: the same steps"
  ctopic="persistent://public/default/bench-$name-$run"
  start_competitor "$n" "$cache" "$inflight" "$run-$name" "$ctopic"
  baseline_steps "$ctopic" "$run-$name" "$work/$name.jsonl"
  stop_competitor
done

fresh_mosquitto fanout
log "baseline fanout: Mosquitto to three subscribers (nothing else subscribed)"
"$bench" fanout --port "$mqtt_port" --subs 3 --count 100000 > "$work/fanout.json"

log "sync: one durable flush against sled's own, on this disk"
"$bench" sync --count 2000 --bytes 7500 --dir "$work" > "$work/sync.json"

log "window: disk bytes per key at $window_keys keys, on the state machine alone"
"$bench" window --keys "$window_keys" > "$work/window.json"

report result "$work" "$peak_secs" "$root/bench-results/result.json" "${cpu[1]}" "${cpu[2]}" "${cpu[3]}" "${rss[1]}" "${rss[2]}" "${rss[3]}" "$peak_window"
