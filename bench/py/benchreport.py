"""The benchmark's arithmetic and reports, for scripts/bench.sh.

bench.sh runs the processes and times the faults; everything it computes
from what they wrote (a step kept up or not, the stage histograms over the
peak, log syncs per second, a restarted node's catch-up, result.json and its
table) is here, as functions with tests (test_benchreport.py) and one
subcommand each:

    python3 bench/py/benchreport.py <command> [args...]

Standard library only: the benchmark runs on a machine set up by
scripts/setup.sh and nothing else.
"""

import json
import os
import platform
import re
import sys
import time
import urllib.request

def read(path):
    with open(path) as f:
        return f.read()


def load_json(path):
    return json.loads(read(path))


# --- /status of a node --------------------------------------------------

# What bench.sh reads from a node's /status, by name.
STATUS_QUERIES = {
    "leader": lambda d: d["leader"] or 0,
    "last-applied": lambda d: d["last_applied"] or 0,
    "last-seq": lambda d: sum(t["last_seq"] for t in d["topics"]),
    "outbox": lambda d: d["totals"]["outbox_messages"],
    # Whether the cluster still moves: what it observed, and what waits.
    "observed-outbox": lambda d: f'{d["totals"]["observed"]} {d["totals"]["outbox_messages"]}',
}


def status_query(name, status):
    return STATUS_QUERIES[name](status)


# --- one load step ------------------------------------------------------


def kept_up(probe, secs, slack):
    """Keeping up: every message arrives, the last within the slack after
    the load ends, and p99 latency stays under a second (no queue building
    up)."""
    p99 = probe["latency_ms"]["p99"]
    return (
        probe["unique"] == probe["expected"]
        and probe["secs"] <= secs + 1 + slack
        and (p99 if p99 is not None else 1e9) < 1000
    )


def step(load, probe, secs, slack):
    return {"load": load, "probe": probe, "kept_up": kept_up(probe, secs, slack)}


def describe_step(row, naive=False):
    verdict = "kept up" if row["kept_up"] else "fell behind"
    if naive:
        return f'{verdict} copies/msg {round(row["probe"]["copies_per_message"], 2)}'
    return f'{verdict} p99 {round(row["probe"]["latency_ms"]["p99"], 1)} ms'


# --- Prometheus text: the stage histograms over the peak ------------------

STAGE_HISTOGRAMS = ("firstseen_commit_seconds", "firstseen_publish_batch_seconds")
# firstseen_stage_seconds, by its stage label, in the order a message
# passes them (src/telemetry.rs, `Stage`).
STAGES = ("receive", "commit", "publish", "receipt")
# firstseen_commit_leg_seconds, by its leg label: the commit stage taken
# apart (src/telemetry.rs, docs/metrics.md), in the order a follower's batch
# passes them.
COMMIT_LEGS = ("forward", "queue", "entry", "flush", "to_send", "append", "heartbeat",
               "follower_append", "apply")
APPEND_KINDS = ("entries", "empty", "unawaited")
TAIL_BOUNDS = ("0.01", "0.025", "0.05", "0.1")


