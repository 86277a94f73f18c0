"""Prints run.sh's JSON lines as one table, then the highest rate kept up."""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]


def name(r):
    if r["version"].startswith("0.9"):
        return "0.9"
    return "0.10-seq" if r["sequential"] else "0.10-pipe"


def f(x):
    return "-" if x is None else f"{x:.1f}"


print(f"{'tag':<8} {'load':>5} {'delay':>5} {'rate':>6} {'version':<10} {'p50':>7} {'p90':>7} {'p99':>7} "
      f"{'max':>7} {'achieved':>8} {'appends e/0':>12} {'ent/app':>7} {'fsyncs':>6} {'cpu':>5} {'fsync^':>6} kept_up")
for t in rows:
    r = t["run"]
    a = r["append_rpcs"]
    print(f"{t['tag']:<8} {t.get('load1', 0):>5.2f} {r['delay_ms']:>5g} {r['rate']:>6g} {name(r):<10} {f(r['p50_ms']):>7} "
          f"{f(r['p90_ms']):>7} {f(r['p99_ms']):>7} {f(r['max_ms']):>7} {r['achieved_rate']:>8.1f} "
          f"{str(a['with_entries']) + '/' + str(a['empty']):>12} {r['mean_entries_per_append']:>7.1f} "
          f"{r['leader_fsyncs']:>6} {r.get('cpu_cores', 0):>5.2f} {r.get('max_fsync_ms', 0):>6.1f} {r['kept_up']}"
          + ("" if r.get("term_changes", 0) == 0 else f" (leader changed: {r['term_changes']} terms)"))

best = {}
for t in rows:
    r = t["run"]
    if r["delay_ms"] == 10 and r["kept_up"]:
        best[name(r)] = max(best.get(name(r), 0), r["rate"])
print()
print("highest rate kept up at 10 ms one way (of those run):",
      ", ".join(f"{k} {v:g}/s" for k, v in sorted(best.items())))
