#!/usr/bin/env python3
"""Reads a Pulsar topic from the start with the official Python client and
prints what a user would check, as JSON: how many messages, how many per key,
and the firstseen-seq numbers in topic order.

It stops at the topic's last message (asked of the broker first), so it never
waits on a quiet topic longer than --idle seconds.

A message whose properties name the transitdata envelope (protobuf-schema =
mqtt-raw) is decoded with Python's protobuf and a module protoc generates from
proto/transitdata.proto: independently of firstseen's encoder. Its topic and
payload are the envelope's, and --envelope reports every way it differs from
what a transitdata consumer expects.
"""
import argparse
import collections
import json
import logging
import os
import sys

import pulsar

import envelope


def envelope_module():
    return envelope.module()


def envelope_problems(msg, props, envelope):
    """How one envelope differs from what the transitdata contract says."""
    problems = []
    if props.get("schema-version") != "1":
        problems.append(f"schema-version property {props.get('schema-version')!r}")
    if envelope.schema_version != 1:
        problems.append("schema version in the payload is not 1")
    ts = props.get("source-ts")
    if ts is None or not envelope.HasField("message_received_timestamp_ms"):
        problems.append("no source-ts or no receive time in the payload")
    else:
        if int(ts) != envelope.message_received_timestamp_ms:
            problems.append(f"source-ts {ts} != payload time {envelope.message_received_timestamp_ms}")
        if msg.event_timestamp() != int(ts):
            problems.append(f"event time {msg.event_timestamp()} != source-ts {ts}")
    if props.get("mqtt-topic") != envelope.topic:
        problems.append("mqtt-topic property differs from the payload's topic")
    for own in ("firstseen-seq", "firstseen-key", "firstseen-node", "firstseen-first-seen-ms"):
        if own not in props:
            problems.append(f"no {own}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--with-payloads", action="store_true", help="include topic+payload digests")
    ap.add_argument("--with-properties", action="store_true",
                    help="include every message's properties (in topic order)")
    ap.add_argument("--ca-file", help="CA to trust for a pulsar+ssl:// URL")
    ap.add_argument("--token-file", help="JWT to authenticate with")
    ap.add_argument("--skip-key", action="append", default=[],
                    help="leave out messages with this firstseen-key (a foreign writer's "
                    "that a test planted), counted as skipped")
    ap.add_argument("--skip-key-prefix", action="append", default=[],
                    help="leave out messages whose firstseen-key starts with this, "
                    "counted as skipped")
    ap.add_argument("--envelope", action="store_true",
                    help="expect every message to be a transitdata envelope and list "
                    "every difference from its contract")
    ap.add_argument("--listener", help="the broker's advertised listener to be sent to "
                    "(deploy/compose: \"external\" from the host)")
    args = ap.parse_args()

    options = {}
    if args.ca_file:
        options["tls_trust_certs_file_path"] = args.ca_file
        options["tls_validate_hostname"] = True
    if args.token_file:
        with open(args.token_file) as f:
            options["authentication"] = pulsar.AuthenticationToken(f.read().strip())
    if args.listener:
        options["listener_name"] = args.listener
    client = pulsar.Client(args.url, logger=logging.getLogger("silent"), **options)
    logging.getLogger("silent").setLevel(logging.ERROR)
    reader = client.create_reader(args.topic, pulsar.MessageId.earliest)
    keys = collections.Counter()
    seqs = []
    pairs = []
    properties = []
    count = 0
    skipped = 0
    pb = None
    envelopes = 0
    problems = []
    while reader.has_message_available():
        try:
            msg = reader.read_next(int(args.idle * 1000))
        except Exception as e:  # the client raises Timeout as a plain exception
            print(f"read stopped early: {e}", file=sys.stderr)
            break
        props = msg.properties()
        key = props.get("firstseen-key") or ""
        if key in args.skip_key or any(key.startswith(p) for p in args.skip_key_prefix):
            skipped += 1
            continue
        count += 1
        keys[props.get("firstseen-key")] += 1
        seq = props.get("firstseen-seq")
        seqs.append(int(seq) if seq is not None else None)
        topic, payload = props.get("mqtt-topic"), msg.data()
        if props.get("protobuf-schema") == "mqtt-raw":
            pb = pb or envelope_module()
            envelope = pb.RawMessage()
            envelope.ParseFromString(msg.data())
            envelopes += 1
            topic, payload = envelope.topic, envelope.payload
            if args.envelope:
                problems += [f"seq {seq}: {p}" for p in envelope_problems(msg, props, envelope)]
        elif args.envelope:
            problems.append(f"seq {seq}: not an envelope")
        if args.with_payloads:
            pairs.append([topic, payload.decode("utf-8", "replace")])
        if args.with_properties:
            properties.append(dict(props))
    out = {
        "count": count,
        "distinct_keys": len(keys),
        "keys_with_copies": sum(1 for c in keys.values() if c > 1),
        "seqs": seqs,
        "skipped": skipped,
        "envelopes": envelopes,
        "envelope_problems": problems[:20],
    }
    if args.with_payloads:
        out["pairs"] = pairs
    if args.with_properties:
        out["properties"] = properties
    print(json.dumps(out))
    sys.stdout.flush()
    # The client's C++ teardown sometimes aborts the process after the work
    # is done ("terminate called without an active exception"); nothing is
    # left to close that matters to a reader, so skip it.
    os._exit(0)


if __name__ == "__main__":
    main()
