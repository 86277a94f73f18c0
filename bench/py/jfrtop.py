#!/usr/bin/env python3
"""Where the broker's CPU went: a side-by-side summary of flight recordings.

`scripts/bench.sh` with BENCH_JFR=1 records the Pulsar JVM over each
system's peak (`.bench/jfr/<system>.jfr`). Every system stores the same
messages at the same rate in the same time, so sample counts compare
directly: a thread group or method with twice the samples took about twice
the CPU. This prints, per system, the execution samples by thread group and
by the method on top of the stack, the collector's pauses and the bytes the
allocation samples stand for.

    python3 bench/py/jfrtop.py .bench/jfr/*.jfr
"""

import collections
import json
import os
import re
import subprocess
import sys

EVENTS = "jdk.ExecutionSample,jdk.GarbageCollection,jdk.ObjectAllocationSample"


def frame_name(frame):
    method = frame.get("method") or {}
    cls = ((method.get("type") or {}).get("name")) or "?"
    return f"{cls}.{method.get('name', '?')}"


def thread_group(name):
    """A thread's pool: its name without the numbers that tell members apart."""
    return re.sub(r"[-_ ]?\d+", "", name or "?").strip("-_ ") or "?"


def duration_ms(value):
    """A JFR duration as `jfr print --json` writes it (ISO-8601, e.g. PT0.0012S)."""
    if isinstance(value, (int, float)):
        return float(value) / 1e6
    m = re.fullmatch(r"PT(?:(\d+)M)?([\d.]+)S", str(value or ""))
    if not m:
        return 0.0
    return (int(m.group(1) or 0) * 60 + float(m.group(2))) * 1000


def summarize(path):
    out = subprocess.run(
        ["jfr", "print", "--json", "--events", EVENTS, path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    events = json.loads(out)["recording"]["events"]
    s = {
        "samples": 0,
        "threads": collections.Counter(),
        "methods": collections.Counter(),
        "gc_ms": 0.0,
        "gcs": 0,
        "alloc_mb": 0.0,
        "alloc": collections.Counter(),
    }
    for e in events:
        v = e["values"]
        if e["type"] == "jdk.ExecutionSample":
            s["samples"] += 1
            thread = (v.get("sampledThread") or {}).get("javaName")
            s["threads"][thread_group(thread)] += 1
            frames = (v.get("stackTrace") or {}).get("frames") or []
            if frames:
                s["methods"][frame_name(frames[0])] += 1
        elif e["type"] == "jdk.GarbageCollection":
            s["gcs"] += 1
            s["gc_ms"] += duration_ms(v.get("sumOfPauses"))
        elif e["type"] == "jdk.ObjectAllocationSample":
            mb = float(v.get("weight") or 0) / 1e6
            s["alloc_mb"] += mb
            s["alloc"][(v.get("objectClass") or {}).get("name", "?")] += mb
    return s


def table(title, names, rows, fmt):
    print(f"\n{title}")
    print("| " + " | ".join([""] + names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for label, values in rows:
        print("| " + " | ".join([label] + [fmt(x) for x in values]) + " |")


def main(paths):
    if not paths:
        print(__doc__)
        return 2
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    sums = [summarize(p) for p in paths]
    table(
        "totals",
        names,
        [
            ("execution samples", [s["samples"] for s in sums]),
            ("collections", [s["gcs"] for s in sums]),
            ("pauses (ms)", [round(s["gc_ms"], 1) for s in sums]),
            ("allocated (MB, sampled)", [round(s["alloc_mb"], 1) for s in sums]),
        ],
        str,
    )
    for key, title, n in (
        ("threads", "samples by thread group", 14),
        ("methods", "samples by method on top of the stack", 25),
        ("alloc", "allocated MB by class", 12),
    ):
        total = collections.Counter()
        for s in sums:
            total.update(s[key])
        top = [k for k, _ in total.most_common(n)]
        fmt = (lambda x: f"{x:.1f}") if key == "alloc" else str
        table(title, names, [(k, [s[key][k] for s in sums]) for k in top], fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
