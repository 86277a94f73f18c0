#!/usr/bin/env python3
"""Reads a Pulsar topic from the start with the official Python client and
prints what a user would check, as JSON: how many messages, how many per key,
and the firstseen-seq numbers in topic order.

It stops at the topic's last message (asked of the broker first), so it never
waits on a quiet topic longer than --idle seconds.
"""
import argparse
import collections
import json
import logging
import os
import sys

import pulsar


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
    while reader.has_message_available():
        try:
            msg = reader.read_next(int(args.idle * 1000))
        except Exception as e:  # the client raises Timeout as a plain exception
            print(f"read stopped early: {e}", file=sys.stderr)
            break
        props = msg.properties()
        if props.get("firstseen-key") in args.skip_key:
            skipped += 1
            continue
        count += 1
        keys[props.get("firstseen-key")] += 1
        seq = props.get("firstseen-seq")
        seqs.append(int(seq) if seq is not None else None)
        if args.with_payloads:
            pairs.append([props.get("mqtt-topic"), msg.data().decode("utf-8", "replace")])
        if args.with_properties:
            properties.append(dict(props))
    out = {
        "count": count,
        "distinct_keys": len(keys),
        "keys_with_copies": sum(1 for c in keys.values() if c > 1),
        "seqs": seqs,
        "skipped": skipped,
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
