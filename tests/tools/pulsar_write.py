#!/usr/bin/env python3
"""Writes messages labelled like firstseen's into a Pulsar topic with the
official client: one per `KEY:SEQ` argument. Used to give `firstseen verify`
a topic with known defects."""
import argparse
import logging
import os
import time

import pulsar

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--url", required=True)
ap.add_argument("--topic", required=True)
ap.add_argument("--producer-name", help="name the producer (firstseen-… to write as if "
                "firstseen had; by default the client picks one, and firstseen counts the "
                "messages as a foreign writer's)")
ap.add_argument("--retry-for", type=float, default=0.0,
                help="keep trying for this many seconds while the topic is held by an "
                "exclusive producer, one label per producer, and print how many got in")
ap.add_argument("--seqs", nargs=2, type=int, metavar=("FIRST", "LAST"),
                help="also write one message for each sequence FIRST..=LAST, keyed "
                "forged<seq>, as a forger numbering past the cluster's tail would")
ap.add_argument("--flood", type=int, default=0,
                help="also write this many messages without firstseen's properties, "
                "batched: a topic whose end holds a mass of someone else's messages")
ap.add_argument("labels", nargs="*")
args = ap.parse_args()
if args.seqs:
    first, last = args.seqs
    args.labels += [f"{'%064x' % (0xf0f0 << 200 | s)}:{s}" for s in range(first, last + 1)]
log = logging.getLogger("pulsar-write")
log.setLevel(logging.ERROR)
client = pulsar.Client(args.url, logger=log, operation_timeout_seconds=5)
options = {"producer_name": args.producer_name} if args.producer_name else {}


def write(labels):
    producer = client.create_producer(args.topic, **options)
    for label in labels:
        key, seq = label.split(":")
        producer.send(b"x", properties={"firstseen-key": key, "firstseen-seq": seq})
    producer.flush()
    producer.close()


if args.flood:
    producer = client.create_producer(
        args.topic, batching_enabled=True, batching_max_messages=1000,
        batching_max_publish_delay_ms=10, block_if_queue_full=True,
        max_pending_messages=100000, **options)
    for _ in range(args.flood):
        producer.send_async(b"foreign", None)
    producer.flush()
    producer.close()
if args.retry_for <= 0:
    if args.labels:
        write(args.labels)
else:
    # A producer is refused while firstseen's exclusive one holds the topic;
    # each label goes in the moment nobody does (a leader change).
    deadline = time.time() + args.retry_for
    written = 0
    for label in args.labels:
        while time.time() < deadline:
            try:
                write([label])
                written += 1
                break
            except Exception:
                time.sleep(0.02)
    print(f"written {written}", flush=True)
# Skip the client's C++ teardown, which sometimes aborts after the work is
# done; the producer is flushed and closed.
os._exit(0)
