"""Offline encoding at scale: local engine against Ray on one machine, and memory as the input grows.

    python bench/bench_offline.py                      # Ray vs local on 2000 texts; memory at 20k and 200k rows
    python bench/bench_offline.py --skip-ray --small 2000 --large 20000   # a quick check

Every run is the real `attnserve encode` command in a subprocess, so what is
measured is what a user runs. tokens/s comes from the command's own summary
line. Peak memory is the child's maximum resident set size
(getrusage RUSAGE_CHILDREN, taken in a fresh wrapper process per run, so one
run's peak cannot hide another's).

The memory runs use short texts (4-12 words) and the int8 graph so that
200,000 rows finish in minutes on 2 cores: what they test is that the input is
streamed, which does not depend on text length. Target: the 200k-row peak is
under 1.5x the 20k-row peak. Ray on one machine: at least 0.7x the local
engine's tokens/s on the mixed-length corpus.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnserve.loadtest.corpus import SAMPLE_TEXTS, mixed_length_corpus

try:
    from report import table, target_line  # run as a script: bench/ is on sys.path
except ImportError:
    from bench.report import table, target_line

SUMMARY = re.compile(r"encoded (\d+) texts, (\d+) tokens in ([\d.]+)s: ([\d.]+) tokens/s, padding ([\d.]+)% -> ")
TARGETS = {"ray": (">=", 0.7, "0.7x"), "memory": ("<=", 1.5, "1.5x")}

# Runs `argv` as a child and prints its peak RSS in KiB: a fresh process per measurement.
PEAK_RSS = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stderr.write(r.stderr); print(r.stdout, end=''); "
            "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")


def short_texts(n: int, seed: int = 0) -> list[str]:
    words = SAMPLE_TEXTS.read_text().split()
    rng = np.random.default_rng(seed)
    starts, lengths = rng.integers(0, len(words), n), rng.integers(4, 13, n)
    return [" ".join(words[(s + i) % len(words)] for i in range(k)) for s, k in zip(starts, lengths, strict=True)]


def encode(source: Path, out: Path, artifacts: str | None, *flags: str) -> dict:
    argv = [sys.executable, "-m", "attnserve.cli", "encode", str(source), "-o", str(out), "--no-progress",
            "--overwrite", *(["--artifacts", artifacts] if artifacts else []), *flags]
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, *argv], capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[3:])} failed:\n{result.stderr[-2000:]}")
    match = SUMMARY.search(result.stdout)
    peak = int(re.search(r"peak_rss_kib (\d+)", result.stdout).group(1))
    return {"texts": int(match[1]), "tokens": int(match[2]), "seconds": float(match[3]),
            "tokens_per_s": float(match[4]), "padding": float(match[5]) / 100, "peak_rss_mib": peak / 1024}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000, help="mixed-length corpus for Ray vs local (default 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of Ray vs local; best is kept (default 2)")
    parser.add_argument("--small", type=int, default=20_000, help="rows of the smaller memory run (default 20000)")
    parser.add_argument("--large", type=int, default=200_000, help="rows of the larger memory run (default 200000)")
    parser.add_argument("--artifacts", help="artifact directory (default: as `attnserve encode` resolves it)")
    parser.add_argument("--skip-ray", action="store_true", help="skip the Ray runs")
    parser.add_argument("--json", help="also write every number to this JSON file")
    args = parser.parse_args(argv)

    results: dict = {}
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        corpus.write_text("\n".join(mixed_length_corpus(args.texts, 0)) + "\n")
        runs = {"local": [], "ray": []}
        for round_ in range(args.rounds):
            for name in (("local", "ray") if round_ % 2 == 0 else ("ray", "local")):
                if name == "ray" and args.skip_ray:
                    continue
                flags = ("--engine", "ray") if name == "ray" else ()
                runs[name].append(encode(corpus, work / f"{name}.parquet", args.artifacts, *flags))
                print(f"bench: round {round_ + 1}: {name} {runs[name][-1]['tokens_per_s']:.0f} tokens/s",
                      file=sys.stderr)
        best = {name: max(r, key=lambda x: x["tokens_per_s"]) for name, r in runs.items() if r}
        results["throughput"] = best
        local = best["local"]["tokens_per_s"]
        rows = [(f"{name} encode", f"{r['tokens_per_s']:.0f}", f"{r['padding']:.1%}",
                 f"{r['tokens_per_s'] / local:.2f}x") for name, r in best.items()]
        lines += [f"corpus: {args.texts} mixed-length texts, {best['local']['tokens']} tokens; best of "
                  f"{args.rounds} rounds", "", table(rows, "local"), ""]

        memory = {}
        for n in (args.small, args.large):
            source = work / f"short-{n}.txt"
            source.write_text("\n".join(short_texts(n)) + "\n")
            memory[n] = encode(source, work / f"short-{n}.parquet", args.artifacts, "--precision", "int8")
            print(f"bench: {n} rows: peak {memory[n]['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        results["memory"] = {str(n): m for n, m in memory.items()}
        for n, m in memory.items():
            lines.append(f"memory: {n:>7} short rows (int8): peak RSS {m['peak_rss_mib']:6.0f} MiB, "
                         f"{m['tokens_per_s']:.0f} tokens/s, {m['seconds']:.1f} s")
        ratio = memory[args.large]["peak_rss_mib"] / memory[args.small]["peak_rss_mib"]
        lines.append("")
        targets = {}
        ray_ratio = best["ray"]["tokens_per_s"] / local if "ray" in best else None
        for label, key, value, shown in (
                ("ray vs local tokens/s", "ray", ray_ratio, f"{ray_ratio:.2f}x" if ray_ratio else "-"),
                (f"peak memory {args.large // 1000}k / {args.small // 1000}k rows", "memory", ratio, f"{ratio:.2f}x")):
            line, targets[key] = target_line(TARGETS, label, key, value, shown)
            lines.append(line)
        results["targets"] = targets
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
