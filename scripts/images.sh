#!/usr/bin/env bash
# Builds, with podman and without any image registry, every image that
# deploy/compose/docker-compose.yml needs:
#
#   docker.io/library/debian:bookworm-slim  a Debian bookworm root made with
#                                           debootstrap from Debian's packages
#   docker.io/library/rust:1-bookworm       that root with gcc and this
#                                           machine's Rust toolchain
#   localhost/firstseen:latest              deploy/Dockerfile, unchanged
#   localhost/firstseen/mosquitto:2         Debian's mosquitto (stands in for
#                                           eclipse-mosquitto:2)
#   localhost/firstseen/pulsar:VERSION      the Maven Central jars that
#                                           scripts/pulsar.sh resolves, on a
#                                           Java runtime (stands in for
#                                           apachepulsar/pulsar:VERSION)
#
#   scripts/images.sh              build what is missing or out of date
#   scripts/images.sh --rebuild    build everything again
#   scripts/images.sh pulsar ...   only these: base, rust, mosquitto, pulsar, firstseen
#   scripts/images.sh env          print the export that makes podman by hand
#                                  use the same settings
#
# The firstseen image is built every time (podman's layer cache and the
# Dockerfile's cache mounts make an unchanged tree take seconds and a
# changed one an incremental release build).
#
#   FIRSTSEEN_BINARY=target/debug/firstseen scripts/images.sh
#                                  the firstseen image from a binary the host
#                                  has just built, instead of compiling again
#                                  inside a container: deploy/Dockerfile's
#                                  runtime stage as it is, with that binary
#                                  copied in (CI does this; the host is Debian
#                                  bookworm like the image). The Rust build
#                                  image is then not needed and not built.
#
# The two base images take the names deploy/Dockerfile asks for, so the
# Dockerfile stays the one Docker users build against the public images.
# Mosquitto and Pulsar get names of their own, not the official ones, so
# that nothing on this machine mistakes them for the real images; the
# compose file takes them from MOSQUITTO_IMAGE and PULSAR_IMAGE
# (scripts/compose.sh sets both).
#
# Podman runs with runc and cgroupfs and without default ulimits
# (CONTAINERS_CONF, written below): with crun, systemd cgroups or the
# default ulimits, containers do not start on these machines.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
. "$here/lib.sh"

cache="${FIRSTSEEN_CACHE:-$HOME/.cache/firstseen}/images"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
pulsar_version=$(sed -n 's:.*<pulsar.version>\(.*\)</pulsar.version>.*:\1:p' "$here/pulsar/pom.xml")
mkdir -p "$cache"

# The podman settings every script here uses.
containers_conf() {
  cat > "$cache/containers.conf" <<'CONF'
[containers]
# podman's default RLIMIT_NOFILE cannot be set inside these machines.
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  echo "$cache/containers.conf"
}
CONTAINERS_CONF=$(containers_conf)
export CONTAINERS_CONF

if [ "${1:-}" = env ]; then
  echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
  exit 0
fi
rebuild=0
if [ "${1:-}" = --rebuild ]; then rebuild=1; shift; fi
only=("$@")
for w in "${only[@]}"; do
  case "$w" in base|rust|mosquitto|pulsar|firstseen) ;; *) log "unknown image $w (see the header of $0)"; exit 2 ;; esac
done

install_tools() {
  local need=()
  command -v podman >/dev/null || need+=(podman)
  command -v runc >/dev/null || need+=(runc)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing with apt: ${need[*]}"
    local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if ! command -v podman-compose >/dev/null; then
    log "installing podman-compose from PyPI"
    python3 -m pip install -q --disable-pip-version-check "podman-compose==1.2.0"
  fi
}

# Whether image $1 must be built: missing, or labelled with another input
# digest than $2 (so a changed Containerfile or toolchain rebuilds it).
stale() {
  [ "$rebuild" = 1 ] && return 0
  podman image exists "$1" || return 0
  [ -z "${2:-}" ] && return 1
  [ "$(podman image inspect --format '{{ index .Labels "firstseen.inputs" }}' "$1" 2>/dev/null)" != "$2" ]
}

