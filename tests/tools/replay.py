#!/usr/bin/env python3
"""Replays an HFP capture into an MQTT broker with paho-mqtt.

Each line of the capture is `<timestamp> <topic> <json payload>`; the topic
runs up to the first " {". Messages are published at QoS 1 (by default) at the
recorded pace, or as fast as possible with --pace max, or at --pace RATE msg/s.
Every publish is awaited (PUBACK from the broker) before the script exits, and
a JSON summary is printed on stdout.

Upstream duplicates can be injected: --dup-every K publishes every K-th
message twice, as a second publisher of the same feed would.
"""
import argparse
import datetime as dt
import json
import re
import sys
import time

import paho.mqtt.client as mqtt


def parse(path, limit=None):
    out = []
    with open(path, "rb") as f:
        for raw in f.read().split(b"\n"):
            if not raw.strip():
                continue
            ts, rest = raw.split(b" ", 1)
            cut = rest.index(b" {")
            topic = rest[:cut].decode("utf-8")
            payload = rest[cut + 1:]
            when = dt.datetime.strptime(ts.decode(), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
            out.append((when, topic, payload))
            if limit and len(out) >= limit:
                break
    return out


def confirmed(info, timeout):
    """Whether the broker confirmed the publish within `timeout` seconds.
    paho sends an unconfirmed QoS 1 publish again after a reconnect (a broker
    restart); one made while the connection was down keeps "not connected"
    as its result even once the broker has confirmed it, and only the
    message's own flag tells."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if info.is_published():
                return True
        except RuntimeError:
            if info._published:
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--file", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--qos", type=int, default=1)
    ap.add_argument("--times", type=int, default=1, help="replay the whole file this many times")
    ap.add_argument("--pace", default="recorded", help="recorded | max | messages per second")
    ap.add_argument("--limit", type=int, default=None, help="only the first N lines")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N lines")
    ap.add_argument("--dup-every", type=int, default=0, help="publish every K-th message twice")
    ap.add_argument("--later-passes", action="store_true",
                    help="with --times: each pass after the first moves every payload's "
                    "\"tsi\" on by the capture's length, so it is new traffic rather than "
                    "the same messages again")
    ap.add_argument("--client-id", default=f"replay-{int(time.time() * 1000)}")
    args = ap.parse_args()

    lines = parse(args.file, args.limit)[args.skip:]
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=args.client_id, clean_session=True)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(args.host, args.port, keepalive=30)
    client.loop_start()

    span = int(lines[-1][0] - lines[0][0]) + 1 if lines else 0
    tsi = re.compile(rb'"tsi":(\d+)')

    def moved(payload, round_):
        if not (args.later_passes and round_):
            return payload
        return tsi.sub(lambda m: b'"tsi":%d' % (int(m.group(1)) + round_ * span), payload)

    pending = []
    published = 0
    sent = set()
    start = time.monotonic()
    for round_ in range(args.times):
        t0_file = lines[0][0] if lines else 0
        t0 = time.monotonic()
        for i, (when, topic, payload) in enumerate(lines):
            if args.pace == "recorded":
                due = t0 + (when - t0_file)
            elif args.pace == "max":
                due = 0
            else:
                due = t0 + i / float(args.pace)
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # Across a broker restart: publish once reconnected.
            waited = time.monotonic()
            while not client.is_connected() and time.monotonic() - waited < 60:
                time.sleep(0.01)
            copies = 2 if args.dup_every and i % args.dup_every == 0 else 1
            payload = moved(payload, round_)
            sent.add((topic, payload))
            for _ in range(copies):
                pending.append(client.publish(topic, payload, qos=args.qos))
                published += 1
            # Keep the number of unconfirmed publishes bounded.
            if len(pending) > 5000:
                if not all(confirmed(info, 60) for info in pending):
                    print("a publish was not confirmed by the broker", file=sys.stderr)
                    sys.exit(1)
                pending.clear()
    for info in pending:
        if not confirmed(info, 60):
            print("a publish was not confirmed by the broker", file=sys.stderr)
            sys.exit(1)
    elapsed = time.monotonic() - start
    client.loop_stop()
    client.disconnect()
    distinct = len(sent)
    print(json.dumps({
        "published": published,
        "distinct": distinct,
        "seconds": round(elapsed, 3),
        "rate": round(published / elapsed, 1) if elapsed > 0 else None,
    }))


if __name__ == "__main__":
    main()
