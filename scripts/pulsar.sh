#!/usr/bin/env bash
# Runs Apache Pulsar standalone from the Maven Central artifacts, without Docker.
#
#   scripts/pulsar.sh install          resolve the jars once into the cache
#   scripts/pulsar.sh start DIR        start a broker with state in DIR, wait until ready,
#                                      and write DIR/env (PULSAR_URL, PULSAR_ADMIN_URL, PULSAR_PID)
#   scripts/pulsar.sh stop DIR         stop the broker started in DIR
#
# PULSAR_SECURE=1 on the first start of a DIR makes a broker that requires
# token authentication on every port and also listens with TLS: a CA, the
# broker's certificate (for 127.0.0.1 and localhost) and a token secret key
# are made in DIR/secure, with tokens for the roles `firstseen` (a client)
# and `admin` (the broker's own client and the admin API). DIR/env then also
# has PULSAR_TLS_URL, PULSAR_CA_FILE, PULSAR_TOKEN_FILE,
# PULSAR_ADMIN_TOKEN_FILE and PULSAR_SECRET_KEY_FILE (to sign other tokens
# with scripts/pulsar/jwt.py). Later starts of that DIR keep it secure.
#
# Ports are taken free from the OS; the broker binds and advertises 127.0.0.1
# only, or PULSAR_BIND when set (the nemesis campaign binds it to a bridge of
# its own). A restart of the same DIR keeps its ports and takes seconds: the
# JVM runs with scripts/pulsar/reuseaddr.c preloaded (built into the cache
# with the system's cc), so ports left in TIME_WAIT do not hold it up.
#
# Start-up is mostly class loading: the first broker that stops cleanly
# leaves a class-data-sharing archive of every class it loaded in the cache
# (JDK 17's -XX:ArchiveClassesAtExit), and later starts map it instead of
# parsing and verifying ~20,000 classes again (a quiet start: 9.1 s without,
# 5.5 s with, together with C1 only). An archive the JVM cannot use (another
# JDK, other jars) is ignored with a warning and costs nothing.
# PULSAR_EXTRA_JAVA_OPTS is appended to the JVM's options (the nemesis
# campaign adds -XX:TieredStopAtLevel=1: its many restarts start faster
# without C2, and its rates need no C2 code).
#
# PULSAR_BOOKKEEPER_DIR puts the bookie's directory (its journal and its
# ledgers; standalone keeps both there) somewhere else than DIR/data/bookkeeper:
# tests/fence.rs puts it on a firstseen-crashfs mount and freezes it, which
# stalls the bookie's journal while the broker keeps accepting writes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

version=$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$here/pulsar/pom.xml")
cache="${FIRSTSEEN_CACHE:-$HOME/.cache/firstseen}/pulsar-$version"

bind_ip=${PULSAR_BIND:-127.0.0.1}

# The class-data-sharing archive, one per JDK (its path names the version).
cds_archive() {
  echo "$cache/classes-$(java -version 2>&1 | cksum | cut -d' ' -f1).jsa"
}

# The SO_REUSEADDR shim (see scripts/pulsar/reuseaddr.c), built once.
reuseaddr_lib() {
  local lib="$cache/reuseaddr.so"
  if [ ! -f "$lib" ] || [ "$here/pulsar/reuseaddr.c" -nt "$lib" ]; then
    mkdir -p "$cache"
    cc -shared -fPIC -O2 -o "$lib" "$here/pulsar/reuseaddr.c" -ldl
  fi
  echo "$lib"
}

install() {
  if [ -f "$cache/.complete" ]; then return 0; fi
  command -v mvn >/dev/null || { log "mvn is missing: apt-get install maven"; exit 1; }
  log "resolving Apache Pulsar $version from Maven Central into $cache (first run only)"
  rm -rf "$cache"; mkdir -p "$cache/lib"
  mvn -q -B -s "$here/pulsar/settings.xml" -f "$here/pulsar/pom.xml" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$cache/lib"
  touch "$cache/.complete"
}