# Runs build step $2 (image $1) unless other images were asked for.
step() {
  local which=$1 what=$2; shift 2
  if [ ${#only[@]} -gt 0 ] && [[ " ${only[*]} " != *" $which "* ]]; then return 0; fi
  local t0; t0=$(date +%s)
  "$@"
  log "$what: $(( $(date +%s) - t0 )) s"
}

base_image() {
  local name=docker.io/library/debian:bookworm-slim digest
  digest=$(cat /dev/null /usr/local/share/ca-certificates/*.crt 2>/dev/null | sha256sum | cut -c1-16)
  stale "$name" "$digest" || return 0
  log "making a Debian bookworm root with debootstrap ($mirror)"
  local dir="$cache/rootfs"
  rm -rf "$dir" "$dir.tar"
  mkdir -p "$cache/debs"
  debootstrap --variant=minbase --cache-dir="$cache/debs" bookworm "$dir" "$mirror" > "$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # The certificate authorities this machine adds to Debian's (an egress
  # proxy that re-signs TLS, a private registry mirror): without them cargo
  # inside the build cannot reach crates.io here. Installing ca-certificates
  # in an image built on this base picks them up, as it does on the host.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
  fi
  # What the slim image leaves out: the package lists and caches.
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
  tar -C "$dir" --numeric-owner -cf "$dir.tar" .
  podman import -q --change 'CMD ["bash"]' --change "LABEL firstseen.inputs=$digest" \
    --message "debootstrap bookworm minbase ($mirror)" "$dir.tar" "$name" >/dev/null
  rm -rf "$dir" "$dir.tar"
}

rust_image() {
  local name=docker.io/library/rust:1-bookworm sysroot version ctx
  sysroot=$(rustc --print sysroot)
  version=$(rustc --version)
  stale "$name" "$version" || return 0
  log "making the Rust build image from this machine's toolchain ($version)"
  ctx="$cache/rust-context"
  rm -rf "$ctx"; mkdir -p "$ctx/toolchain"
  # The compiler, cargo and the standard library; not the documentation.
  cp -a "$sysroot/bin" "$sysroot/lib" "$ctx/toolchain/"
  [ -d "$sysroot/libexec" ] && cp -a "$sysroot/libexec" "$ctx/toolchain/"
  cp "$here/images/rust.Containerfile" "$ctx/Containerfile"
  podman build -q --pull=never --label "firstseen.inputs=$version" -t "$name" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# Digest of the files an image is built from.
inputs() { cat "$@" | sha256sum | cut -c1-16; }

mosquitto_image() {
  local name=localhost/firstseen/mosquitto:2 digest
  digest=$(inputs "$here/images/mosquitto.Containerfile")
  stale "$name" "$digest" || return 0
  log "making the Mosquitto image from Debian's package"
  podman build -q --pull=never --label "firstseen.inputs=$digest" -t "$name" \
    -f "$here/images/mosquitto.Containerfile" "$here/images" >/dev/null
}

pulsar_image() {
  local name=localhost/firstseen/pulsar:$pulsar_version digest ctx lib
  digest=$(inputs "$here"/images/pulsar/* "$here/pulsar/pom.xml")
  stale "$name" "$digest" || return 0
  "$here/pulsar.sh" install
  lib="${FIRSTSEEN_CACHE:-$HOME/.cache/firstseen}/pulsar-$pulsar_version/lib"
  log "making the Pulsar $pulsar_version image from the Maven Central jars"
  ctx="$cache/pulsar-context"
  rm -rf "$ctx"; mkdir -p "$ctx"
  cp -al "$lib" "$ctx/lib" 2>/dev/null || cp -a "$lib" "$ctx/lib"
  cp "$here"/images/pulsar/* "$ctx/"
  podman build -q --pull=never --label "firstseen.inputs=$digest" -t "$name" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# The runtime stage of deploy/Dockerfile with a prebuilt binary: the stage
# is taken from the Dockerfile, so the two cannot drift apart.
firstseen_image_prebuilt() {
  local bin=$1 ctx
  [ -x "$bin" ] || { log "FIRSTSEEN_BINARY=$bin is not an executable"; exit 2; }
  log "building localhost/firstseen:latest from $bin and deploy/Dockerfile's runtime stage"
  ctx=$(mktemp -d)
  # Debug information is most of a debug build's size and no use in a container.
  strip -o "$ctx/firstseen" "$bin" 2>/dev/null || cp "$bin" "$ctx/firstseen"
  sed -n '/^FROM debian:bookworm-slim/,$p' "$root/deploy/Dockerfile" \
    | sed 's|^COPY --from=build /usr/local/bin/firstseen |COPY firstseen |' > "$ctx/Containerfile"
  grep -q '^COPY firstseen ' "$ctx/Containerfile" \
    || { log "deploy/Dockerfile's runtime stage no longer copies the binary as expected"; exit 1; }
  podman build -q --pull=never -t localhost/firstseen:latest "$ctx" > "$cache/firstseen-build.log" 2>&1 \
    || { log "the image build failed; last lines of $cache/firstseen-build.log:"; tail -40 "$cache/firstseen-build.log" >&2; rm -rf "$ctx"; exit 1; }
  rm -rf "$ctx"
}

firstseen_image() {
  if [ -n "${FIRSTSEEN_BINARY:-}" ]; then
    firstseen_image_prebuilt "$FIRSTSEEN_BINARY"
    return
  fi
  log "building localhost/firstseen:latest from deploy/Dockerfile"
  podman build --pull=never -f "$root/deploy/Dockerfile" -t localhost/firstseen:latest "$root" \
    > "$cache/firstseen-build.log" 2>&1 \
    || { log "the image build failed; last lines of $cache/firstseen-build.log:"; tail -40 "$cache/firstseen-build.log" >&2; exit 1; }
  # No `podman image prune` here: the untagged build-stage layers are the
  # layer cache of the next build.
}

install_tools
step base "base image" base_image
[ -n "${FIRSTSEEN_BINARY:-}" ] || step rust "Rust build image" rust_image
step mosquitto "Mosquitto image" mosquitto_image
step pulsar "Pulsar image" pulsar_image
step firstseen "firstseen image" firstseen_image
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
  | grep -E 'firstseen|debian:bookworm-slim|rust:1-bookworm' >&2
