# Shared helpers for firstseen's scripts. Sourced, not executed.

# Prints a TCP port on 127.0.0.1 that is free right now. The OS picks it, so
# parallel runs never collide on a fixed number.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
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