start() {
  local dir=$1
  install
  mkdir -p "$dir/data" "$dir/conf"
  dir=$(cd "$dir" && pwd)
  local broker_port web_port bk_port tls_port
  # A restart of the same DIR keeps its ports, so clients can reconnect to
  # the address they knew (the outage test relies on it).
  if [ -f "$dir/ports" ]; then
    read -r broker_port web_port bk_port tls_port < "$dir/ports"
    # Ports left in TIME_WAIT do not matter (the shim binds with
    # SO_REUSEADDR); one something still listens on does.
    local p
    for p in $broker_port $web_port $bk_port $tls_port; do
      wait_for 30 port_unbound "$p" || { log "port $p is still in use"; exit 1; }
    done
  else
    broker_port=$(free_port); web_port=$(free_port); bk_port=$(free_port); tls_port=""
    [ "${PULSAR_SECURE:-0}" = 1 ] && tls_port=$(free_port)
    echo "$broker_port $web_port $bk_port $tls_port" > "$dir/ports"
  fi
  local secure_conf=""
  if [ -n "$tls_port" ]; then
    make_secure "$dir/secure"
    secure_conf="
# PULSAR_SECURE=1: token authentication on every port, TLS on brokerServicePortTls.
brokerServicePortTls=$tls_port
tlsCertificateFilePath=$dir/secure/broker.crt
tlsKeyFilePath=$dir/secure/broker.key
tlsTrustCertsFilePath=$dir/secure/ca.crt
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken
tokenSecretKey=file://$dir/secure/secret.key
superUserRoles=admin
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=file://$dir/secure/admin.token
# A connection whose token expires is challenged within this many seconds,
# which lets a test watch a client pick up a rotated token.
authenticationRefreshCheckSeconds=5"
  fi
  # Only the keys that differ from the broker's defaults. Broker deduplication
  # is on so that the pulsar crate's own resends after a reconnect are dropped
  # by the broker (docs/exactly-once.md explains why that matters).
  cat > "$dir/conf/standalone.conf" <<CONF
clusterName=standalone
bindAddress=$bind_ip
advertisedAddress=$bind_ip
brokerServicePort=$broker_port
webServicePort=$web_port
brokerDeduplicationEnabled=true
# Keep messages that no subscription has read yet. With Pulsar's defaults
# (retention 0, inactive topics deleted) a closed ledger without subscribers
# is trimmed, which would look like loss to anyone reading the topic later.
defaultRetentionTimeInMinutes=-1
defaultRetentionSizeInMB=-1
brokerDeleteInactiveTopicsEnabled=false
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
functionsWorkerEnabled=false
transactionCoordinatorEnabled=false
systemTopicEnabled=true
topicLevelPoliciesEnabled=true
webSocketServiceEnabled=false
brokerShutdownTimeoutMs=3000
# A client that stops answering pings (a paused leader) loses its
# connection, and with it its exclusive producers, after about twice this:
# 10 s instead of the default 60 s before a successor can publish.
keepAliveIntervalSeconds=5
# BookKeeper reads this file too. Without it the bookie takes a random port
# from the ephemeral range on its first start and must bind that same port
# on every restart (it is in the bookie's cookie), where any client socket
# may hold it: a restart under load failed with "Address already in use".
# With it the bookie binds --bookkeeper-port, below the ephemeral range.
allowEphemeralPorts=true
# The bookie goes read-only when its disk is this full, as a fraction of
# the whole filesystem (default 0.95). Tests, the campaign and the demo
# share one large disk with build output: CI's failed with 4.5 GB free
# of 265 GB (0.983), every write refused. Read-only here means 0.1% free;
# the nodes' own disk reserve (docs/operations.md) is the guard that
# matters for firstseen, and a production bookie keeps its default.
# PULSAR_DISK_USAGE_THRESHOLD sets another (0.5 shows the bookie reading it).
diskUsageThreshold=${PULSAR_DISK_USAGE_THRESHOLD:-0.999}
diskUsageWarnThreshold=${PULSAR_DISK_USAGE_THRESHOLD:-0.999}
diskUsageLwmThreshold=${PULSAR_DISK_USAGE_THRESHOLD:-0.999}
$secure_conf
CONF
  cat > "$dir/conf/log4j2.xml" <<'LOG'
<Configuration status="warn">
  <Appenders><Console name="out" target="SYSTEM_OUT"><PatternLayout pattern="%d{HH:mm:ss.SSS} %-5level %c{1} - %msg%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="out"/></Root>
    <Logger name="org.apache.pulsar.broker.PulsarService" level="info"/></Loggers>
</Configuration>
LOG
  local shim; shim=$(reuseaddr_lib)
  local cds archive; archive=$(cds_archive)
  if [ -f "$archive" ]; then
    cds="-XX:SharedArchiveFile=$archive"
  else
    # Written when this JVM exits cleanly; stop() moves it into the cache.
    rm -f "$dir/classes.jsa"
    cds="-XX:ArchiveClassesAtExit=$dir/classes.jsa"
  fi
  local attempt pid log_from
  for attempt in 1 2 3 4 5 6; do
    # This start's failure must not be judged by an earlier start's log lines.
    log_from=$(stat -c %s "$dir/pulsar.log" 2>/dev/null || echo 0)
    # A 1.5 GB heap ceiling (the heap grows only as used): the shared test
    # broker, serving the whole suite, ran out of a 768 MB heap once
    # (OutOfMemoryError in the bookie's write path) late in a run.
    (
      cd "$dir"
      LD_PRELOAD="$shim${LD_PRELOAD:+:$LD_PRELOAD}" exec java ${PULSAR_JAVA_OPTS:--Xms256m -Xmx1536m -XX:MaxDirectMemorySize=512m -XX:+UseG1GC} \
        $cds ${PULSAR_EXTRA_JAVA_OPTS:-} \
        -Dlog4j2.configurationFile="$dir/conf/log4j2.xml" \
        -Dpulsar.log.dir="$dir/logs" \
        -Djava.net.preferIPv4Stack=true \
        --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
        --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/sun.net=ALL-UNNAMED \
        -cp "$cache/lib/*" org.apache.pulsar.PulsarStandaloneStarter \
        --config "$dir/conf/standalone.conf" --no-functions-worker --no-stream-storage \
        --bookkeeper-port "$bk_port" --bookkeeper-dir "${PULSAR_BOOKKEEPER_DIR:-$dir/data/bookkeeper}" \
        --metadata-dir "$dir/data/metadata" --advertised-address "$bind_ip"
    ) >> "$dir/pulsar.log" 2>&1 &
    pid=$!
    echo "$pid" > "$dir/pid"
    log "Pulsar standalone starting (pid $pid, broker $bind_ip:$broker_port, admin $bind_ip:$web_port); log: $dir/pulsar.log"
    # Ready means the default namespace exists: the starter creates it last.
    if wait_ready "${PULSAR_START_TIMEOUT:-240}" "$web_port" "$pid" "$dir/pulsar.log" "$log_from"; then
      break
    fi
    # A port the last run's connections still hold in a state SO_REUSEADDR
    # does not cover (seen once under load, right after a stop): wait a
    # little and try again, on the same ports clients know.
    if [ "$attempt" -lt 6 ] && tail -c +"$((log_from + 1))" "$dir/pulsar.log" | grep -q "Address already in use"; then
      log "a Pulsar port is still in use; retrying in 5 s (attempt $attempt)"
      STOP_TIMEOUT=30 stop_pids "$pid" || true
      sleep 5
      continue
    fi
    log "Pulsar did not become ready; last log lines:"; tail -30 "$dir/pulsar.log" >&2
    stop "$dir"; exit 1
  done
  cat > "$dir/env" <<ENV
export PULSAR_URL=pulsar://$bind_ip:$broker_port
export PULSAR_ADMIN_URL=http://$bind_ip:$web_port
export PULSAR_PID=$pid
ENV
  if [ -n "$tls_port" ]; then
    cat >> "$dir/env" <<ENV
export PULSAR_TLS_URL=pulsar+ssl://$bind_ip:$tls_port
export PULSAR_CA_FILE=$dir/secure/ca.crt
export PULSAR_TOKEN_FILE=$dir/secure/firstseen.token
export PULSAR_ADMIN_TOKEN_FILE=$dir/secure/admin.token
export PULSAR_SECRET_KEY_FILE=$dir/secure/secret.key
ENV
  fi
  log "Pulsar ready: pulsar://$bind_ip:$broker_port"
}