def histogram(text, name, label=None):
    """One histogram's series summed over labels: {(kind, le): value}, kind
    being bucket, sum or count (le empty but for buckets). With `label`
    (like 'stage="commit"'), only the series that carry it."""
    out = {}
    pattern = re.compile(r"^" + re.escape(name) + r"_(bucket|sum|count)\{(.*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if not m or (label is not None and label not in m.group(2)):
            continue
        le = re.search(r'le="([^"]+)"', m.group(2))
        key = (m.group(1), le.group(1) if le else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def counter(text, name, label):
    """A counter's value summed over the series that carry `label`."""
    total = 0.0
    pattern = re.compile(r"^" + re.escape(name) + r"\{(.*)\} (\S+)$")
    for line in text.splitlines():
        m = pattern.match(line)
        if m and label in m.group(1):
            total += float(m.group(2))
    return total


def quantile(buckets, n, q):
    """The q-quantile of a histogram with `n` observations, from its
    cumulative buckets {le: count}, interpolated linearly inside the
    bucket it falls in (as Prometheus's histogram_quantile does)."""
    rank, lower, below = q * n, 0.0, 0.0
    for le, count in sorted(((float(le), c) for le, c in buckets.items() if le != "+Inf")):
        if count >= rank:
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, count
    return None


def stage_summary(before, after, name, label=None):
    """The histogram over the interval between two scrapes: count, mean,
    interpolated p50 and p99 and the share of observations above each tail
    bound. None when nothing was observed."""
    a, b = histogram(before, name, label), histogram(after, name, label)
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}
    n = d.get(("count", ""), 0.0)
    if n <= 0:
        return None
    over = {le: round(1 - d[("bucket", le)] / n, 4) for le in TAIL_BOUNDS if ("bucket", le) in d}
    buckets = {le: v for (kind, le), v in d.items() if kind == "bucket"}
    ms = lambda q: None if (v := quantile(buckets, n, q)) is None else round(1000 * v, 2)
    return {"count": int(n), "mean_ms": round(1000 * d[("sum", "")] / n, 2),
            "p50_ms": ms(0.5), "p99_ms": ms(0.99), "share_over_s": over}


def stages(work, nodes=(1, 2, 3)):
    out = []
    for i in nodes:
        before = read(f"{work}/metrics0-{i}.txt")
        after = read(f"{work}/metrics1-{i}.txt")
        node = {}
        for name in STAGE_HISTOGRAMS:
            s = stage_summary(before, after, name)
            if s is not None:
                node[name.removeprefix("firstseen_")] = s
        for stage in STAGES:
            s = stage_summary(before, after, "firstseen_stage_seconds", f'stage="{stage}"')
            if s is not None:
                node[f"stage_{stage}"] = s
        for leg in COMMIT_LEGS:
            s = stage_summary(before, after, "firstseen_commit_leg_seconds", f'leg="{leg}"')
            if s is not None:
                node[f"leg_{leg}"] = {k: s[k] for k in ("count", "mean_ms", "p50_ms", "p99_ms")}
        appends = {}
        for kind in APPEND_KINDS:
            n = counter(after, "firstseen_raft_appends_total", f'kind="{kind}"') \
                - counter(before, "firstseen_raft_appends_total", f'kind="{kind}"')
            if n:
                appends[kind] = int(n)
        if appends:
            node["raft_appends"] = appends
        out.append(node)
    return out


# --- log syncs over the peak ----------------------------------------------


def syncs(secs, before, after):
    """Per node, from (flushes, sync seconds, sync count) triples taken
    before and after the peak: syncs per second and the mean sync."""
    nodes = []
    for i in range(len(before) // 3):
        f, s, c = (after[3 * i + k] - before[3 * i + k] for k in range(3))
        nodes.append({
            "log_syncs_per_sec": round(f / secs, 1),
            "mean_sync_ms": round(1000 * s / c, 3) if c else None,
        })
    return nodes


# --- a restarted node's catch-up -------------------------------------------


def catch_up(url, restarted_ms, at_kill, target, limit_secs=180):
    """Polls a restarted node's /status until it has applied `target`: the
    time includes the process start."""
    restarted = restarted_ms / 1000
    applied = 0
    while time.time() < restarted + limit_secs:
        try:
            applied = json.load(urllib.request.urlopen(url, timeout=2))["last_applied"] or 0
        except Exception:
            # Not up yet: the process is starting.
            pass
        if applied >= target:
            break
        time.sleep(0.05)
    secs = time.time() - restarted
    missed = target - at_kill
    return {
        "missed_entries": missed,
        "secs": round(secs, 2),
        "entries_per_sec": round(missed / secs) if secs > 0 else None,
        "caught_up": applied >= target,
    }


def failover_row(f):
    fp = f["probe"]
    return {
        "killed_node": f["killed_node"],
        "publishing_resumed_after_ms": fp["fault"]["resumed_after_mark_ms"] if fp["fault"] else None,
        "silence_ms": fp["fault"]["gap_ms"] if fp["fault"] else None,
        "exactly_once": fp["verify_clean"] and fp["unique"] == fp["expected"],
        "unique": fp["unique"],
        "expected": fp["expected"],
        "catch_up": f["catch_up"],
    }


# --- result.json ------------------------------------------------------------


def slope(points):
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points)
    return round(60 * sum((p[0] - mx) * (p[1] - my) for p in points) / den, 2) if den else None


def best_rate(rows):
    return max([r["load"]["unique"] / r["load"]["secs"] for r in rows if r["kept_up"]] or [0])


def rss_figures(samples, window_secs):
    """RSS per node over the peak, and its slope once the window is full
    (keys expire as fast as they arrive from then on)."""
    steady = [s for s in samples if s[0] >= window_secs + 10]
    series = {"t_secs": [s[0] for s in samples], "mb_per_node": [[s[i] for s in samples] for i in (1, 2, 3)]}
    return series, {
        "from_secs": window_secs + 10,
        "mb_per_minute_per_node": [slope([(s[0], s[i]) for s in steady]) for i in (1, 2, 3)],
        "first_mb_per_node": [steady[0][i] for i in (1, 2, 3)] if steady else None,
        "last_mb_per_node": [steady[-1][i] for i in (1, 2, 3)] if steady else None,
    }


def build_result(inputs):
    """result.json from what the run wrote. `inputs` holds the parsed files
    (see `read_inputs`) and the figures bench.sh passes."""
    peak, naive_peak, status = inputs["peak"], inputs["naive_peak"], inputs["status"]
    peak_secs, window_secs = inputs["peak_secs"], inputs["window_secs"]
    cpu, rss = inputs["cpu"], inputs["rss"]
    keys = status["totals"]["window_keys"]
    raft = inputs["raft"]
    rss_series, rss_steady = rss_figures(inputs["rss_samples"], window_secs)
    runs = [failover_row(f) for f in inputs["failovers"]]
    resumed = sorted(r["publishing_resumed_after_ms"] for r in runs if r["publishing_resumed_after_ms"] is not None)
    outage, fan = inputs["outage"], inputs["fanout"]
    result = {
        "machine": inputs["machine"],
        "peak": {
            "rate": 2000, "secs": peak_secs, "window_secs": window_secs,
            "latency_ms": peak["probe"]["latency_ms"],
            "exactly_once": peak["probe"]["verify_clean"] and peak["probe"]["unique"] == peak["probe"]["expected"],
            "copies_per_message": peak["probe"]["copies_per_message"],
            "unique_per_sec": round(peak["probe"]["unique"] / peak_secs, 1),
            "cpu_seconds_per_node": cpu, "cpu_share_per_node": [round(c / peak_secs, 3) for c in cpu],
            # The naive forwarders' CPU share over the same peak, each.
            "naive_cpu_share": inputs["naive_cpu"],
            "peak_rss_mb_per_node": rss,
            "rss": rss_series, "rss_steady": rss_steady,
            "raft_entries_per_sec": round(raft["entries"] / peak_secs, 1),
            "raft_bytes_per_sec": round(raft["bytes"] / peak_secs),
            "disk_bytes": status["disk_bytes"],
            "disk_bytes_per_key": round(status["disk_bytes"] / keys, 1) if keys else None,
            "state_disk_bytes": status["state_disk_bytes"],
            "state_disk_bytes_per_key": round(status["state_disk_bytes"] / keys, 1) if keys else None,
            "window_keys": keys,
            "snapshot_export_ms": inputs["export_ms"],
            "log_syncs_per_node": inputs["syncs"],
            "naive_latency_ms": naive_peak["probe"]["latency_ms"],
            # Split at the producer's send: before it Mosquitto and the
            # forwarder, after it Pulsar and the consumer.
            "split_ms": peak["probe"]["split_ms"], "naive_split_ms": naive_peak["probe"]["split_ms"],
            "naive_slow_seconds": naive_peak["probe"]["slow_seconds"],
            "slow_seconds": peak["probe"]["slow_seconds"],
        },
        "sustained": {"steps": inputs["sustained"], "max_rate": best_rate(inputs["sustained"])},
        "failover": {
            "runs": runs,
            "publishing_resumed_median_ms": resumed[len(resumed) // 2] if resumed else None,
            "exactly_once": all(r["exactly_once"] for r in runs),
        },
        "sync": inputs["sync"],
        "outage": {**outage, "drain_per_sec": round(outage["buffered"] / (outage["drain_ms"] / 1000)) if outage["drain_ms"] else None},
        "verify_all_clean": inputs["verify_ok"],
        "naive": {"steps": inputs["naive"], "max_rate": best_rate(inputs["naive"])},
        "fanout": fan,
        "window": inputs["window"],
    }
    naive_max = result["naive"]["max_rate"]
    result["ratios"] = {
        "cluster_vs_naive": round(result["sustained"]["max_rate"] / naive_max, 3) if naive_max else None,
        "cluster_vs_fanout": round(result["sustained"]["max_rate"] / fan["rate_per_subscriber"], 3) if fan["rate_per_subscriber"] else None,
    }
    return result


def table(result):
    """The rows bench.sh prints at the end: (name, value)."""
    p, f, o = result["peak"], result["failover"], result["outage"]
    sync, window, fan = result["sync"], result["window"], result["fanout"]
    c0 = f["runs"][0]["catch_up"] if f["runs"] else {"missed_entries": None, "secs": None, "entries_per_sec": None}
    lat, nlat = p["latency_ms"], p["naive_latency_ms"]
    send, nsend = p["split_ms"]["to_producer_send"], p["naive_split_ms"]["to_producer_send"]
    after, nafter = p["split_ms"]["after_send"], p["naive_split_ms"]["after_send"]
    return [
        ("HSL peak p50 / p99 / max latency (ms)", f"{lat['p50']:.1f} / {lat['p99']:.1f} / {lat['max']:.0f}"),
        ("  the same peak, naive forwarders (ms)", f"{nlat['p50']:.1f} / {nlat['p99']:.1f} / {nlat['max']:.0f}"),
        ("  to the producer's send p50 / p99, cluster and naive (ms)", f"{send['p50']:.1f} / {send['p99']:.1f}, {nsend['p50']:.1f} / {nsend['p99']:.1f}"),
        ("  after the send p50 / p99, cluster and naive (ms)", f"{after['p50']:.1f} / {after['p99']:.1f}, {nafter['p50']:.1f} / {nafter['p99']:.1f}"),
        ("  p99 cluster / naive", round(lat["p99"] / nlat["p99"], 2) if nlat["p99"] else None),
        ("HSL peak exactly once (probe's audit)", p["exactly_once"]),
        ("HSL peak unique msg/s into Pulsar", p["unique_per_sec"]),
        ("HSL peak CPU share per node", ", ".join(str(c) for c in p["cpu_share_per_node"])),
        ("naive forwarders' CPU share on the same peak", ", ".join(str(c) for c in p["naive_cpu_share"])),
        ("HSL peak peak RSS per node (MB)", ", ".join(str(r) for r in p["peak_rss_mb_per_node"])),
        ("RSS slope once the window is full (MB/min)", ", ".join(str(r) for r in p["rss_steady"]["mb_per_minute_per_node"])),
        ("Raft entries/s, bytes/s (leader's log)", f"{p['raft_entries_per_sec']}, {p['raft_bytes_per_sec']}"),
        ("log fdatasyncs/s per node at the peak", ", ".join(str(n["log_syncs_per_sec"]) for n in p["log_syncs_per_node"])),
        ("mean log sync per node at the peak (ms)", ", ".join(str(n["mean_sync_ms"]) for n in p["log_syncs_per_node"])),
        ("one sync: sled flush / + fdatasync (mean us)", f"{sync['sled_flush_only']['mean_us']:.0f} / {sync['durable_sync']['mean_us']:.0f}"),
        ("node disk bytes per window key: state + log", f"{p['disk_bytes_per_key']} ({p['window_keys']} keys)"),
        ("node disk bytes per window key: state alone", f"{p['state_disk_bytes_per_key']} ({p['window_keys']} keys)"),
        ("state machine disk bytes per key (window profile)", f"{window['bytes_per_key']} ({window['window_keys']} keys)"),
        ("max sustained, 3-node cluster (msg/s)", f"{result['sustained']['max_rate']:.0f}"),
        ("max sustained, naive HA forwarders (msg/s)", f"{result['naive']['max_rate']:.0f}"),
        ("mosquitto fan-out to 3 subscribers (msg/s)", f"{fan['rate_per_subscriber']:.0f}"),
        ("cluster / naive", result["ratios"]["cluster_vs_naive"]),
        ("cluster / fan-out ceiling", result["ratios"]["cluster_vs_fanout"]),
        ("leader SIGKILL -> publishing resumed (ms), runs", ", ".join(str(r["publishing_resumed_after_ms"]) for r in f["runs"])),
        ("  median (ms); exactly once", f"{f['publishing_resumed_median_ms']}; {f['exactly_once']}"),
        ("restarted node catch-up (entries, s, /s)", f"{c0['missed_entries']}, {c0['secs']}, {c0['entries_per_sec']}"),
        ("outbox drain after Pulsar outage (msgs, ms, /s)", f"{o['buffered']}, {o['drain_ms']}, {o['drain_per_sec']}"),
        ("verify over the whole run", result["verify_all_clean"]),
    ]


def read_inputs(work, peak_secs, cpu, rss, window_secs):
    file = lambda name: load_json(f"{work}/{name}")
    lines = lambda name: [json.loads(l) for l in read(f"{work}/{name}").splitlines() if l.strip()]
    return {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "peak_secs": peak_secs, "window_secs": window_secs, "cpu": cpu, "rss": rss,
        "peak": file("peak.json"), "naive_peak": file("naive-peak.json"),
        "status": file("status.json"), "raft": file("raft.json"),
        "rss_samples": [[float(x) for x in l.split()] for l in read(f"{work}/rss.txt").splitlines() if l.strip()],
        "failovers": lines("failovers.jsonl"), "sustained": lines("sustained.jsonl"),
        "naive": lines("naive.jsonl"), "outage": file("outage.json"),
        "fanout": file("fanout.json"), "window": file("window.json"),
        "sync": file("sync.json"), "syncs": file("syncs.json"),
        "naive_cpu": [float(x) for x in read(f"{work}/naive-cpu.txt").split()],
        "export_ms": [int(x) for x in read(f"{work}/export-ms.txt").split()],
        "verify_ok": read(f"{work}/verify.ok").strip() == "true",
    }


# --- the competitors: every system over the same peak ----------------------

# (name, what the table calls it, its peak's file). Baselines that did not
# run (BENCH_BENTHOS=0) have no file and are left out.
SYSTEMS = (
    ("firstseen", "firstseen, 3 nodes, fsync", "peak.json"),
    ("naive", "naive x3 (no dedup)", "naive-peak.json"),
    ("benthos", "Benthos, one process", "benthos-peak.json"),
    ("benthos-tuned", "Benthos, max_in_flight 1024", "benthos-tuned-peak.json"),
    ("benthos-ha", "Benthos x3 + Redis", "benthos-ha-peak.json"),
)
STEP_FILES = {"firstseen": "sustained.jsonl", "naive": "naive.jsonl"}


def competitor_row(name, label, peak, cpu, pulsar, steps, peak_secs):
    """One system over the peak. `cpu` is its processes' core-seconds per
    second (then Redis's, for the HA Benthos), `pulsar` Pulsar's own, both
    over the same peak; `steps` its sustained steps, if the full run ran
    them."""
    probe = peak["probe"]
    lat = probe["latency_ms"]
    unique_rate = probe["unique"] / peak_secs
    written_rate = probe["received"] / peak_secs
    once = probe["unique"] == probe["expected"] and probe["received"] == probe["unique"]
    if name == "firstseen":
        once = once and probe["verify_clean"]
    total = sum(cpu)
    return {
        "system": name, "label": label,
        "p50_ms": lat["p50"], "p99_ms": lat["p99"],
        "unique": probe["unique"], "expected": probe["expected"],
        "copies_per_message": round(probe["copies_per_message"], 3),
        "exactly_once": once,
        "cpu_share": round(total, 3), "cpu_parts": cpu,
        "cpu_us_per_message": round(1e6 * total / unique_rate, 1) if unique_rate else None,
        "pulsar_cpu_share": pulsar,
        # Per message Pulsar stored: the naive forwarders make it store three.
        "pulsar_cpu_us_per_message": round(1e6 * pulsar / written_rate, 1) if written_rate else None,
        "max_rate": best_rate(steps) if steps else None,
    }


def competitors(work, peak_secs):
    rows = []
    for name, label, peak_file in SYSTEMS:
        if not os.path.exists(f"{work}/{peak_file}"):
            continue
        words = read(f"{work}/cpu-{name}.txt").split()
        steps_file = f"{work}/{STEP_FILES.get(name, name + '.jsonl')}"
        steps = None
        if os.path.exists(steps_file):
            steps = [json.loads(l) for l in read(steps_file).splitlines() if l.strip()]
        rows.append(competitor_row(
            name, label, load_json(f"{work}/{peak_file}"), [float(w) for w in words],
            float(read(f"{work}/pulsar-cpu-{name}.txt")), steps, peak_secs))
    return {"systems": rows, "against_benthos": against_benthos(rows)}


def against_benthos(rows):
    """firstseen's ratios to the Benthos baselines, each with the target
    issue 35 set: p50 and p99 to the single Benthos, the highest rate kept
    up to the tuned one, the CPU to three Benthos with Redis, and Pulsar's
    CPU per message to what the single Benthos makes it spend."""
    by = {r["system"]: r for r in rows}
    fs = by.get("firstseen")
    if fs is None:
        return []
    out = []

    def ratio(what, mine, theirs, target, higher_is_better=False):
        if mine is None or not theirs:
            return
        r = round(mine / theirs, 2)
        met = r >= target if higher_is_better else r <= target
        out.append({"figure": what, "firstseen": mine, "baseline": theirs, "ratio": r,
                    "target": f"{'>=' if higher_is_better else '<='} {target}", "met": met})

    single, tuned, ha = by.get("benthos"), by.get("benthos-tuned"), by.get("benthos-ha")
    if single:
        ratio("p50 at the peak / single Benthos", fs["p50_ms"], single["p50_ms"], 1.1)
        ratio("p99 at the peak / single Benthos", fs["p99_ms"], single["p99_ms"], 1.25)
        ratio("Pulsar CPU per message / single Benthos", fs["pulsar_cpu_us_per_message"],
              single["pulsar_cpu_us_per_message"], 1.0)
    if tuned:
        ratio("highest rate kept up / tuned Benthos", fs["max_rate"], tuned["max_rate"], 1.25, True)
    if ha:
        ratio("CPU at the peak / Benthos x3 + Redis", fs["cpu_share"], ha["cpu_share"], 1.0)
    return out


def figure(x):
    """A figure as the tables print it: three decimals for shares, one for
    milliseconds and microseconds, none for rates."""
    return round(x, 3) if abs(x) < 5 else round(x, 1) if abs(x) < 1000 else round(x)


def competitor_table(result):
    """The comparison as Markdown: one row per system, then the ratios."""
    lines = [
        "| system | p50 / p99 ms | exactly once | copies | CPU (core-s/s) | CPU us/msg | Pulsar CPU (core-s/s) | Pulsar us per stored msg | highest rate kept up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["systems"]:
        parts = " + ".join(str(c) for c in r["cpu_parts"]) if len(r["cpu_parts"]) > 1 else str(r["cpu_share"])
        lines.append(
            f'| {r["label"]} | {r["p50_ms"]:.1f} / {r["p99_ms"]:.1f} | {"yes" if r["exactly_once"] else "no"} '
            f'| {r["copies_per_message"]} | {parts} | {r["cpu_us_per_message"]} | {r["pulsar_cpu_share"]} '
            f'| {r["pulsar_cpu_us_per_message"]} | {"-" if r["max_rate"] is None else round(r["max_rate"])} |')
    if result["against_benthos"]:
        lines += ["", "| figure | firstseen | baseline | ratio | target | met |", "|---|---|---|---|---|---|"]
        for a in result["against_benthos"]:
            lines.append(f'| {a["figure"]} | {figure(a["firstseen"])} | {figure(a["baseline"])} | {a["ratio"]} | {a["target"]} | {"yes" if a["met"] else "no"} |')
    return lines


def describe_peak(peak):
    p = peak["probe"]
    return (f'p50 / p99 {p["latency_ms"]["p50"]:.1f} / {p["latency_ms"]["p99"]:.1f} ms, '
            f'{p["unique"]} of {p["expected"]} unique, copies {round(p["copies_per_message"], 3)}')


# --- the peak alone (BENCH_ONLY_PEAK) ----------------------------------------


def peak_summary(work, peak_secs, cpu):
    """What BENCH_ONLY_PEAK prints: the lines to compare two builds by."""
    probe = load_json(f"{work}/peak.json")["probe"]
    naive = load_json(f"{work}/naive-peak.json")["probe"]
    status = load_json(f"{work}/status.json")
    keys = max(1, status["totals"]["window_keys"])
    pick = lambda p, names: json.dumps({k: p[k] for k in names})
    return [
        pick(probe, ("latency_ms", "split_ms", "unique", "verify_clean", "slow_seconds")),
        "naive forwarders, same peak:",
        pick(naive, ("latency_ms", "split_ms", "unique", "copies_per_message", "slow_seconds")),
        "snapshot exports (ms): " + " ".join(read(f"{work}/export-ms.txt").split()),
        # CPU is steadier than p99 from run to run: compare builds by it too.
        "node CPU over the peak (core-seconds per second): " + " ".join(str(round(c / peak_secs, 3)) for c in cpu),
        "naive forwarders' CPU over their peak (core-seconds per second): " + read(f"{work}/naive-cpu.txt").strip(),
        "log syncs: " + read(f"{work}/syncs.json").strip(),
        "stages per node (commit: a batch proposed until committed; publish batch: sent until every receipt): "
        + read(f"{work}/stages.json").strip(),
        f'disk per window key: state+log {round(status["disk_bytes"] / keys, 1)} '
        f'state {round(status["state_disk_bytes"] / keys, 1)} keys {keys}',
    ]


# --- the command line ---------------------------------------------------------


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "status":
        print(status_query(args[0], json.load(sys.stdin)))
    elif cmd == "step":
        sent, probe = load_json(args[0]), load_json(args[1])
        print(json.dumps(step(sent, probe, float(args[2]), float(args[3]))))
    elif cmd == "describe-step":
        print(describe_step(json.loads(sys.stdin.read()), naive=args[:1] == ["naive"]))
    elif cmd == "stages":
        print(json.dumps(stages(args[0])))
    elif cmd == "syncs":
        before = [float(x) for x in args[1].split()]
        after = [float(x) for x in args[2].split()]
        print(json.dumps(syncs(float(args[0]), before, after)))
    elif cmd == "catch-up":
        print(json.dumps(catch_up(args[0], int(args[1]), int(args[2]), int(args[3]))))
    elif cmd == "failover":
        f = load_json(args[0])
        f["catch_up"] = load_json(args[1])
        f["killed_node"] = int(read(args[2]))
        print(json.dumps(f))
    elif cmd == "describe-failover":
        f = load_json(args[0])["probe"]
        c = load_json(args[1])
        resumed = f["fault"]["resumed_after_mark_ms"] if f["fault"] else "?"
        print(f"publishing resumed {resumed} ms after the kill; catch-up {c}")
    elif cmd == "describe-peak":
        print(describe_peak(load_json(args[0])))
    elif cmd == "competitors":
        result = competitors(args[0], float(args[1]))
        with open(f"{args[0]}/competitors.json", "w") as f:
            json.dump(result, f, indent=2)
        print("\n".join(competitor_table(result)))
    elif cmd == "peak-summary":
        cpu = [float(x) for x in args[2:5]]
        print("\n".join(peak_summary(args[0], float(args[1]), cpu)))
    elif cmd == "result":
        work, peak_secs, out = args[0], float(args[1]), args[2]
        cpu = [float(x) for x in args[3:6]]
        rss = [float(x) for x in args[6:9]]
        result = build_result(read_inputs(work, peak_secs, cpu, rss, int(args[9])))
        result["competitors"] = competitors(work, peak_secs)
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
        print()
        for name, value in table(result):
            print(f"{name:<48} {str(value):>28}")
        print()
        print("\n".join(competitor_table(result["competitors"])))
        print(f"\nwritten to {out}")
    else:
        sys.exit(f"benchreport: unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
