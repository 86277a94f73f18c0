"""Tests of the benchmark's arithmetic (run by scripts/test.sh)."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

import benchreport as br


def probe(unique=100, expected=100, secs=10.0, p99=50.0, clean=True, fault=None, copies=1):
    return {
        "unique": unique, "expected": expected, "secs": secs, "received": unique * copies,
        "latency_ms": {"p50": 10.0, "p99": p99, "max": 90.0},
        "split_ms": {"to_producer_send": {"p50": 4.0, "p99": 9.0}, "after_send": {"p50": 6.0, "p99": 40.0}},
        "verify_clean": clean, "copies_per_message": float(copies), "slow_seconds": [], "fault": fault,
    }


class Steps(unittest.TestCase):
    def test_a_step_keeps_up_only_when_everything_arrives_in_time_and_fast(self):
        self.assertTrue(br.kept_up(probe(), secs=10, slack=5))
        self.assertFalse(br.kept_up(probe(unique=99), secs=10, slack=5))
        self.assertFalse(br.kept_up(probe(secs=16.5), secs=10, slack=5))
        self.assertFalse(br.kept_up(probe(p99=1000.0), secs=10, slack=5))
        self.assertFalse(br.kept_up(probe(p99=None), secs=10, slack=5))

    def test_the_best_rate_is_the_fastest_step_kept_up(self):
        rows = [
            {"load": {"unique": 20000, "secs": 10}, "kept_up": True},
            {"load": {"unique": 40000, "secs": 10}, "kept_up": True},
            {"load": {"unique": 80000, "secs": 10}, "kept_up": False},
        ]
        self.assertEqual(br.best_rate(rows), 4000)
        self.assertEqual(br.best_rate([]), 0)

    def test_status_queries_read_what_bench_sh_asks_for(self):
        status = {
            "leader": None, "last_applied": 7,
            "topics": [{"last_seq": 3}, {"last_seq": 4}],
            "totals": {"observed": 11, "outbox_messages": 2},
        }
        self.assertEqual(br.status_query("leader", status), 0)
        self.assertEqual(br.status_query("last-applied", status), 7)
        self.assertEqual(br.status_query("last-seq", status), 7)
        self.assertEqual(br.status_query("observed-outbox", status), "11 2")


SCRAPE_0 = """\
# TYPE firstseen_commit_seconds histogram
firstseen_commit_seconds_bucket{node="1",le="0.01"} 10
firstseen_commit_seconds_bucket{node="1",le="0.025"} 18
firstseen_commit_seconds_bucket{node="1",le="0.05"} 20
firstseen_commit_seconds_bucket{node="1",le="0.1"} 20
firstseen_commit_seconds_bucket{node="1",le="+Inf"} 20
firstseen_commit_seconds_sum{node="1"} 0.2
firstseen_commit_seconds_count{node="1"} 20
"""

# 100 more observations: 50 under 10 ms, 30 more under 25 ms, 20 above
# 50 ms of which 10 above 100 ms; 3 s in all.
SCRAPE_1 = """\
firstseen_commit_seconds_bucket{node="1",le="0.01"} 60
firstseen_commit_seconds_bucket{node="1",le="0.025"} 98
firstseen_commit_seconds_bucket{node="1",le="0.05"} 100
firstseen_commit_seconds_bucket{node="1",le="0.1"} 110
firstseen_commit_seconds_bucket{node="1",le="+Inf"} 120
firstseen_commit_seconds_sum{node="1"} 3.2
firstseen_commit_seconds_count{node="1"} 120
"""


class Histograms(unittest.TestCase):
    def test_the_summary_covers_the_interval_between_scrapes(self):
        s = br.stage_summary(SCRAPE_0, SCRAPE_1, "firstseen_commit_seconds")
        self.assertEqual(s["count"], 100)
        self.assertEqual(s["mean_ms"], 30.0)
        self.assertEqual(s["share_over_s"], {"0.01": 0.5, "0.025": 0.2, "0.05": 0.2, "0.1": 0.1})
        self.assertEqual(s["p50_ms"], 10.0)
        self.assertIsNone(s["p99_ms"], "beyond the last finite bucket")

    def test_quantiles_interpolate_inside_their_bucket(self):
        buckets = {"0.001": 10.0, "0.002": 30.0, "0.005": 40.0, "+Inf": 40.0}
        self.assertAlmostEqual(br.quantile(buckets, 40, 0.5), 0.0015)
        self.assertAlmostEqual(br.quantile(buckets, 40, 0.125), 0.0005)
        self.assertAlmostEqual(br.quantile(buckets, 40, 0.875), 0.0035)

    def test_a_stage_is_read_by_its_label_alone(self):
        before = 'firstseen_stage_seconds_bucket{stage="commit",le="0.005"} 0\n'
        after = ("".join(f'firstseen_stage_seconds_{k}{{stage="{st}"{le}}} {v}\n' for st, k, le, v in (
            ("commit", "bucket", ',le="0.005"', 4), ("commit", "bucket", ',le="+Inf"', 4),
            ("commit", "sum", "", 0.008), ("commit", "count", "", 4),
            ("publish", "bucket", ',le="0.005"', 1), ("publish", "bucket", ',le="+Inf"', 9),
            ("publish", "sum", "", 1.0), ("publish", "count", "", 9))))
        s = br.stage_summary(before, after, "firstseen_stage_seconds", 'stage="commit"')
        self.assertEqual((s["count"], s["mean_ms"], s["p50_ms"]), (4, 2.0, 2.5))

    def test_a_histogram_nothing_observed_gives_no_summary(self):
        self.assertIsNone(br.stage_summary(SCRAPE_1, SCRAPE_1, "firstseen_commit_seconds"))
        self.assertIsNone(br.stage_summary("", "", "firstseen_publish_batch_seconds"))

    def test_stages_reads_each_nodes_two_scrapes(self):
        with tempfile.TemporaryDirectory() as work:
            for name, text in (("metrics0-1.txt", SCRAPE_0), ("metrics1-1.txt", SCRAPE_1)):
                with open(os.path.join(work, name), "w") as f:
                    f.write(text)
            nodes = br.stages(work, nodes=(1,))
        self.assertEqual(list(nodes[0]), ["commit_seconds"])


class Arithmetic(unittest.TestCase):
    def test_syncs_per_second_and_mean_sync_per_node(self):
        before = [100, 1.0, 100, 0, 0, 0]
        after = [700, 2.5, 400, 60, 0, 0]
        self.assertEqual(br.syncs(60, before, after), [
            {"log_syncs_per_sec": 10.0, "mean_sync_ms": 5.0},
            {"log_syncs_per_sec": 1.0, "mean_sync_ms": None},
        ])

    def test_slope_is_mb_per_minute(self):
        self.assertEqual(br.slope([(0, 100), (30, 101), (60, 102)]), 2.0)
        self.assertIsNone(br.slope([(0, 1), (5, 2)]))
        self.assertIsNone(br.slope([(5, 1), (5, 2), (5, 3)]))

    def test_rss_steadiness_is_read_only_once_the_window_is_full(self):
        samples = [[t, 100 + t, 200, 300] for t in (5, 10, 40, 45, 50, 55)]
        _, steady = br.rss_figures(samples, window_secs=30)
        self.assertEqual(steady["from_secs"], 40)
        self.assertEqual(steady["first_mb_per_node"], [140, 200, 300])
        self.assertEqual(steady["mb_per_minute_per_node"], [60.0, 0.0, 0.0])


class Result(unittest.TestCase):
    def inputs(self):
        step = lambda rate, ok: {"load": {"unique": rate * 10, "secs": 10}, "probe": probe(), "kept_up": ok}
        failover = {
            "probe": probe(fault={"resumed_after_mark_ms": 1500, "gap_ms": 1400}),
            "catch_up": {"missed_entries": 40, "secs": 2.0, "entries_per_sec": 20, "caught_up": True},
            "killed_node": 2,
        }
        return {
            "machine": {"cpus": 2, "platform": "test"},
            "peak_secs": 60.0, "window_secs": 30, "cpu": [30.0, 15.0, 15.0], "rss": [300.0, 250.0, 250.0],
            "peak": {"probe": probe(unique=120000, expected=120000)},
            "naive_peak": {"probe": probe(p99=25.0)},
            "status": {"totals": {"window_keys": 1000}, "disk_bytes": 500000, "state_disk_bytes": 200000},
            "raft": {"entries": 6000, "bytes": 60000000},
            "rss_samples": [[t, 300, 250, 250] for t in (5, 40, 45, 50)],
            "failovers": [failover],
            "sustained": [step(2000, True), step(4000, False)],
            "naive": [step(2000, True), step(8000, True)],
            "outage": {"buffered": 20000, "pulsar_start_ms": 9000, "drain_ms": 4000},
            "fanout": {"rate_per_subscriber": 40000.0},
            "window": {"bytes_per_key": 120.0, "window_keys": 500000},
            "sync": {"sled_flush_only": {"mean_us": 50.0}, "durable_sync": {"mean_us": 900.0}},
            "syncs": [{"log_syncs_per_sec": 100.0, "mean_sync_ms": 1.0}] * 3,
            "naive_cpu": [0.1, 0.1, 0.1], "export_ms": [12, 15], "verify_ok": True,
        }

    def test_the_result_holds_the_ratios_and_the_table_prints_every_row(self):
        result = br.build_result(self.inputs())
        self.assertEqual(result["sustained"]["max_rate"], 2000)
        self.assertEqual(result["naive"]["max_rate"], 8000)
        self.assertEqual(result["ratios"], {"cluster_vs_naive": 0.25, "cluster_vs_fanout": 0.05})
        self.assertEqual(result["peak"]["cpu_share_per_node"], [0.5, 0.25, 0.25])
        self.assertEqual(result["peak"]["disk_bytes_per_key"], 500.0)
        self.assertEqual(result["outage"]["drain_per_sec"], 5000)
        self.assertEqual(result["failover"]["publishing_resumed_median_ms"], 1500)
        self.assertTrue(result["failover"]["exactly_once"])
        rows = dict(br.table(result))
        self.assertEqual(rows["  p99 cluster / naive"], 2.0)
        self.assertEqual(rows["restarted node catch-up (entries, s, /s)"], "40, 2.0, 20")
        # result.json is what docs/benchmarks.md quotes: it must serialise.
        json.dumps(result)

    def test_a_failover_without_a_fault_seen_is_not_exactly_once_evidence(self):
        inputs = self.inputs()
        inputs["failovers"][0]["probe"] = probe(unique=99)
        result = br.build_result(inputs)
        self.assertFalse(result["failover"]["exactly_once"])
        self.assertIsNone(result["failover"]["publishing_resumed_median_ms"])

    def test_the_result_command_reads_the_files_a_run_writes(self):
        i = self.inputs()
        files = {
            "peak.json": i["peak"], "naive-peak.json": i["naive_peak"], "status.json": i["status"],
            "raft.json": i["raft"], "outage.json": i["outage"], "fanout.json": i["fanout"],
            "window.json": i["window"], "sync.json": i["sync"], "syncs.json": i["syncs"],
        }
        with tempfile.TemporaryDirectory() as work:
            for name, value in files.items():
                with open(os.path.join(work, name), "w") as f:
                    json.dump(value, f)
            for name, rows in (("failovers.jsonl", i["failovers"]), ("sustained.jsonl", i["sustained"]),
                               ("naive.jsonl", i["naive"])):
                with open(os.path.join(work, name), "w") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in rows))
            texts = {
                "rss.txt": "".join(" ".join(str(x) for x in s) + "\n" for s in i["rss_samples"]),
                "naive-cpu.txt": "0.1 0.1 0.1 ", "export-ms.txt": "12\n15\n", "verify.ok": "true\n",
                "cpu-firstseen.txt": "1.0", "pulsar-cpu-firstseen.txt": "0.3",
                "cpu-naive.txt": "0.3", "pulsar-cpu-naive.txt": "0.2",
            }
            for name, text in texts.items():
                with open(os.path.join(work, name), "w") as f:
                    f.write(text)
            out = os.path.join(work, "result.json")
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                br.main(["result", work, "60", out, "30", "15", "15", "300", "250", "250", "30"])
            with open(out) as f:
                written = json.load(f)
        self.assertEqual(written["ratios"], br.build_result(i)["ratios"])
        self.assertEqual(written["peak"]["snapshot_export_ms"], [12, 15])
        # No Benthos ran (BENCH_BENTHOS=0): two systems, no ratios to it.
        self.assertEqual([r["system"] for r in written["competitors"]["systems"]], ["firstseen", "naive"])
        self.assertEqual(written["competitors"]["against_benthos"], [])


class Competitors(unittest.TestCase):
    def test_a_row_counts_cpu_per_message_and_pulsar_per_message_it_stored(self):
        naive = br.competitor_row("naive", "naive", {"probe": probe(unique=2000, copies=3)},
                                  [0.1, 0.1, 0.1], 0.6, None, 1.0)
        self.assertFalse(naive["exactly_once"], "three copies of each")
        self.assertEqual(naive["cpu_us_per_message"], 150.0)
        self.assertEqual(naive["pulsar_cpu_us_per_message"], 100.0, "per message stored: 6,000 a second")
        self.assertIsNone(naive["max_rate"])
        fs = br.competitor_row("firstseen", "fs", {"probe": probe(unique=2000, clean=False)},
                               [0.5], 0.2, None, 1.0)
        self.assertFalse(fs["exactly_once"], "firstseen also needs the audit clean")

    def test_ratios_to_benthos_say_which_targets_are_met(self):
        steps = lambda best: [br.step({"unique": best * 10, "secs": 10}, probe(unique=best * 10, expected=best * 10), 10, 5)]
        row = lambda name, p99, cpu, pulsar, best: br.competitor_row(
            name, name, {"probe": probe(unique=2000, expected=2000, p99=p99)}, cpu, pulsar, steps(best), 1.0)
        rows = [
            row("firstseen", 30.0, [0.5], 0.2, 16000),
            row("benthos", 20.0, [0.1], 0.1, 16000),
            row("benthos-tuned", 20.0, [0.1], 0.1, 12000),
            row("benthos-ha", 20.0, [0.3, 0.1], 0.1, 8000),
        ]
        got = {a["figure"]: (a["ratio"], a["met"]) for a in br.against_benthos(rows)}
        self.assertEqual(got["p50 at the peak / single Benthos"], (1.0, True))
        self.assertEqual(got["p99 at the peak / single Benthos"], (1.5, False))
        self.assertEqual(got["highest rate kept up / tuned Benthos"], (1.33, True))
        self.assertEqual(got["CPU at the peak / Benthos x3 + Redis"], (1.25, False))
        self.assertEqual(got["Pulsar CPU per message / single Benthos"], (2.0, False))
        table = "\n".join(br.competitor_table({"systems": rows, "against_benthos": br.against_benthos(rows)}))
        self.assertIn("| benthos-ha | 10.0 / 20.0 | yes | 1.0 | 0.3 + 0.1 |", table)


class CommandLine(unittest.TestCase):
    """Every subcommand bench.sh calls, through `main`, as bench.sh calls it."""

    def run_main(self, *argv, stdin=None):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if stdin is None:
                br.main(list(argv))
            else:
                real = sys.stdin
                sys.stdin = io.StringIO(stdin)
                try:
                    br.main(list(argv))
                finally:
                    sys.stdin = real
        return out.getvalue().strip()

    def test_every_subcommand_runs(self):
        with tempfile.TemporaryDirectory() as work:
            def put(name, value):
                with open(os.path.join(work, name), "w") as f:
                    f.write(value if isinstance(value, str) else json.dumps(value))
                return os.path.join(work, name)

            sent = put("load.json", {"unique": 100, "secs": 10})
            seen = put("probe.json", probe(fault={"resumed_after_mark_ms": 1200, "gap_ms": 1100}))
            row = json.loads(self.run_main("step", sent, seen, "10", "5"))
            self.assertTrue(row["kept_up"])
            self.assertEqual(self.run_main("describe-step", stdin=json.dumps(row)), "kept up p99 50.0 ms")
            self.assertEqual(self.run_main("describe-step", "naive", stdin=json.dumps(row)), "kept up copies/msg 1.0")
            status = {"leader": 2, "last_applied": 9, "topics": [{"last_seq": 5}],
                      "totals": {"observed": 6, "outbox_messages": 0, "window_keys": 4},
                      "disk_bytes": 400, "state_disk_bytes": 100}
            self.assertEqual(self.run_main("status", "leader", stdin=json.dumps(status)), "2")
            catchup = put("catchup.json", {"missed_entries": 1, "secs": 1.0, "entries_per_sec": 1, "caught_up": True})
            killed = put("killed", "3\n")
            # A failover step's output is a step row, as `step` printed it.
            stepped = put("failover.json", row)
            f = json.loads(self.run_main("failover", stepped, catchup, killed))
            self.assertEqual((f["killed_node"], f["catch_up"]["caught_up"]), (3, True))
            self.assertTrue(br.failover_row(f)["exactly_once"])
            self.assertIn("publishing resumed 1200 ms", self.run_main("describe-failover", stepped, catchup))
            self.assertEqual(json.loads(self.run_main("syncs", "10", "0 0 0", "100 0.5 100")),
                             [{"log_syncs_per_sec": 10.0, "mean_sync_ms": 5.0}])
            for i in (1, 2, 3):
                put(f"metrics0-{i}.txt", SCRAPE_0)
                put(f"metrics1-{i}.txt", SCRAPE_1)
            self.assertEqual(len(json.loads(self.run_main("stages", work))), 3)
            put("peak.json", {"probe": probe()})
            put("naive-peak.json", {"probe": probe()})
            put("status.json", status)
            put("export-ms.txt", "7\n")
            put("naive-cpu.txt", "0.1 0.1 0.1 ")
            put("syncs.json", "[]")
            put("stages.json", "[]")
            for name in ("firstseen", "naive"):
                put(f"cpu-{name}.txt", "0.5")
                put(f"pulsar-cpu-{name}.txt", "0.25")
            put("benthos-peak.json", {"probe": probe()})
            put("cpu-benthos.txt", "0.1")
            put("pulsar-cpu-benthos.txt", "0.05")
            self.assertEqual(self.run_main("describe-peak", os.path.join(work, "benthos-peak.json")),
                             "p50 / p99 10.0 / 50.0 ms, 100 of 100 unique, copies 1.0")
            self.assertIn("| Benthos, one process | 10.0 / 50.0 | yes |", self.run_main("competitors", work, "60"))
            with open(os.path.join(work, "competitors.json")) as f:
                self.assertEqual(len(json.load(f)["systems"]), 3)
            summary = self.run_main("peak-summary", work, "60", "30", "15", "15")
            self.assertIn("node CPU over the peak (core-seconds per second): 0.5 0.25 0.25", summary)
            self.assertIn("disk per window key: state+log 100.0 state 25.0 keys 4", summary)


if __name__ == "__main__":
    unittest.main()