ready() {
  local auth=()
  [ -f "$dir/secure/admin.token" ] && auth=(-H "Authorization: Bearer $(cat "$dir/secure/admin.token")")
  kill -0 "$2" && curl -fsS "${auth[@]}" "http://$bind_ip:$1/admin/v2/namespaces/public" | grep -q 'public/default'
}

# The CA, broker certificate, token key and tokens of a secure broker, made
# once per DIR with the openssl CLI and scripts/pulsar/jwt.py.
make_secure() {
  local s=$1
  [ -f "$s/.complete" ] && return 0
  command -v openssl >/dev/null || { log "openssl is missing: apt-get install openssl"; exit 1; }
  mkdir -p "$s"
  (
    cd "$s"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
      -subj "/CN=firstseen test Pulsar CA" 2>/dev/null
    # PKCS#8, which the broker requires for its key.
    openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr \
      -subj "/CN=pulsar-broker" 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' "$bind_ip" > broker.ext
    openssl x509 -req -in broker.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out broker.crt -days 30 -extfile broker.ext 2>/dev/null
    python3 "$here/pulsar/jwt.py" key secret.key
    python3 "$here/pulsar/jwt.py" token secret.key admin > admin.token
    python3 "$here/pulsar/jwt.py" token secret.key firstseen > firstseen.token
    chmod 600 ca.key broker.key admin.token firstseen.token
    touch .complete
  )
}

