"""The campaign's timeline as a picture: throughput into Pulsar and latency
over time, with every fault drawn where it happened."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "kill": "#d62728", "pause": "#ff7f0e", "cut": "#9467bd", "one_way_cut": "#c5b0d5",
    "lossy": "#8c564b", "cut_pulsar": "#17becf", "cut_mqtt": "#bcbd22", "power_loss": "#e377c2",
    "disk_full": "#7f7f7f", "power_loss_all": "#000000", "pulsar_restart": "#1f77b4",
    "mqtt_restart": "#2ca02c", "clock_skew": "#aec7e8", "clock_jump": "#98df8a",
}


def timeline(t_pub, arrived, faults, load, path, title=""):
    """`arrived[i]`: when message i first reached the live reader."""
    start = load["start"]
    end = start + load["seconds"] + 30
    width = 1.0
    nbins = int((end - start) / width) + 1
    arrivals = [0] * nbins
    lat = [[] for _ in range(int(nbins / 5) + 1)]
    for i, t in enumerate(arrived):
        if math.isnan(t):
            continue
        b = int((t - start) / width)
        if 0 <= b < nbins:
            arrivals[b] += 1
        if i < len(t_pub) and not math.isnan(t_pub[i]):
            k = int((t - start) / 5)
            if 0 <= k < len(lat):
                lat[k].append((t - t_pub[i]) * 1000)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(14, 7), sharex=True)
    xs = [b * width for b in range(nbins)]
    a1.plot(xs, arrivals, lw=0.7, color="#333333")
    a1.set_ylabel("messages into Pulsar / s")
    p50 = [sorted(v)[len(v) // 2] if v else float("nan") for v in lat]
    p99 = [sorted(v)[min(len(v) - 1, int(len(v) * 0.99))] if v else float("nan") for v in lat]
    lx = [k * 5 for k in range(len(lat))]
    a2.plot(lx, p50, lw=0.8, label="p50")
    a2.plot(lx, p99, lw=0.8, label="p99")
    a2.set_yscale("log")
    a2.set_ylabel("publish → Pulsar (ms)")
    a2.set_xlabel("seconds into the campaign")
    a2.legend(loc="upper right")
    seen = set()
    for f in faults:
        c = COLORS.get(f["kind"], "#cccccc")
        s, e = f["start"], max(f["end"], f["start"] + 0.5)
        label = f["kind"] if f["kind"] not in seen else None
        seen.add(f["kind"])
        for ax in (a1, a2):
            ax.axvspan(s, e, color=c, alpha=0.25, lw=0, label=label if ax is a1 else None)
    a1.legend(loc="upper right", fontsize=7, ncol=4)
    a1.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
