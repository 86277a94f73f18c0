"""The nemesis's fault schedule: pure, seeded, and the same for the same seed.

A schedule is a list of faults, each with a start and an end (seconds from
the campaign's start), a kind, a target and an argument. Node targets are
symbolic where the choice depends on the cluster's state at that moment
("leader", "follower"), so a seed always yields the same schedule; the runner
resolves them when the fault begins.

Within the failure model (2f+1 nodes tolerate f crashed or cut nodes) at
most one node is impaired at any moment. Time is cut into windows; each
window has one victim, and its faults (killed, paused, cut off, powered off,
out of disk, behind a lossy link, cut from Pulsar or from the broker) may
overlap on that victim. Faults that impair no node's place in the quorum (a
broker restart, a clock skew or jump on any node) run on their own timeline
and overlap with everything. Now and then a window goes beyond the model:
every node loses power at once, and only safety is required then.
"""

import random
from dataclasses import dataclass, asdict

NODE_KINDS = ["kill", "pause", "cut", "one_way_cut", "lossy", "cut_pulsar",
              "cut_mqtt", "power_loss", "disk_full"]
SIDE_KINDS = ["pulsar_restart", "mqtt_restart", "clock_skew", "clock_jump"]
KINDS = NODE_KINDS + SIDE_KINDS + ["power_loss_all"]

# Faults that leave the node's process gone or frozen: nothing else can be
# done to it at the same time.
EXCLUSIVE = {"kill", "pause", "power_loss"}


@dataclass
class Fault:
    start: float
    end: float
    kind: str
    # "leader", "follower", "w<n>" (window n's victim, resolved once for the
    # window), a node id, or "" for faults without one.
    target: str
    # Kind-specific: seconds of clock skew, the seed of a torn write.
    arg: int = 0

    def to_json(self):
        return asdict(self)


@dataclass
class Profile:
    window: tuple = (12.0, 24.0)
    faults_per_window: tuple = (1, 3)
    fault_len: tuple = (2.0, 6.0)
    gap: float = 3.0
    side_every: float = 20.0
    beyond: float = 0.05
    settle: float = 20.0
    # One window, early in the run, always goes beyond the model. Every message
    # reaches all three bridges, so within the model a build that acks before
    # its commit loses nothing the checker can see (another zone commits the
    # copy); only a loss of every node at once exposes it, and the short
    # profile must catch that build (it did not, with beyond = 0.05 alone).
    beyond_once: bool = False
    # At least this many windows go beyond the model, spread over the run
    # (on top of those `beyond` draws): a promise the soak makes about every
    # seed, not only about most of them.
    beyond_at_least: int = 0


SHORT = Profile(beyond_once=True)
# The default soak: a very bad hour as an operator would recognise it. A new
# fault begins every 20 s on average (about 180 an hour: some 70 windows of
# one to three faults on the victim, and a side fault every 90 s); each of
# the 14 kinds comes up at least 8 times (a loss of power on every node at
# once among them, where the issue asks for 5), Pulsar and Mosquitto
# restart about 10 times each. Windows
# overlap faults on their victim as the short profile's do.
SOAK = Profile(window=(24.0, 48.0), faults_per_window=(1, 3), fault_len=(2.0, 8.0),
               gap=15.0, side_every=90.0, beyond=0.03, settle=60.0,
               beyond_at_least=8)
# The density an earlier issue asked for: about 115 of each kind an hour, a
# power loss of every node every 33 s and Pulsar restarted every 30 s. On a
# 2-core machine it drowns Pulsar and Mosquitto rather than firstseen
# (docs/reliability.md, "The hour-long soak"); kept so that seeds found
# with it (777001, 4242) replay as they ran.
DENSE = Profile(window=(10.0, 16.0), faults_per_window=(8, 10), fault_len=(1.0, 3.5),
                gap=2.0, side_every=7.5, beyond=0.45, settle=30.0)
PROFILES = {"short": SHORT, "soak": SOAK, "dense": DENSE}


class Deck:
    """Draws kinds without replacement, reshuffling when empty: every kind
    comes up about equally often, in a seeded random order."""

    def __init__(self, rng, kinds):
        self.rng, self.kinds, self.cards = rng, list(kinds), []

    def draw(self):
        if not self.cards:
            self.cards = list(self.kinds)
            self.rng.shuffle(self.cards)
        return self.cards.pop()


def generate(seed, seconds, profile=SHORT):
    """The schedule of a campaign of `seconds`, from `seed`. Nothing starts
    in the last `profile.settle` seconds, so the campaign ends healed."""
    rng = random.Random(seed)
    p = profile
    node_deck = Deck(rng, NODE_KINDS)
    side_deck = Deck(rng, SIDE_KINDS)
    faults = []
    end_of_faults = seconds - p.settle
    t = rng.uniform(3.0, 6.0)
    window = 0
    forced = {rng.randrange(1, 4)} if p.beyond_once else set()
    if p.beyond_at_least:
        # Evenly spread over the windows the run should have, the last one
        # well before the end (window lengths are drawn, so the count is an
        # estimate: 80% of it leaves room for a run of long windows).
        expected = (end_of_faults - t) / (sum(p.window) / 2 + p.gap)
        step = 0.8 * expected / p.beyond_at_least
        forced |= {int(step * (i + 0.5)) for i in range(p.beyond_at_least)}
    while t < end_of_faults:
        length = min(rng.uniform(*p.window), end_of_faults - t)
        if length < 2.0:
            break
        if window in forced or rng.random() < p.beyond:
            faults.append(Fault(t, t + min(length, rng.uniform(2.0, 6.0)),
                                "power_loss_all", "", rng.randrange(1 << 30)))
        else:
            victim = rng.choice(["leader", "leader", "follower", str(rng.randint(1, 3))])
            # Exclusive faults (the process is gone or frozen) do not overlap
            # each other on the victim; the others may stack on top.
            busy_until = t
            for _ in range(rng.randint(*p.faults_per_window)):
                kind = node_deck.draw()
                start = rng.uniform(t, t + length * 0.7)
                if kind in EXCLUSIVE:
                    start = max(start, busy_until)
                end = min(start + rng.uniform(*p.fault_len), t + length)
                if end - start < 0.5:
                    # No room left in this window: the card goes back.
                    node_deck.cards.append(kind)
                    continue
                if kind in EXCLUSIVE:
                    busy_until = end + 0.5
                faults.append(Fault(start, end, kind, f"w{window}:{victim}",
                                    rng.randrange(1 << 30)))
        t += length + p.gap
        window += 1
    t = rng.uniform(5.0, 5.0 + p.side_every)
    while t < end_of_faults:
        kind = side_deck.draw()
        target, arg, end = "", 0, t
        if kind == "clock_skew":
            target, arg = str(rng.randint(1, 3)), rng.choice([-3600, 3600, -600, 600])
            end = min(t + rng.uniform(5.0, 20.0), end_of_faults)
        elif kind == "clock_jump":
            target, arg = str(rng.randint(1, 3)), rng.choice([-900, 900, 86400])
            end = min(t + rng.uniform(3.0, 10.0), end_of_faults)
        faults.append(Fault(t, end, kind, target, arg))
        t += rng.uniform(0.5, 1.5) * p.side_every
    faults.sort(key=lambda f: f.start)
    return faults


def victim_of(target):
    """("w3", "leader") for "w3:leader"; (None, target) otherwise."""
    if target.startswith("w") and ":" in target:
        w, v = target.split(":", 1)
        return w, v
    return None, target


def counts(faults):
    out = {}
    for f in faults:
        out[f.kind] = out.get(f.kind, 0) + 1
    return out
