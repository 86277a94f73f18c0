#!/usr/bin/env python3
"""Stand-ins for the pipeline HSL runs today, for the shadow demo and tests.

Written here from the public description of HSLdevcom/mqtt-pulsar-gateway and
transitdata-hfp-deduplicator, not from their code. Each message is wrapped in
the transitdata `mqtt-raw` envelope with Python's protobuf, independently of
firstseen's encoder.

  gateway  one MQTT->Pulsar gateway: subscribes, wraps each message in the
           envelope stamped with its own receive time, sends it, and acks
           upstream without waiting for Pulsar (at most once, as a naive
           bridge does). Run two on one topic: every message arrives twice.
  dedup    the deduplicator: reads the gateways' topic, keeps the first copy
           of each (topic, payload) in a bounded in-memory cache that a
           restart forgets, and writes it to its own topic.
  write    writes "TOPIC PAYLOAD" lines from stdin to a topic, raw (as
           firstseen writes them) or enveloped, with planted differences: a
           line left out (--drop N) or written twice (--double N).

Every command stops by itself (gateway and dedup at SIGTERM or --seconds).
"""
import argparse
import collections
import hashlib
import logging
import os
import signal
import sys
import threading
import time

import pulsar

import envelope


def envelope_module():
    return envelope.module()


def client(url):
    log = logging.getLogger("standin")
    log.setLevel(logging.ERROR)
    return pulsar.Client(url, logger=log, operation_timeout_seconds=10)


def enveloped(pb, topic, payload, now_ms):
    m = pb.RawMessage()
    m.schema_version = 1
    m.topic = topic
    m.payload = payload
    m.message_received_timestamp_ms = now_ms
    props = {"protobuf-schema": "mqtt-raw", "schema-version": "1", "source-ts": str(now_ms)}
    return m.SerializeToString(), props


def stop_event(seconds):
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    if seconds:
        threading.Timer(seconds, done.set).start()
    return done


def gateway(args):
    import paho.mqtt.client as mqtt
    pb = envelope_module()
    c = client(args.url)
    producer = c.create_producer(args.topic, batching_enabled=True,
                                 batching_max_publish_delay_ms=5, block_if_queue_full=True)
    sent = [0]

    def on_message(_c, _u, msg):
        now = int(time.time() * 1000)
        body, props = enveloped(pb, msg.topic, msg.payload, now)
        producer.send_async(body, None, properties=props, event_timestamp=now)
        sent[0] += 1

    def on_connect(cl, _u, _f, rc, _p=None):
        cl.subscribe(args.filter, qos=1)

    m = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=args.client_id,
                    clean_session=True)
    m.on_message = on_message
    m.on_connect = on_connect
    m.connect("127.0.0.1", args.mqtt_port)
    m.loop_start()
    done = stop_event(args.seconds)
    done.wait()
    m.loop_stop()
    producer.flush()
    print(f"gateway {args.client_id}: sent {sent[0]}", flush=True)
    os._exit(0)


def dedup(args):
    c = client(args.url)
    consumer = c.subscribe(args.source, args.subscription,
                           consumer_type=pulsar.ConsumerType.Exclusive,
                           initial_position=pulsar.InitialPosition.Earliest)
    producer = c.create_producer(args.sink, batching_enabled=True,
                                 batching_max_publish_delay_ms=5, block_if_queue_full=True)
    pb = envelope_module()
    # Bounded and in memory: the oldest entry goes when it is full, and a
    # restart starts empty.
    seen = collections.OrderedDict()
    done = stop_event(args.seconds)
    kept = dropped = 0
    while not done.is_set():
        try:
            msg = consumer.receive(200)
        except Exception:  # the client's Timeout is a plain exception
            continue
        m = pb.RawMessage()
        m.ParseFromString(msg.data())
        digest = hashlib.blake2b(m.topic.encode() + b"\0" + m.payload, digest_size=16).digest()
        if digest in seen:
            dropped += 1
        else:
            seen[digest] = True
            if len(seen) > args.cache:
                seen.popitem(last=False)
            props = dict(msg.properties())
            producer.send_async(msg.data(), None, properties=props,
                                event_timestamp=msg.event_timestamp())
            kept += 1
        consumer.acknowledge(msg)
    producer.flush()
    print(f"dedup: kept {kept}, dropped {dropped}", flush=True)
    os._exit(0)


def write(args):
    pb = envelope_module() if args.format == "transitdata" else None
    c = client(args.url)
    producer = c.create_producer(args.topic, batching_enabled=False)
    lines = [l.rstrip("\n") for l in sys.stdin if l.strip()]
    now = args.start_ms or int(time.time() * 1000)
    written = 0
    for i, line in enumerate(lines):
        if i in args.drop:
            continue
        topic, payload = line.split(" ", 1)
        for _ in range(2 if i in args.double else 1):
            t = now + i
            if pb:
                body, props = enveloped(pb, topic, payload.encode(), t)
            else:
                body, props = payload.encode(), {"mqtt-topic": topic}
            producer.send(body, properties=props, event_timestamp=t)
            written += 1
    producer.flush()
    print(f"written {written}", flush=True)
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gateway")
    g.add_argument("--url", required=True)
    g.add_argument("--topic", required=True)
    g.add_argument("--mqtt-port", type=int, required=True)
    g.add_argument("--filter", default="#")
    g.add_argument("--client-id", required=True)
    g.add_argument("--seconds", type=float, default=0)
    d = sub.add_parser("dedup")
    d.add_argument("--url", required=True)
    d.add_argument("--source", required=True)
    d.add_argument("--sink", required=True)
    d.add_argument("--subscription", default="deduplicator")
    d.add_argument("--cache", type=int, default=250_000)
    d.add_argument("--seconds", type=float, default=0)
    w = sub.add_parser("write")
    w.add_argument("--url", required=True)
    w.add_argument("--topic", required=True)
    w.add_argument("--format", choices=["raw", "transitdata"], default="raw")
    w.add_argument("--start-ms", type=int, default=0,
                   help="time of the first line (line i at start + i ms); default now")
    w.add_argument("--drop", type=int, action="append", default=[])
    w.add_argument("--double", type=int, action="append", default=[])
    args = ap.parse_args()
    {"gateway": gateway, "dedup": dedup, "write": write}[args.cmd](args)


if __name__ == "__main__":
    main()
