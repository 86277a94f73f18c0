# Shared helpers for firstseen's scripts. Sourced, not executed.

# Prints a TCP port on 127.0.0.1 that is free right now, picked at random so
# parallel runs do not collide on a fixed number. It comes from 20000-32767,
# below Linux's ephemeral range: a process restarted on its old port (the
# benchmark's failover, a Pulsar restart) must not find it taken as the source
# port of some outgoing connection made while it was down.
free_port() {
  python3 -c '
import random, socket
for _ in range(200):
    port = random.randrange(20000, 32768)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free port in 20000-32767")
'
}


# Succeeds when nothing listens on TCP port $1 on ${PULSAR_BIND:-127.0.0.1}:
# it binds the way servers with SO_REUSEADDR do, so TIME_WAIT does not count.
port_unbound() {
  python3 -c 'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[2], int(sys.argv[1])))' "$1" "${PULSAR_BIND:-127.0.0.1}" 2>/dev/null
}

# Waits until a command succeeds, polling every 0.5 s, for at most $1 seconds.
wait_for() {
  local limit=$1; shift
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then return 1; fi
    sleep 0.5
  done
}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Whether process $1 is still running (a zombie left for its parent to reap
# has stopped).
alive() {
  local st; st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  case "$st" in Z*) return 1 ;; *) return 0 ;; esac
}

# Stops processes: SIGTERM to each pid given, then waits up to
# $STOP_TIMEOUT seconds (default 15: a node's shutdown bound is 10 s) and
# SIGKILLs, saying so, any that is still running.
stop_pids() {
  local limit=${STOP_TIMEOUT:-15} pid left deadline
  [ $# -gt 0 ] || return 0
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  deadline=$(( $(date +%s) + limit ))
  while :; do
    left=()
    for pid in "$@"; do alive "$pid" && left+=("$pid"); done
    [ ${#left[@]} -eq 0 ] && return 0
    if [ "$(date +%s)" -ge "$deadline" ]; then
      for pid in "${left[@]}"; do
        log "process $pid ($(ps -o args= -p "$pid" 2>/dev/null | cut -c1-80)) did not stop within ${limit}s of SIGTERM: killing it"
        kill -9 "$pid" 2>/dev/null || true
      done
      return 1
    fi
    sleep 0.2
  done
}

# stop_pids for every pid listed in file $1.
stop_pid_file() {
  [ -f "$1" ] || return 0
  local pids; mapfile -t pids < "$1"
  stop_pids "${pids[@]}"
}

# Starts a Mosquitto of our own with state in $1, on a free port, and records
# its pid in $2. Sets mqtt_port. Offline queues are raised so a restart loses
# nothing inside the broker (the default keeps 1,000 messages per session).
start_mosquitto() {
  local dir=$1 pids=$2
  mkdir -p "$dir"
  mqtt_port=$(free_port)
  {
    echo "listener $mqtt_port 127.0.0.1"
    echo "allow_anonymous true"
    echo "persistence true"
    echo "persistence_location $dir/"
    echo "max_queued_messages 1000000"
    echo "max_inflight_messages 1000"
    if [ "$(id -u)" = 0 ]; then echo "user root"; fi
  } > "$dir/mosquitto.conf"
  mosquitto -c "$dir/mosquitto.conf" > "$dir/log" 2>&1 &
  echo $! >> "$pids"
  wait_for 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$mqtt_port"
}

# Starts a three-zone firstseen cluster: state in $1/node-N, binary $2,
# upstream 127.0.0.1:$3 filter $4 routed to Pulsar topic $5 ($PULSAR_URL and
# $PULSAR_ADMIN_URL must be set), pids appended to $6. Waits until every node
# is ready. Sets the arrays zones, http (HTTP port per node) and peer.
# ROUTE_FORMAT sets the route's format (transitdata; unset, the default raw).
# ZONE_DELAY_MS puts that one-way delay between the zones: each node's peer
# port sits behind a relay (`firstseen-bench delay`, binary $DELAY_BIN), and
# the membership names the relay, so every peer link crosses one.
start_cluster() {
  local dir=$1 bin=$2 mqtt=$3 filter=$4 topic=$5 pids=$6 i members=""
  zones=(zone-a zone-b zone-c)
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/cluster.secret"
  for i in 1 2 3; do http[$i]=$(free_port); peer[$i]=$(free_port); advertised[$i]=${peer[$i]}; done
  if [ -n "${ZONE_DELAY_MS:-}" ] && [ "$ZONE_DELAY_MS" != 0 ]; then
    for i in 1 2 3; do
      advertised[$i]=$(free_port)
      "$DELAY_BIN" delay --listen "127.0.0.1:${advertised[$i]}" --to "127.0.0.1:${peer[$i]}" --ms "$ZONE_DELAY_MS" &
      echo $! >> "$pids"
    done
  fi
  for i in 1 2 3; do
    members+="
[[cluster.members]]
id = $i
zone = \"${zones[$((i-1))]}\"
addr = \"127.0.0.1:${advertised[$i]}\"
http = \"127.0.0.1:${http[$i]}\"
"
  done
  for i in 1 2 3; do
    # Every node subscribes to the same broker with its own client id
    # (firstseen-<id>-hsl), as one bridge per availability zone would.
    cat > "$dir/node-$i.toml" <<CONF
[node]
id = $i
zone = "${zones[$((i-1))]}"
data_dir = "$dir/node-$i"
http_listen = "127.0.0.1:${http[$i]}"

[pulsar]
url = "$PULSAR_URL"
admin_url = "$PULSAR_ADMIN_URL"

[[upstreams]]
name = "hsl"
url = "mqtt://127.0.0.1:$mqtt"
[[upstreams.subscriptions]]
filter = "$filter"
qos = 1

[[routes]]
filter = "$filter"
pulsar_topic = "$topic"
${ROUTE_FORMAT:+format = \"$ROUTE_FORMAT\"}

[cluster]
listen = "127.0.0.1:${peer[$i]}"
secret_file = "$dir/cluster.secret"
$members
CONF
    "$bin" check-config "$dir/node-$i.toml" >/dev/null
    "$bin" run --config "$dir/node-$i.toml" > "$dir/node-$i.log" 2>&1 &
    echo $! >> "$pids"
    echo $! > "$dir/node-$i.pid"
  done
  for i in 1 2 3; do
    wait_for 60 curl -fsS "http://127.0.0.1:${http[$i]}/readyz"
  done
}
