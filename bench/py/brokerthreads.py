#!/usr/bin/env python3
"""Where the broker's CPU went over each system's peak, by thread pool.

`scripts/bench.sh` with BENCH_BROKER_THREADS=1 writes, before and after each
system's peak, one line per thread of the Pulsar JVM: its id, its name (as
the kernel keeps it: 15 characters, spaces as underscores) and its CPU ticks
(user + system). Every system stores the same messages at the same rate for
the same time, so the columns compare directly. Threads are grouped by name
without the numbers that tell a pool's members apart.

    python3 bench/py/brokerthreads.py .bench/broker-threads
"""

import collections
import os
import re
import sys

TICKS_PER_SEC = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read(path):
    """{tid: (name, ticks)} from one snapshot file."""
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2].isdigit():
                out[parts[0]] = (parts[1], int(parts[2]))
    return out


def pool(name):
    """A thread's pool: its name without digits, and without a trailing
    separator they leave."""
    return re.sub(r"\d+", "", name).strip("-_.") or "?"


def spent(before, after):
    """CPU seconds by pool between two snapshots. A thread born meanwhile
    counts from zero; one that ended is lost to both sides alike."""
    by_pool = collections.Counter()
    for tid, (name, ticks) in after.items():
        was = before.get(tid, (name, 0))[1]
        by_pool[pool(name)] += max(0, ticks - was) / TICKS_PER_SEC
    return by_pool


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    directory = argv[0]
    systems = sorted(
        f[: -len(".before")] for f in os.listdir(directory) if f.endswith(".before")
    )
    columns = {}
    for s in systems:
        after = os.path.join(directory, s + ".after")
        if os.path.exists(after):
            columns[s] = spent(
                read(os.path.join(directory, s + ".before")), read(after)
            )
    names = list(columns)
    total = collections.Counter()
    for c in columns.values():
        total.update(c)
    print("| pool | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    print(
        "| all | "
        + " | ".join(f"{sum(columns[n].values()):.2f}" for n in names)
        + " |"
    )
    for p, _ in total.most_common(16):
        print(f"| {p} | " + " | ".join(f"{columns[n][p]:.2f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
