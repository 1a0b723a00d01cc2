"""The load test's picture: every request's latency over time, and the latency histogram."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnserve.client.plot import pyplot, save_figure

from .generator import Sample

ERROR_COLORS = ["tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:gray", "tab:olive"]


def draw_latency(samples: list[Sample], report: dict, path: Path) -> None:
    plt = pyplot()
    measured = [s for s in samples if s.measured]
    start = report["warmup_s"]
    ok = [s for s in measured if s.ok]
    fig, (over_time, histogram) = plt.subplots(2, 1, figsize=(11, 8))

    if ok:
        over_time.scatter([s.due - start for s in ok], [s.latency * 1e3 for s in ok], s=4, alpha=0.35,
                          color="tab:blue", label="ok", rasterized=True)
    for code, color in zip(sorted({s.code for s in measured if not s.ok}), ERROR_COLORS * 4, strict=False):
        failed = [s for s in measured if s.code == code]
        over_time.scatter([s.due - start for s in failed], [max(s.latency * 1e3, 1e-3) for s in failed], s=6,
                          marker="x", alpha=0.5, color=color, label=code.lower(), rasterized=True)
    timeline = [row for row in report["timeline"] if row["p99_ms"] is not None]
    if timeline:
        t = [row["t"] + 0.5 for row in timeline]
        over_time.plot(t, [row["p50_ms"] for row in timeline], color="black", lw=1.2, label="p50 per second")
        over_time.plot(t, [row["p99_ms"] for row in timeline], color="tab:red", lw=1.2, label="p99 per second")
    over_time.set_yscale("log")
    over_time.set_xlabel("seconds since the measured load began (by when each request was due)")
    over_time.set_ylabel("latency (ms)")
    over_time.legend(loc="upper left", fontsize=8, markerscale=2)
    over_time.grid(True, which="both", alpha=0.3)

    latency = report["latency_ms"]
    if ok:
        ms = np.array([s.latency * 1e3 for s in ok])
        bins = np.geomspace(max(ms.min(), 1e-2), max(ms.max(), ms.min() * 1.01, 1e-2 * 1.01), 60)
        histogram.hist(ms, bins=bins, color="tab:blue", alpha=0.8)
        histogram.set_xscale("log")
        for p, style in (("p50", ":"), ("p90", "--"), ("p99", "-")):
            histogram.axvline(latency[p], color="tab:red", ls=style, lw=1, label=f"{p} {latency[p]:.1f} ms")
        histogram.legend(fontsize=8)
    histogram.set_xlabel("latency of ok replies (ms)")
    histogram.set_ylabel("requests")

    load = (f"open loop {report['rate']:g} req/s" if report["mode"] == "open"
            else f"closed loop, {report['concurrency']} in flight")
    fig.suptitle(f"{report['target']}: {load}; {report['requests_per_s']} req/s ok, "
                 f"{report['requests']['errors']} errors of {report['requests']['sent']}")
    fig.tight_layout()
    save_figure(fig, path)
