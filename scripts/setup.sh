#!/usr/bin/env bash
# Installs everything firstseen's demo and tests need on a fresh Debian machine
# with Rust, Java 17, Maven and Python 3 (the base image). Idempotent: a second
# run only checks.
#
#   apt:   mosquitto, mosquitto-clients (upstream broker and CLI tools),
#          protobuf-compiler (the pulsar crate's build needs protoc), curl,
#          openssl (the TLS test makes its certificates with it)
#   apt:   chromium (the status page's browser test)
#   apt:   fuse3 (fusermount3, for firstseen-crashfs when the direct mount
#          of /dev/fuse is not permitted), strace (the fsync count check),
#          faketime (libfaketime: clock skew and jumps on one node),
#          iptables (the nemesis campaign's partitions)
#   pip:   paho-mqtt (independent MQTT publisher), pulsar-client (official
#          Pulsar client, the independent reader in tests), playwright (drives
#          Debian's chromium), prometheus-client (parses /metrics), pyyaml
#          (reads the deploy manifests in tests), kubernetes-validate (the
#          manifests against the Kubernetes API's own schemas, offline),
#          protobuf (decodes the transitdata envelope independently of the
#          project's encoder, with a module protoc generates)
#   maven: Apache Pulsar standalone (scripts/pulsar.sh install)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
. "$here/lib.sh"

need_apt=()
command -v mosquitto >/dev/null || need_apt+=(mosquitto)
command -v mosquitto_pub >/dev/null || need_apt+=(mosquitto-clients)
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
command -v curl >/dev/null || need_apt+=(curl)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v strace >/dev/null || need_apt+=(strace)
[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || need_apt+=(faketime)
command -v iptables >/dev/null || need_apt+=(iptables)
# Debian's Chromium, driven by Playwright, is the status page test's browser.
[ -x /usr/bin/chromium ] || need_apt+=(chromium fonts-dejavu-core)
command -v mvn >/dev/null || need_apt+=(maven)
command -v java >/dev/null || need_apt+=(openjdk-17-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing with apt: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian's package starts a system-wide mosquitto on port 1883; firstseen's
# scripts run their own on free ports, so the system one is not needed.
if command -v systemctl >/dev/null && systemctl is-active --quiet mosquitto 2>/dev/null; then
  systemctl stop mosquitto 2>/dev/null || true
fi

if ! python3 -c 'import paho.mqtt, pulsar, playwright, prometheus_client, yaml, kubernetes_validate, google.protobuf' 2>/dev/null; then
  log "installing Python packages: paho-mqtt, pulsar-client, playwright, prometheus-client, pyyaml, kubernetes-validate, protobuf"
  # playwright is only the driver: it runs Debian's /usr/bin/chromium and
  # never downloads a browser of its own.
  python3 -m pip install -q --disable-pip-version-check "paho-mqtt==2.2.0" "pulsar-client==3.13.0" \
    "playwright==1.49.1" "prometheus-client==0.21.1" "pyyaml==6.0.3" "kubernetes-validate==1.37.0" \
    "protobuf==4.25.5"
fi

"$here/pulsar.sh" install
log "setup complete"
