"""Figures from a load generator nobody here wrote (issue 48, item 4): NVIDIA's AIPerf against attnserve's
`/v1/embeddings`, beside attnserve's own `attnserve loadtest` over the same door, the same texts and concurrency,
one server, in one run.

AIPerf brings its own dependencies (it pins versions the suite does not run), so it lives in a venv of its own:

    python -m venv /tmp/aiperf && /tmp/aiperf/bin/pip install aiperf
    python bench/bench_aiperf.py --aiperf /tmp/aiperf/bin/aiperf [--concurrency 64] [--requests 4000]

Both load generators run a closed loop of --concurrency clients, one text of the mixed-length corpus a request
(loadtest/corpus.py; AIPerf reads the same texts as a single_turn dataset), each measured after a warm-up. AIPerf
needs a tokenizer to count tokens: it gets the served model's own tokenizer.json folder, read locally (no hub).
Printed: requests/s, p50 and p99 latency of each, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import cpu_seconds, scrape, start_server, stop_server  # noqa: E402


def measured(server, run) -> tuple[dict, dict]:
    """run()'s numbers, and what the load cost: the server's CPU ms per request it answered (/v1/embeddings, warm-up
    requests included, from its own counters) and the load generator's whole process tree's CPU seconds."""
    before, server_cpu = scrape(server, http=True), cpu_seconds(server.process.pid)
    children = os.times()
    numbers = run()
    after = os.times()
    answered = (scrape(server, http=True) - before).embed_requests
    generator = (after.children_user + after.children_system) - (children.children_user + children.children_system)
    return numbers, {"server_ms_per_request": 1e3 * (cpu_seconds(server.process.pid) - server_cpu) / answered,
                     "generator_cpu_s": generator, "answered": answered}


def attnserve_loadtest(url: str, corpus: Path, concurrency: int, requests: int, out: Path) -> dict:
    """attnserve's own load test over HTTP (OpenAI's /v1/embeddings, float): its JSON report."""
    subprocess.run([sys.executable, "-m", "attnserve.cli", "loadtest", "--protocol", "http", "--target", url,
                    "--concurrency", str(concurrency), "--requests", str(requests), "--warmup", "3",
                    "--input", str(corpus), "--encoding-format", "float", "--json", str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def aiperf(binary: str, url: str, model: str, tokenizer: Path, dataset: Path, concurrency: int, requests: int,
           out: Path) -> dict:
    """AIPerf's profile of the embeddings endpoint: its exported JSON (profile_export_aiperf.json)."""
    done = subprocess.run([binary, "profile", "--model", model, "--url", url, "--endpoint-type", "embeddings",
                    "--tokenizer", str(tokenizer), "--input-file", str(dataset),
                    "--custom-dataset-type", "single_turn", "--concurrency", str(concurrency),
                    "--request-count", str(requests), "--warmup-request-count", str(concurrency * 4),
                    "--output-artifact-dir", str(out), "--ui-type", "none", "--random-seed", "0",
                    # attnserve's metrics are on a port of their own; there is no GPU to read here.
                    "--no-server-metrics", "--no-gpu-telemetry",
                    # Its fewest processes: on 2 cores each one takes CPU from the server it measures.
                    "--workers-max", "1", "--record-processor-service-count", "1"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"aiperf exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise SystemExit(f"AIPerf wrote no profile_export_aiperf.json under {out}")
    return json.loads(found[-1].read_text())


def aiperf_numbers(profile: dict) -> dict:
    """requests/s and latency percentiles (ms) from AIPerf's export (its metrics by tag, each with avg/p50/p99)."""
    def metric(tag: str) -> dict:
        if tag in profile and isinstance(profile[tag], dict):
            return profile[tag]
        for record in profile.get("records", []) if isinstance(profile.get("records"), list) else []:
            if record.get("tag") == tag:
                return record
        raise SystemExit(f"AIPerf's export has no {tag}: {sorted(profile)[:20]}")

    latency = metric("request_latency")
    return {"requests_per_s": float(metric("request_throughput")["avg"]), "p50_ms": float(latency["p50"]),
            "p99_ms": float(latency["p99"]), "requests": int(metric("request_count")["avg"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf", default="aiperf", help="the aiperf command (its own venv's)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--artifacts", help="artifact directory (default: the default model's)")
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    from attnserve.default_model import default_checkpoint_dir, resolve_artifacts
    from attnserve.engine.machine import this_machine
    from attnserve.loadtest.corpus import mixed_length_corpus

    artifacts = resolve_artifacts(args.artifacts)
    model = json.loads((artifacts / "manifest.json").read_text())["model"]
    texts = mixed_length_corpus(2000, 0)
    with tempfile.TemporaryDirectory(prefix="bench-aiperf-") as tmp:
        corpus, dataset = Path(tmp) / "corpus.txt", Path(tmp) / "dataset.jsonl"
        corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
        dataset.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        server = start_server(artifacts, precision=args.precision)
        try:
            server.wait_serving(timeout=300)
            url = server.http_url
            ours, ours_cost = measured(server, lambda: loadtest_numbers(attnserve_loadtest(
                url, corpus, args.concurrency, args.requests, Path(tmp) / "loadtest.json")))
            theirs, theirs_cost = measured(server, lambda: aiperf_numbers(aiperf(
                args.aiperf, url, model, default_checkpoint_dir(), dataset, args.concurrency, args.requests,
                Path(tmp) / "aiperf")))
            again, again_cost = measured(server, lambda: loadtest_numbers(attnserve_loadtest(
                url, corpus, args.concurrency, args.requests, Path(tmp) / "again.json")))
        finally:
            stop_server(server)
    print(f"\nmachine: {this_machine().describe()}; load average {os.getloadavg()[0]:.2f}; {time.strftime('%F %T')}")
    print(f"server: `attnserve serve --precision {args.precision}` ({model}); {args.concurrency} clients, "
          f"{args.requests} requests of one text each, POST /v1/embeddings")
    print(f"{'load generator':34s} {'requests/s':>11s} {'p50 ms':>8s} {'p99 ms':>8s} {'server CPU ms/request':>22s} "
          f"{'generator CPU s':>16s}")
    rows = [("attnserve loadtest", ours, ours_cost), ("AIPerf " + aiperf_version(args.aiperf), theirs, theirs_cost),
            ("attnserve loadtest, again", again, again_cost)]
    for name, n, cost in rows:
        print(f"{name:34s} {n['requests_per_s']:11,.0f} {n['p50_ms']:8.2f} {n['p99_ms']:8.2f} "
              f"{cost['server_ms_per_request']:22.2f} {cost['generator_cpu_s']:16.1f}")
    mean = {k: (rows[0][1][k] + rows[2][1][k]) / 2 for k in ("requests_per_s", "p50_ms", "p99_ms")}
    print(f"AIPerf ÷ attnserve loadtest (the mean of its two runs): requests/s "
          f"{theirs['requests_per_s'] / mean['requests_per_s']:.2f}, p50 {theirs['p50_ms'] / mean['p50_ms']:.2f}, "
          f"p99 {theirs['p99_ms'] / mean['p99_ms']:.2f}")
    return 0


def loadtest_numbers(report: dict) -> dict:
    """requests/s and latency percentiles (ms) from `attnserve loadtest --json`."""
    latency = report["latency_ms"]
    return {"requests_per_s": float(report["requests_per_s"]), "p50_ms": float(latency["p50"]),
            "p99_ms": float(latency["p99"])}


def aiperf_version(binary: str) -> str:
    try:
        return subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
