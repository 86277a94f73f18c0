"""What the bridges acked upstream, read from Mosquitto's own debug log.

Mosquitto, started with `log_type debug` and its log on stdout, writes one
line per packet: `Sending PUBLISH to <client> (d0, q1, r0, m<mid>, '<topic>',
... (<n> bytes))` and `Received PUBACK from <client> (Mid: <mid>, RC:0)`.
The topic carries the message id (`/nemesis/<run>/<k>/<id>`), so a PUBACK
from a bridge names the message it acked. This is the broker's word, not the
bridge's: the checker can tell a message some bridge acked and Pulsar never
got (an ack before a durable commit, G4/G6) from one no bridge ever acked.
"""

import math
import re
import threading
import time

SEND = re.compile(r"Sending PUBLISH to (\S+) \(d\d, q\d, r\d, m(\d+), '([^']*)'")
ACK = re.compile(r"Received PUBACK from (\S+) \(Mid: (\d+)")


class Tap:
    def __init__(self, size, bridges):
        # Per message: when a bridge first acked it, and which bridges did.
        self.first_ack = [math.nan] * size
        self.by = bytearray(size)
        self.bridges = {b: 1 << i for i, b in enumerate(bridges)}
        self.mids = {}
        self.lines = 0
        self.lock = threading.Lock()

    def feed(self, line, now=None):
        """One log line; `now` defaults to the time it is read."""
        self.lines += 1
        if "PUBACK from" in line:
            m = ACK.search(line)
            if not m or m.group(1) not in self.bridges:
                return
            i = self.mids.get((m.group(1), int(m.group(2))))
            if i is None or i >= len(self.by):
                return
            with self.lock:
                if math.isnan(self.first_ack[i]):
                    self.first_ack[i] = now if now is not None else time.time()
                self.by[i] |= self.bridges[m.group(1)]
        elif "Sending PUBLISH to" in line:
            m = SEND.search(line)
            if not m or m.group(1) not in self.bridges:
                return
            topic = m.group(3)
            try:
                i = int(topic.rsplit("/", 1)[1])
            except ValueError:
                return
            self.mids[(m.group(1), int(m.group(2)))] = i

    def follow(self, stream):
        """Reads a log stream to its end (the broker stopping), in a thread."""
        def run():
            for line in stream:
                self.feed(line)
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t