# Polls ready() for at most $1 seconds; gives up at once when the broker has
# died or logged that it failed to start, rather than waiting out the limit.
wait_ready() {
  local limit=$1 web_port=$2 pid=$3 log=$4 from=$5
  local deadline=$(( $(date +%s) + limit ))
  until ready "$web_port" "$pid" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null || tail -c +"$((from + 1))" "$log" | grep -q "Failed to start pulsar service" \
      || [ "$(date +%s)" -ge "$deadline" ]; then
      return 1
    fi
    sleep 0.5
  done
}

stop() {
  local dir=$1 pid clean=0
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    STOP_TIMEOUT=30 stop_pids "$pid" && clean=1
  fi
  rm -f "$dir/pid"
  # A clean exit leaves the class archive (see start); one from a JVM that
  # had to be killed may be cut short and is dropped. The first archive to
  # arrive is kept for every later start, renamed into place whole so a
  # concurrent start never maps a half-copied file.
  local archive; archive=$(cds_archive)
  if [ "$clean" = 1 ] && [ -s "$dir/classes.jsa" ] && [ ! -f "$archive" ]; then
    cp "$dir/classes.jsa" "$archive.$$" && mv -f "$archive.$$" "$archive" \
      && log "class-data-sharing archive for later Pulsar starts: $archive"
  fi
  rm -f "$dir/classes.jsa" "$archive.$$"
}

cmd=${1:-}; shift || true
case "$cmd" in
  install) install ;;
  start) start "${1:?usage: pulsar.sh start DIR}" ;;
  stop) stop "${1:?usage: pulsar.sh stop DIR}" ;;
  *) echo "usage: pulsar.sh install | start DIR | stop DIR" >&2; exit 2 ;;
esac
