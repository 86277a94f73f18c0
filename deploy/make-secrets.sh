#!/usr/bin/env bash
# Makes what a firstseen cluster must not take from any repository: the
# cluster secret and the peers' TLS material, once, at install.
#
#   deploy/make-secrets.sh DIR [NODES] [SERVER_NAME]
#
# DIR gets (nothing already there is overwritten):
#   cluster.secret          32 random bytes, base64: the same file on every node
#   ca.crt                  the cluster's own CA, trusted by every node
#   ca.key                  its key: keep it offline; it signs the certificate
#                           of a node added later (run this again with a larger
#                           NODES and the existing CA is reused)
#   node-<i>.crt, .key      node i's certificate (SAN: SERVER_NAME, usable as
#                           server and client, the peers' TLS being mutual)
#
# NODES defaults to 3, SERVER_NAME to firstseen-peer: the name every node's
# certificate carries and `cluster.tls.server_name` names (docs/operations.md,
# "Security"). Keys are elliptic-curve P-256, certificates valid 825 days.
# Requires the openssl command.
set -euo pipefail

dir=${1:?usage: deploy/make-secrets.sh DIR [NODES] [SERVER_NAME]}
nodes=${2:-3}
name=${3:-firstseen-peer}
days=825
command -v openssl >/dev/null || { echo "make-secrets: openssl is missing" >&2; exit 2; }
case $nodes in '' | *[!0-9]*) echo "make-secrets: NODES must be a number" >&2; exit 2 ;; esac

mkdir -p "$dir"
cd "$dir"
umask 077
made=()

if [ ! -s cluster.secret ]; then
  head -c 32 /dev/urandom | base64 > cluster.secret
  made+=(cluster.secret)
fi

if [ ! -s ca.key ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
  openssl req -x509 -new -key ca.key -sha256 -days "$days" -out ca.crt \
    -subj "/CN=firstseen cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  made+=(ca.key ca.crt)
fi

ext=$(mktemp)
trap 'rm -f "$ext" node-*.csr' EXIT
cat > "$ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$name
EOF
for i in $(seq 1 "$nodes"); do
  [ -s "node-$i.crt" ] && continue
  openssl ecparam -name prime256v1 -genkey -noout -out "node-$i.key.sec1" 2>/dev/null
  # PKCS#8, the form every TLS stack reads.
  openssl pkcs8 -topk8 -nocrypt -in "node-$i.key.sec1" -out "node-$i.key"
  rm -f "node-$i.key.sec1"
  openssl req -new -key "node-$i.key" -subj "/CN=firstseen node $i" -out "node-$i.csr" 2>/dev/null
  openssl x509 -req -in "node-$i.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days "$days" -sha256 -extfile "$ext" -out "node-$i.crt" 2>/dev/null
  made+=("node-$i.crt" "node-$i.key")
done
rm -f ca.srl
# The certificates are public; the keys and the secret stay 0600.
chmod 0644 ca.crt node-*.crt

if [ ${#made[@]} -eq 0 ]; then
  echo "make-secrets: everything was already in $dir"
else
  echo "make-secrets: made ${made[*]} in $dir"
fi
