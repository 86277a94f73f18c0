#!/usr/bin/env python3
"""Writes messages labelled like firstseen's into a Pulsar topic with the
official client: one per `KEY:SEQ` argument. Used to give `firstseen verify`
a topic with known defects."""
import argparse
import logging
import os

import pulsar

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--url", required=True)
ap.add_argument("--topic", required=True)
ap.add_argument("--producer-name", help="name the producer (firstseen-… to write as if "
                "firstseen had; by default the client picks one, and firstseen counts the "
                "messages as a foreign writer's)")
ap.add_argument("labels", nargs="+")
args = ap.parse_args()
log = logging.getLogger("pulsar-write")
log.setLevel(logging.ERROR)
client = pulsar.Client(args.url, logger=log)
options = {"producer_name": args.producer_name} if args.producer_name else {}
producer = client.create_producer(args.topic, **options)
for label in args.labels:
    key, seq = label.split(":")
    producer.send(b"x", properties={"firstseen-key": key, "firstseen-seq": seq})
producer.flush()
producer.close()
# Skip the client's C++ teardown, which sometimes aborts after the work is
# done; the producer is flushed and closed.
os._exit(0)
