"""The independent checker: the history against what Pulsar holds.

It shares no code with firstseen. It reads the whole topic with the official
Pulsar client and takes each message's id from its payload (the client put
it there), its `firstseen-seq` property and the broker's publish time. Then,
as Jepsen's total-queue checker does:

- lost: the broker acked the publish, and the message is not in Pulsar;
  of those, acked-uncommitted: a bridge acked it upstream too (the broker's
  log says so), and the group has no durable record of it (G4, G6);
- duplicated: a message in Pulsar more than once (G2);
- unexpected: a message in Pulsar that was never published;
- out of order: `firstseen-seq` not 1, 2, 3, … in topic order (G3);
- availability: the longest time without progress (no bridge ack, or no
  new message in Pulsar without the broker's log) around each fault, and
  the time from each fault's end until progress is steady again.
"""

import array
import json
import math


def load_history(path):
    raw = array.array("d")
    with open(path, "rb") as f:
        raw.frombytes(f.read())
    return raw[0::2], raw[1::2]


def probe_pulsar(url, topic, timeout_secs=60):
    """Whether the broker takes a write within `timeout_secs`: "ok", or why
    not. Tells a stall that is firstseen's from one that is Pulsar's own. The
    limit is generous: a broker just restarted on a loaded machine took up to
    46 s to come back in the soak, and a probe that gave up sooner would
    restart a broker that was only slow."""
    import pulsar
    client = pulsar.Client(url, operation_timeout_seconds=timeout_secs,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, send_timeout_millis=timeout_secs * 1000)
        producer.send(b"probe")
        producer.close()
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        client.close()


