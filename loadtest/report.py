"""The load test's report: one dict (written as --json) and the table printed from it."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from .generator import LoadShape, Sample

PERCENTILES = (50, 90, 99)
# An open loop whose requests left later than due by this much (p99), and by a tenth of the median
# latency, was held back by this process, not the server: its latencies then mostly measure the generator.
GENERATOR_LAG_WARNING_MS = 10.0


def _latency_ms(latencies: np.ndarray) -> dict:
    if not len(latencies):
        return {f"p{p}": None for p in PERCENTILES} | {"max": None, "mean": None}
    ms = latencies * 1e3
    return ({f"p{p}": round(float(np.percentile(ms, p)), 3) for p in PERCENTILES}
            | {"max": round(float(ms.max()), 3), "mean": round(float(ms.mean()), 3)})


def _timeline(samples: list[Sample], start: float) -> list[dict]:
    """Per second of the measured run, by when requests were due: what was sent, answered and how fast."""
    if not samples:
        return []
    seconds = int(max(s.due for s in samples) - start) + 1
    bins: list[list[Sample]] = [[] for _ in range(seconds)]
    for s in samples:
        bins[int(s.due - start)].append(s)
    rows = []
    for t, group in enumerate(bins):
        ok = np.array([s.latency for s in group if s.ok])
        rows.append({"t": t, "sent": len(group), "retried": sum(s.retry for s in group), "ok": len(ok),
                     "errors": len(group) - len(ok), "p50_ms": _latency_ms(ok)["p50"],
                     "p99_ms": _latency_ms(ok)["p99"]})
    return rows


def summarize(samples: list[Sample], shape: LoadShape, inputs_per_request: int) -> dict:
    """The measured requests (due after the warm-up), every one of them counted under its status code."""
    measured = [s for s in samples if s.measured]
    start = shape.warmup
    elapsed = max((s.done for s in measured), default=start) - start
    ok = [s for s in measured if s.ok]
    codes = Counter(s.code for s in measured)
    latencies = np.array([s.latency for s in ok])
    lag = np.array([s.sent - s.due for s in measured])
    per_s = (lambda n: round(n / elapsed, 2)) if elapsed > 0 else (lambda n: None)
    # Sent over the time spent sending, not waiting for the last replies: the rate the server was offered.
    sending = max((s.sent for s in measured), default=start) - start
    return {
        "mode": "open" if shape.rate else "closed",
        "concurrency": shape.concurrency or None,
        "rate": shape.rate or None,
        "duration_s": shape.duration or None,
        "request_limit": shape.requests or None,
        "warmup_s": shape.warmup,
        "inputs_per_request": inputs_per_request,
        # retried: how many of those sent were a refused request sent again (after a backoff).
        "requests": {"sent": len(measured), "answered": sum(codes.values()), "ok": len(ok),
                     "errors": len(measured) - len(ok), "retried": sum(s.retry for s in measured),
                     "warmup": len(samples) - len(measured)},
        "tokens": sum(s.tokens for s in ok),
        "codes": dict(codes.most_common()),
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": per_s(len(ok)),
        "tokens_per_s": per_s(sum(s.tokens for s in ok)),
        "inputs_per_s": per_s(len(ok) * inputs_per_request),
        "sent_per_s": round(len(measured) / sending, 2) if sending > 0 else None,
        "latency_ms": _latency_ms(latencies),
        "generator_lag_ms": {"p99": round(float(np.percentile(lag, 99)) * 1e3, 3) if len(lag) else None,
                             "max": round(float(lag.max()) * 1e3, 3) if len(lag) else None},
        "timeline": _timeline(measured, start),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms" if value < 10_000 else f"{value / 1e3:.1f} s"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def format_table(report: dict) -> str:
    r, lat, lag = report["requests"], report["latency_ms"], report["generator_lag_ms"]
    if report["mode"] == "open":
        load = f"open loop, {_num(report['rate'])} requests/s offered"
    else:
        load = f"closed loop, {report['concurrency']} requests in flight"
    bound = " and ".join(x for x in (f"{report['duration_s']:g} s" if report["duration_s"] else "",
                                     f"{report['request_limit']} requests" if report["request_limit"] else "") if x)
    lines = [
        f"attnserve loadtest: {report['target']} ({report['model']}) over {report['route']}",
        f"load: {load} for {bound}" + (f" after {report['warmup_s']:g} s of warm-up" if report["warmup_s"] else "")
        + f"; {report['inputs_per_request']} input(s) per request from the {report['input']}",
        "",
        f"requests     {r['sent']} sent, {r['answered']} answered: {r['ok']} ok, {r['errors']} errors"
        + (f"  ({r['warmup']} more during warm-up, not counted)" if r["warmup"] else ""),
        f"retried      {r['retried']} of those sent: refused requests sent again after a backoff",
        f"throughput   {_num(report['requests_per_s'])} requests/s, {_num(report['tokens_per_s'], 0)} tokens/s "
        f"over {report['elapsed_s']:.2f} s (sent {_num(report['sent_per_s'])} requests/s)",
        "latency (ok) " + "   ".join(f"p{p} {_ms(lat[f'p{p}'])}" for p in PERCENTILES) + f"   max {_ms(lat['max'])}",
    ]
    if report["codes"]:
        width = max(len(c) for c in report["codes"])
        lines += ["", "status" + " " * (width - 6) + "   requests"]
        lines += [f"{code:<{width}}   {count:>8}" for code, count in report["codes"].items()]
    if report.get("stopped_early"):
        lines += ["", "stopped early (signal): the numbers cover the requests sent until then"]
    if (report["mode"] == "open" and lag["p99"] is not None and lag["p99"] > GENERATOR_LAG_WARNING_MS
            and lag["p99"] > 0.1 * (lat["p50"] or 0.0)):
        lines += ["", f"warning: requests left late (p99 {_ms(lag['p99'])}, max {_ms(lag['max'])} after due): this "
                      "process could not keep the rate; the latencies include that delay"]
    return "\n".join(lines)
