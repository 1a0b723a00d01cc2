"""`attnserve encode`'s host-side threads on and off (issue 48 item 7): does the pipelined host side (a thread that
tokenizes the next chunk while the engine runs this one, a thread that writes the last) cost the engine its cores?

Each variant is the real `attnserve encode` of the same mixed-length corpus in a process of its own, the offline
driver's executors swapped as it starts:

  pipelined    as shipped: the tokenize thread and the writer thread
  serial       neither: read, tokenize, run and write one after the other
  no-tokenize  the writer thread alone
  no-writer    the tokenize thread alone
  nice         both, each helper thread at nice 10, so that onnxruntime's or OpenVINO's threads come first

Rounds are round-robin over every variant and precision, so that a slow spell of the shared machine lands on all of
them. Prints each variant's best and median tokens/s (the command's own summary line) and its ratio to pipelined.
Measures, does not test.

    python bench/bench_host_threads.py [--texts 2000] [--rounds 4] [--precisions auto int8] [--artifacts DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VARIANTS = ("pipelined", "serial", "no-tokenize", "no-writer", "nice")
NICE = 10


class Inline:
    """An executor that runs each job at once in the caller's thread: the driver's work without the thread."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self) -> Inline:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 (the caller's result() raises it, as a thread's would)
            future.set_exception(error)
        return future


def niced(*args, **kwargs) -> ThreadPoolExecutor:
    """A pool whose threads run at nice NICE (Linux sets niceness per thread)."""
    return ThreadPoolExecutor(*args, initializer=lambda: os.setpriority(
        os.PRIO_PROCESS, threading.get_native_id(), NICE), **kwargs)


def run_variant(variant: str, argv: list[str]) -> int:
    """In the child process: the CLI with the offline driver's executors swapped for the variant."""
    from attnserve.offline import encode as local
    from attnserve.offline import job

    if variant in ("serial", "no-tokenize"):
        local.ThreadPoolExecutor = Inline  # type: ignore[attr-defined,assignment]
    if variant in ("serial", "no-writer"):
        job.ThreadPoolExecutor = Inline  # type: ignore[attr-defined,assignment]
    if variant == "nice":
        local.ThreadPoolExecutor = job.ThreadPoolExecutor = niced  # type: ignore[attr-defined,assignment]
    from attnserve.cli import main

    return main(argv)


def main() -> int:
    if sys.argv[1:2] == ["--variant"]:  # the child's own call: the variant, then the CLI's arguments
        return run_variant(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--precisions", nargs="+", default=["auto", "int8"])
    parser.add_argument("--artifacts", default=None, help="default: the default model's, exported as needed")
    args = parser.parse_args()

    from bench_encode import SUMMARY
    from machine import machine_lines

    from attnserve.loadtest.corpus import mixed_length_corpus

    print("\n".join(machine_lines()))
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-threads-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("".join(t + "\n" for t in mixed_length_corpus(args.texts, 0)), encoding="utf-8")
        for round_ in range(args.rounds):
            for precision in args.precisions:
                for variant in VARIANTS:
                    cmd = [sys.executable, __file__, "--variant", variant, "encode", str(corpus), "-o",
                           str(Path(tmp) / f"{variant}.parquet"), "--precision", precision, "--provider", "cpu",
                           "--no-progress", *(["--artifacts", args.artifacts] if args.artifacts else [])]
                    done = subprocess.run(cmd, capture_output=True, text=True)
                    lines = done.stdout.strip().splitlines()
                    summary = SUMMARY.match(lines[-1]) if lines else None
                    if done.returncode != 0 or summary is None:
                        print(f"{precision} {variant}: failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                        return 1
                    rates.setdefault((precision, variant), []).append(float(summary.group(4)))
                    print(f"round {round_ + 1} {precision:5s} {variant:12s} {rates[precision, variant][-1]:9,.0f} "
                          "tokens/s", file=sys.stderr, flush=True)
    print(f"{args.texts} mixed-length texts, {args.rounds} rounds, round-robin; tokens/s")
    print(f"{'precision':10s} {'variant':12s} {'best':>9s} {'median':>9s}  best ÷ pipelined's  median ÷ pipelined's")
    for precision in args.precisions:
        base = rates[precision, "pipelined"]
        for variant in VARIANTS:
            got = rates[precision, variant]
            print(f"{precision:10s} {variant:12s} {max(got):9,.0f} {statistics.median(got):9,.0f}  "
                  f"{max(got) / max(base):18.2f}  {statistics.median(got) / statistics.median(base):20.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