def read_pulsar(url, topic, expect_at_least=0, idle_secs=20):
    """Every message of `topic`: (id, seq, publish time in s), in order."""
    import pulsar  # the official client
    import time as _time
    client = pulsar.Client(url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    last = _time.monotonic()
    while True:
        try:
            msg = reader.read_next(timeout_millis=1000)
        except Exception:
            if _time.monotonic() - last > idle_secs or (expect_at_least and len(out) >= expect_at_least
                                                        and _time.monotonic() - last > 3):
                break
            continue
        last = _time.monotonic()
        data = msg.data()
        # {"id":123,"run":"…", … — the id is the first field.
        try:
            i = int(data[6:data.index(b",")])
        except ValueError:
            i = -1
        props = msg.properties()
        seq = int(props.get("firstseen-seq", "-1"))
        out.append((i, seq, msg.publish_timestamp() / 1000.0))
    reader.close()
    client.close()
    return out


class LiveReader:
    """Reads the topic while the campaign runs and notes when each message
    first arrived, by the harness's clock: the nodes' clocks are skewed on
    purpose, so the producer's publish time cannot be trusted for latency.
    The client reconnects by itself through Pulsar's restarts."""

    def __init__(self, url, topic, size):
        import threading
        self.arrived = [math.nan] * size
        # Distinct messages seen, and when the last new one came (monotonic).
        self.count = 0
        self.last_new = None
        self.url, self.topic = url, topic
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        import time as _time
        import pulsar
        client = pulsar.Client(self.url, operation_timeout_seconds=30,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        reader = client.create_reader(self.topic, pulsar.MessageId.earliest)
        while not self.stop:
            try:
                msg = reader.read_next(timeout_millis=500)
            except Exception:
                continue
            data = msg.data()
            try:
                i = int(data[6:data.index(b",")])
            except ValueError:
                continue
            if 0 <= i < len(self.arrived) and math.isnan(self.arrived[i]):
                self.arrived[i] = _time.time()
                self.count += 1
                self.last_new = _time.monotonic()
        try:
            reader.close()
            client.close()
        except Exception:
            pass

    def finish(self):
        self.stop = True
        self.thread.join(timeout=10)
        return self.arrived


def gaps(times, start, end):
    """The longest stretch within [start, end] with none of `times` (sorted),
    and where it began."""
    best, at, prev = 0.0, start, start
    for t in times:
        if t < start:
            continue
        if t > end:
            break
        if t - prev > best:
            best, at = t - prev, prev
        prev = t
    if end - prev > best:
        best, at = end - prev, prev
    return best, at


def steady_after(times, t0, rate, until, window=3.0, share=0.8):
    """Seconds after t0 until progress holds `share` of `rate` for `window`
    seconds; None if it never does before `until`."""
    import bisect
    t = t0
    while t + window <= until:
        n = bisect.bisect_left(times, t + window) - bisect.bisect_left(times, t)
        if n >= share * rate * window:
            return round(t - t0, 2)
        t += 0.5
    return None


def analyze(t_pub, t_ack, pulsar_msgs, faults, load, rate, first_ack=None, bridged=None,
            arrived=None, window_secs=None):
    """The verdict, as a dict. `faults` are the schedule's, with times in
    seconds after `load["start"]`; `arrived` is the live reader's arrival
    time per message, for latency.

    G2 promises one copy per key within the dedup window: with `window_secs`
    a copy that Pulsar took `window_secs` or more after the first copy of its
    id (broker publish times) is a new message by design, counted apart as
    `copies_after_window` (a broker that held it that long redelivered it).
    Without it, every second copy is a duplicate."""
    n = len(t_pub)
    seen = {}
    first_at = {}
    dup_ids = set()
    after_window = 0
    unexpected = 0
    for i, seq, t in pulsar_msgs:
        if 0 <= i < n and not math.isnan(t_pub[i]):
            seen[i] = seen.get(i, 0) + 1
            if i not in first_at:
                first_at[i] = t
            elif window_secs is not None and t - first_at[i] >= window_secs:
                after_window += 1
            else:
                dup_ids.add(i)
        else:
            unexpected += 1
    acked = [i for i in range(n) if not math.isnan(t_ack[i])]
    lost = [i for i in acked if i not in seen]
    duplicated = sorted(dup_ids)
    seqs = [s for _, s, _ in pulsar_msgs]
    out_of_order = sum(1 for k, s in enumerate(seqs) if s != k + 1)
    acked_uncommitted = None
    if first_ack is not None:
        acked_uncommitted = [i for i in lost if not math.isnan(first_ack[i])]
    # Progress: bridge acks when the broker's log was read, else arrivals
    # in Pulsar (later, and also held up by Pulsar's own faults).
    if first_ack is not None:
        progress = sorted(x for x in first_ack if not math.isnan(x))
        progress_kind = "bridge acks"
    elif arrived is not None:
        progress = sorted(x for x in arrived if not math.isnan(x))
        progress_kind = "arrivals in Pulsar"
    else:
        progress = sorted(t for _, _, t in pulsar_msgs)
        progress_kind = "publish times in Pulsar"
    start = load["start"]
    load_end = start + load["seconds"]
    # New messages in Pulsar, as a second measure when progress is the
    # bridges' acks (otherwise it is the same one).
    arrivals_sorted = None
    if arrived is not None and first_ack is not None:
        arrivals_sorted = sorted(x for x in arrived if not math.isnan(x))
    per_fault = fault_stalls(faults, progress, arrivals_sorted, start, load_end, rate)
    stalls = sorted(p["stall_s"] for p in per_fault)

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else None

    longest, at = gaps(progress, start, load_end)
    publish_stall = None
    if arrived is not None:
        arrivals = sorted(x for x in arrived if not math.isnan(x))
        publish_stall = round(gaps(arrivals, start, load_end)[0], 2)
    if arrived is not None:
        lat = sorted((arrived[i] - t_pub[i]) * 1000 for i in range(min(n, len(arrived)))
                     if not math.isnan(arrived[i]) and not math.isnan(t_pub[i]))
    else:
        lat = sorted((t - t_pub[i]) * 1000 for i, _, t in pulsar_msgs
                     if 0 <= i < n and not math.isnan(t_pub[i]))
    return {
        "messages": n,
        "broker_acked": len(acked),
        "in_pulsar": len(pulsar_msgs),
        "distinct_in_pulsar": len(seen),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "acked_uncommitted": None if acked_uncommitted is None else len(acked_uncommitted),
        "acked_uncommitted_ids": None if acked_uncommitted is None else acked_uncommitted[:20],
        "duplicated": len(duplicated),
        "duplicated_ids": duplicated[:20],
        "copies_after_window": after_window,
        "window_secs": window_secs,
        "unexpected": unexpected,
        "out_of_order": out_of_order,
        "bridged": bridged,
        "progress_measured_by": progress_kind,
        "longest_stall_s": round(longest, 2),
        "longest_stall_at_s": round(at - start, 1),
        "longest_publish_stall_s": publish_stall,
        "stall_per_fault_s": {"p50": pct(stalls, 0.5), "p99": pct(stalls, 0.99),
                              "max": stalls[-1] if stalls else None},
        "stall_by_kind_s": stall_by_kind(per_fault),
        "latency_ms": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": lat[-1] if lat else None,
                       "measured_by": "live reader" if arrived is not None else "producer publish time"},
        "faults": per_fault,
        "ok": not lost and not duplicated and not unexpected and out_of_order == 0,
    }


def fault_stalls(faults, progress, arrivals, start, load_end, rate):
    """Per fault: the longest time without progress (bridge acks, or
    arrivals without the broker's log) while it ran plus 10 s after it
    healed; the same for new messages in Pulsar when `arrivals` are known;
    and the time from its end until progress is steady again."""
    out = []
    for f in faults:
        a, b = start + f["start"], start + max(f["end"], f["start"])
        until = min(b + 10, load_end)
        stall, _ = gaps(progress, a, until)
        row = {**f, "stall_s": round(stall, 2),
               "steady_after_s": steady_after(progress, b, rate, load_end)}
        if arrivals is not None:
            row["publish_stall_s"] = round(gaps(arrivals, a, until)[0], 2)
        out.append(row)
    return out


def stall_by_kind(per_fault):
    """For each fault kind: how many ran; the median, 99th percentile and
    longest stall of upstream acks while one ran (plus 10 s after it
    healed); the same of new messages in Pulsar; and the median and longest
    time back to steady progress after it ended. A stall is charged to every
    fault that overlapped it, so these overlap too."""
    def pct(xs, q):
        return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else None
    by = {}
    for p in per_fault:
        by.setdefault(p["kind"], []).append(p)
    out = {}
    for kind, ps in sorted(by.items()):
        acks = sorted(p["stall_s"] for p in ps)
        pub = sorted(p["publish_stall_s"] for p in ps if p.get("publish_stall_s") is not None)
        steady = sorted(p["steady_after_s"] for p in ps if p.get("steady_after_s") is not None)
        out[kind] = {"count": len(ps), "p50": pct(acks, 0.5), "p99": pct(acks, 0.99), "max": acks[-1],
                     "publish_p50": pct(pub, 0.5), "publish_p99": pct(pub, 0.99),
                     "publish_max": pub[-1] if pub else None,
                     "steady_p50": pct(steady, 0.5), "steady_max": steady[-1] if steady else None,
                     "never_steady": sum(1 for p in ps if p.get("steady_after_s") is None)}
    return out


def stall_table(v):
    """The per-kind stall table as Markdown, for docs/reliability.md. The
    first stall column is of the run's measure of progress (bridge acks
    read from the broker's log, or new messages in Pulsar when the run did
    not read that log); the second, of new messages in Pulsar, only when the
    first was acks."""
    first = {"bridge acks": "upstream ack stall"}.get(v.get("progress_measured_by"), "Pulsar stall")
    kinds = v.get("stall_by_kind_s", {})
    both = any(r.get("publish_max") is not None for r in kinds.values())
    second = " Pulsar stall p50 / p99 / max, s |" if both else ""
    rows = [f"| fault kind | times | {first} p50 / p99 / max, s |{second} back to steady p50 / max, s |",
            "|---|---|---|" + ("---|" if both else "") + "---|"]

    def f(x):
        return "–" if x is None else f"{x:g}"
    for kind, r in kinds.items():
        steady = f"{f(r.get('steady_p50'))} / {f(r.get('steady_max'))}"
        if r.get("never_steady"):
            steady += f" ({r['never_steady']} not before the load ended)"
        pub = (f" {f(r.get('publish_p50'))} / {f(r.get('publish_p99'))} / {f(r.get('publish_max'))} |"
               if both else "")
        rows.append(f"| {kind} | {r['count']} | {f(r['p50'])} / {f(r.get('p99'))} / {f(r['max'])} |"
                    f"{pub} {steady} |")
    return "\n".join(rows)


def table_from_run(out_dir):
    """The per-kind table of a finished run, rebuilt from its history
    (history.jsonl.gz) and its summary (summary.json): for runs made before
    the table had every column."""
    import gzip
    import os
    v = json.load(open(os.path.join(out_dir, "summary.json")))
    acks, arrivals = [], []
    with gzip.open(os.path.join(out_dir, "history.jsonl.gz"), "rt") as f:
        for line in f:
            r = json.loads(line)
            if r.get("bridge_acked") is not None:
                acks.append(r["bridge_acked"])
            if r.get("arrived") is not None:
                arrivals.append(r["arrived"])
    acks.sort()
    arrivals.sort()
    progress = acks or arrivals
    start = v["load"]["start"]
    faults = [{k: p[k] for k in p if k not in ("stall_s", "steady_after_s", "publish_stall_s")}
              for p in v["faults"]]
    per_fault = fault_stalls(faults, progress, arrivals if acks else None, start,
                             start + v["load"]["seconds"], v["rate"])
    return stall_table({"stall_by_kind_s": stall_by_kind(per_fault),
                        "progress_measured_by": "bridge acks" if acks else "arrivals in Pulsar"})


def summary_line(v):
    return (f"messages {v['messages']}, broker acked {v['broker_acked']}, in Pulsar {v['in_pulsar']}: "
            f"lost {v['lost']} (acked upstream {v['acked_uncommitted']}), duplicated {v['duplicated']} "
            f"(and {v.get('copies_after_window', 0)} copies after the window), "
            f"unexpected {v['unexpected']}, out of order {v['out_of_order']}; "
            f"longest stall {v['longest_stall_s']} s; verdict {'OK' if v['ok'] else 'FAILED'}")


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["table"]:
        # check.py table OUT_DIR: the per-kind table of a finished run.
        print(table_from_run(sys.argv[2]))
    else:
        print(json.dumps(analyze(*load_history(sys.argv[1]), [], [], {"start": 0, "seconds": 0}, 1)))
