#!/usr/bin/env python3
"""Publishes messages over MQTT 5 with paho-mqtt, each with user properties,
a content type, a payload format indicator, a message expiry interval, a
response topic and correlation data, and waits for every acknowledgement.

Message i goes to `<prefix>/<i>` with payload `{"n": i}`, user properties
`seq=<i>`, `source=publish5`, `hop=a`, `hop=b` (a repeated name), content type
`application/json`, payload format 1 (UTF-8), expiry --expiry seconds,
response topic `replies/<i>`, correlation data the 4 bytes of i (big-endian).
Prints {"published": n} as JSON."""
import argparse
import json
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--prefix", required=True)
ap.add_argument("--count", type=int, default=100)
ap.add_argument("--qos", type=int, default=1)
ap.add_argument("--expiry", type=int, default=3600)
args = ap.parse_args()

c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
c.connect(args.host, args.port)
c.loop_start()
infos = []
for i in range(args.count):
    p = Properties(PacketTypes.PUBLISH)
    p.UserProperty = [("seq", str(i)), ("source", "publish5"), ("hop", "a"), ("hop", "b")]
    p.ContentType = "application/json"
    p.PayloadFormatIndicator = 1
    p.MessageExpiryInterval = args.expiry
    p.ResponseTopic = f"replies/{i}"
    p.CorrelationData = i.to_bytes(4, "big")
    infos.append(c.publish(f"{args.prefix}/{i}", json.dumps({"n": i}), qos=args.qos, properties=p))
for info in infos:
    info.wait_for_publish(timeout=60)
    if not info.is_published():
        print("a publish was not confirmed", file=sys.stderr)
        sys.exit(1)
c.loop_stop()
c.disconnect()
print(json.dumps({"published": args.count}))
