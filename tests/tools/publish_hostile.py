#!/usr/bin/env python3
"""Publishes, over MQTT 5 with paho-mqtt, messages that are legal on the wire
and hostile to a bridge: one PUBLISH carrying about 8 MB of user properties,
one carrying 50,000 small user properties, and one whose topic is 60,000
characters long. Each goes under --prefix at QoS 1, and the script waits for
every acknowledgement. Prints {"published": n} as JSON."""
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
args = ap.parse_args()

c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
c.connect(args.host, args.port)
c.loop_start()

huge = Properties(PacketTypes.PUBLISH)
huge.UserProperty = [(f"blob{i}", "x" * 60_000) for i in range(140)]
many = Properties(PacketTypes.PUBLISH)
many.UserProperty = [(f"k{i}", "v") for i in range(50_000)]
messages = [
    (f"{args.prefix}/huge-properties", huge),
    (f"{args.prefix}/many-properties", many),
    (f"{args.prefix}/" + "t" * 60_000, None),
]
infos = []
for topic, props in messages:
    kwargs = {"properties": props} if props is not None else {}
    infos.append(c.publish(topic, json.dumps({"hostile": topic[-20:]}), qos=1, **kwargs))
for info in infos:
    info.wait_for_publish(timeout=120)
    if not info.is_published():
        print("a publish was not confirmed", file=sys.stderr)
        sys.exit(1)
c.loop_stop()
c.disconnect()
print(json.dumps({"published": len(messages)}))
