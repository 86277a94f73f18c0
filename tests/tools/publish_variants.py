#!/usr/bin/env python3
"""Publishes every line of an HFP capture twice, as two gateways in front of
the bridge might: once as captured, once re-serialised (the JSON's fields in
reverse order, other whitespace, integral numbers written as floats). Both
copies go to `<prefix><topic>`. Waits for every PUBACK; prints {"published",
"distinct_fields", "distinct_payloads"} as JSON: how many messages differ by
(VP.veh, VP.oper, VP.tst), and by topic+payload bytes of the originals."""
import argparse
import json
import sys

import paho.mqtt.client as mqtt


def reserialize(value):
    if isinstance(value, dict):
        items = list(value.items())[::-1]
        return "{ " + " ,  ".join(f'{json.dumps(k)} :  {reserialize(v)}' for k, v in items) + " }"
    if isinstance(value, list):
        return "[ " + " , ".join(reserialize(v) for v in value) + " ]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return f"{value}.0"
    return json.dumps(value)


ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--file", required=True)
ap.add_argument("--prefix", required=True)
ap.add_argument("--limit", type=int, default=1000)
args = ap.parse_args()

lines = []
with open(args.file, "rb") as f:
    for raw in f.read().split(b"\n"):
        if not raw.strip():
            continue
        _, rest = raw.split(b" ", 1)
        cut = rest.index(b" {")
        lines.append((rest[:cut].decode(), rest[cut + 1:].decode()))
        if len(lines) >= args.limit:
            break
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
c.max_inflight_messages_set(1000)
c.connect(args.host, args.port)
c.loop_start()
infos = []
fields = set()
payloads = set()
for topic, payload in lines:
    doc = json.loads(payload)
    vp = doc.get("VP", {})
    fields.add((vp.get("veh"), vp.get("oper"), vp.get("tst")))
    payloads.add((topic, payload))
    for body in (payload, reserialize(doc)):
        infos.append(c.publish(args.prefix + topic, body, qos=1))
for info in infos:
    info.wait_for_publish(timeout=60)
    if not info.is_published():
        print("a publish was not confirmed", file=sys.stderr)
        sys.exit(1)
c.loop_stop()
c.disconnect()
print(json.dumps({"published": len(infos), "distinct_fields": len(fields),
                  "distinct_payloads": len(payloads)}))
