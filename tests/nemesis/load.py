"""The campaign's client: publishes a realistic feed and keeps its history.

Publishes QoS 1 messages at a fixed rate with paho-mqtt (a client nobody
here wrote), whatever the broker's state: while it is down or restarting,
paho queues the messages and sends them once it is back. Every message is
HFP-shaped (a payload of the real capture) with a unique id in front and in
its topic, `/nemesis/<run>/<id mod 97>/<id>`; every `dup_every`-th one is
published twice, as a second publisher of the same feed would.

The history is what the checker compares Pulsar with: for message `id`,
when it was published and when the broker's PUBACK for it came back (NaN if
it never did), in `history.bin` as pairs of little-endian doubles, indexed
by id. A summary goes to stdout as JSON.
"""

import argparse
import array
import collections
import json
import math
import sys
import time

import paho.mqtt.client as mqtt


def templates(path, limit=2000):
    out = []
    with open(path, "rb") as f:
        for raw in f.read().split(b"\n"):
            if not raw.strip():
                continue
            _, rest = raw.split(b" ", 1)
            cut = rest.index(b" {")
            out.append(rest[cut + 1:].decode())
            if len(out) >= limit:
                break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dup-every", type=int, default=20)
    ap.add_argument("--start-at", type=float, default=None,
                    help="wall time to begin at, so the campaign's clock and the history agree")
    args = ap.parse_args()

    total = int(args.rate * args.seconds)
    t_pub = array.array("d", [math.nan]) * total
    t_ack = array.array("d", [math.nan]) * total
    # Message ids → the messages waiting for their PUBACK. paho reuses ids
    # after 65,535, and while the broker is down more than that may wait,
    # so each id holds a queue. Only the main thread touches it.
    mids = {}
    # PUBACKs as paho's network thread reports them: (mid, time). A deque's
    # append and popleft are atomic, so no lock is held around paho's calls
    # (holding one there deadlocked against paho's own locks).
    acks = collections.deque()
    state = {"connects": 0, "disconnects": 0}

    def on_publish(client, userdata, mid, reason_code, properties):
        acks.append((mid, time.time()))

    def on_connect(client, userdata, flags, reason_code, properties):
        state["connects"] += 1

    def on_disconnect(client, userdata, flags, reason_code, properties):
        state["disconnects"] += 1

    def match():
        while acks:
            mid, at = acks.popleft()
            waiting = mids.get(mid)
            if not waiting:
                continue
            i = waiting.pop(0)
            if not waiting:
                del mids[mid]
            if math.isnan(t_ack[i]):
                t_ack[i] = at

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"nemesis-load-{args.run}",
                         clean_session=True)
    client.on_publish = on_publish
    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.reconnect_delay_set(min_delay=0.2, max_delay=1)
    client.connect_async(args.host, args.port, keepalive=10)
    client.loop_start()

    bodies = templates(args.template)
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    started = time.monotonic()
    wall0 = time.time()
    published = 0
    for i in range(total):
        due = started + i / args.rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        body = bodies[i % len(bodies)]
        payload = '{"id":%d,"run":"%s",%s' % (i, args.run, body[1:])
        topic = "/nemesis/%s/%d/%d" % (args.run, i % 97, i)
        copies = 2 if args.dup_every and i % args.dup_every == 0 else 1
        t_pub[i] = time.time()
        for _ in range(copies):
            info = client.publish(topic, payload, qos=1)
            mids.setdefault(info.mid, []).append(i)
            published += 1
        if i % 64 == 0:
            match()
    # Give the broker time to ack what is still in flight or queued.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match()
        if not mids:
            break
        time.sleep(0.2)
    match()
    client.loop_stop()
    client.disconnect()
    with open(f"{args.out}/history.bin", "wb") as f:
        for i in range(total):
            f.write(array.array("d", [t_pub[i], t_ack[i]]).tobytes())
    acked = sum(1 for x in t_ack if not math.isnan(x))
    print(json.dumps({
        "messages": total, "published": published, "acked": acked,
        "start": wall0, "seconds": round(time.monotonic() - started, 1),
        "connects": state["connects"], "disconnects": state["disconnects"],
    }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
