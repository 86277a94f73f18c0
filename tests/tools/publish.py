#!/usr/bin/env python3
"""Publishes one message (payload read from stdin, possibly empty) with
paho-mqtt at QoS 1 and exits once the broker has acknowledged it."""
import argparse
import sys

import paho.mqtt.client as mqtt

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--topic", required=True)
ap.add_argument("--qos", type=int, default=1)
args = ap.parse_args()
payload = sys.stdin.buffer.read()
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
c.connect(args.host, args.port)
c.loop_start()
info = c.publish(args.topic, payload, qos=args.qos)
info.wait_for_publish(timeout=30)
c.loop_stop()
c.disconnect()
sys.exit(0 if info.is_published() else 1)
