"""Every GPU measurement this project has asked for, in one run and one report (issue 48, item 5). Run by
bench/gpu_check.sh, which installs onnxruntime-gpu first; it can run alone where attnserve[gpu] is installed.

    python bench/gpu_check.py --report gpu_report.txt            # on a machine with an NVIDIA GPU
    python bench/gpu_check.py --provider cpu --texts 200 --budget 300 --skip-8b    # a dry run of the steps, no GPU

Rows, in this order (each measured once, side by side in this run; what the deadline leaves no time for is named
in the report, not skipped silently):
  offline ÷ graph    all-MiniLM-L6-v2's fp16 graph (exported and verified on CUDA here): Engine.encode of the mixed
                     corpus (tokenizing, batching, the reply arrays) ÷ the same batches, already tokenized and
                     padded, through the session alone; target >= 0.6.
  serving ÷ offline  `serve --workers auto`, 256 gRPC clients, one text a request, over --channels connections (the
                     door processes share the port: one connection would reach one of them); target >= 0.7.
  door processes     requests/s of the same load with --workers 1, 2, 4, 8 and 16.
  batches in flight  --batches-in-flight 1 against 2 (workers auto).
  8B                 bench/bench_cuda_export.py: the Qwen3-Embedding-8B shape exported straight into fp16, its peak
                     RSS, and the first answer's cosine to sentence-transformers, in the time left.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_serve import BenchError, embed_request, offline_round, serving_round, start_server, stop_server  # noqa: E402

TARGETS = {"offline_over_graph": 0.6, "serving_over_offline": 0.7}
DOOR_PROCESSES = (1, 2, 4, 8, 16)
CLIENTS = 256


class Report:
    """The report's lines as they come (written after every row, so that a run cut short keeps what it measured)
    and every number in a JSON file beside it."""

    def __init__(self, path: Path):
        self.path, self.lines, self.numbers = path, [], {}

    def row(self, what: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else "PASS" if ok else "FAIL"
        self.line(f"{what:58s} {value:>24s} {target:>8s} {verdict}")

    def line(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        self.path.with_suffix(".json").write_text(json.dumps(self.numbers, indent=2, default=str) + "\n")


def machine(provider: str) -> str:
    import onnxruntime as ort

    gpu = "no GPU"
    if provider == "cuda":
        try:
            query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            gpu = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu = f"nvidia-smi failed: {e}"
    return (f"{gpu}; {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}); Python "
            f"{platform.python_version()}; onnxruntime {ort.__version__} {ort.get_available_providers()}")


def export(out: Path, precision: str, provider: str, timeout: float) -> float:
    """The default model's graph for the run, exported and verified on the provider; its seconds."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "attnserve.cli", "export", "--out", str(out), "--precision", precision,
                    "--provider", provider], check=True, timeout=timeout)
    return time.monotonic() - start


def offline_over_graph(engine, texts: list[str]) -> dict:
    """Engine.encode over the corpus, warm, against the graph alone on the same batches (fed before the clock)."""
    from attnserve.engine.batching import plan_batches

    engine.encode(texts, truncate=True)  # warm: every batch shape once
    start = time.perf_counter()
    encoded = engine.encode(texts, truncate=True)
    offline = time.perf_counter() - start
    tokenized = engine.tokenizer.encode_texts(texts, truncate=True)
    batches = plan_batches([len(x) for x in tokenized], engine.batch_tokens, engine.config.max_batch_size)
    feeds = [engine._feed([tokenized[i] for i in rows]) for rows in batches]
    session = engine._session
    for feed in feeds:  # warm, as the engine was
        session.run(["sentence_embedding"], feed)
    start = time.perf_counter()
    for feed in feeds:
        session.run(["sentence_embedding"], feed)
    graph = time.perf_counter() - start
    tokens = encoded.stats.tokens
    return {"tokens": tokens, "offline_tokens_per_s": tokens / offline, "graph_tokens_per_s": tokens / graph,
            "ratio": graph / offline, "batches": len(batches)}


def serving(artifacts: Path, args, requests: list[bytes], flags: tuple[str, ...]) -> dict:
    """One server with flags, the closed loop of CLIENTS clients over its gRPC door; its numbers."""
    server = start_server(artifacts, precision=args.precision, provider=args.provider, flags=flags)
    try:
        server.wait_serving(timeout=args.start_timeout)
        result = serving_round(server, requests, CLIENTS, args.channels)
    finally:
        status = stop_server(server)
    if status != 0:
        raise BenchError(f"the server ({' '.join(flags)}) did not drain and exit 0 on SIGTERM: {status}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_report.txt")
    parser.add_argument("--provider", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run of the steps")
    parser.add_argument("--texts", type=int, default=2000, help="mixed corpus size (default 2000)")
    parser.add_argument("--channels", type=int, default=32, help="the clients' gRPC connections (default 32)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds the whole run may take (default 450)")
    parser.add_argument("--start-timeout", type=float, default=180.0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-check"))
    parser.add_argument("--door-processes", default=",".join(map(str, DOOR_PROCESSES)),
                        help="the --workers counts to measure, comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--skip-8b", action="store_true", help="leave the 8B shape out")
    args = parser.parse_args()
    args.precision = "fp16" if args.provider == "cuda" else "fp32"
    deadline = time.monotonic() + args.budget
    args.report.parent.mkdir(parents=True, exist_ok=True)
    report = Report(args.report)
    report.line(f"bench/gpu_check.py, {time.strftime('%Y-%m-%d %H:%M:%S')}: {machine(args.provider)}")
    try:
        return measure(args, report, deadline)
    except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        report.line(f"stopped: {type(e).__name__}: {e}")
        return 1


def left(deadline: float) -> float:
    return deadline - time.monotonic()


def measure(args, report: Report, deadline: float) -> int:
    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.loadtest.corpus import mixed_length_corpus

    artifacts = args.work / "minilm"
    seconds = export(artifacts, args.precision, args.provider, max(60.0, left(deadline)))
    report.row(f"export all-MiniLM-L6-v2 {args.precision} on {args.provider}, verified", f"{seconds:.0f} s")
    engine = Engine.from_directory(artifacts, EngineConfig(precision=args.precision, provider=args.provider))
    texts = mixed_length_corpus(args.texts, 0)
    graph = offline_over_graph(engine, texts)
    report.numbers["offline_over_graph"] = graph
    report.row(f"offline ({graph['offline_tokens_per_s']:,.0f} tokens/s) ÷ the graph alone "
               f"({graph['graph_tokens_per_s']:,.0f})", f"{graph['ratio']:.2f}", ">= 0.6",
               graph["ratio"] >= TARGETS["offline_over_graph"])
    offline = offline_round(engine, texts, os.getpid())
    del engine
    requests = [embed_request(t).SerializeToString() for t in texts]
    auto = serving(artifacts, args, requests, ("--workers", "auto"))
    ratio = auto["tokens_per_s"] / offline["tokens_per_s"]
    report.numbers["serving_auto"], report.numbers["offline"] = auto, offline
    report.row(f"serving, --workers auto, {CLIENTS} clients ({auto['tokens_per_s']:,.0f} tokens/s) ÷ offline",
               f"{ratio:.2f}", ">= 0.7", ratio >= TARGETS["serving_over_offline"])
    report.row("  its requests/s, mean batch, padding; server, client cores",
               f"{auto['requests_per_s']:,.0f}, {auto['mean_batch_size'] or 0:.1f}, {auto['padding'] or 0:.1%}; "
               f"{auto['server_cores']:.1f}, {auto['client_cores']:.1f}")
    doors = [int(n) for n in args.door_processes.split(",") if n.strip()]
    for name, flags in [*((f"--workers {n}", ("--workers", str(n))) for n in doors),
                        *((f"--batches-in-flight {n}", ("--workers", "auto", "--batches-in-flight", str(n)))
                          for n in (1, 2))]:
        if left(deadline) < 60:
            report.line(f"not measured, out of time: {name}")
            continue
        result = serving(artifacts, args, requests, flags)
        report.numbers[name] = result
        # The clients' cores say whether this process, not the server, was the ceiling.
        report.row(f"{name}: requests/s (tokens/s); server, client cores",
                   f"{result['requests_per_s']:,.0f} ({result['tokens_per_s']:,.0f}); "
                   f"{result['server_cores']:.1f}, {result['client_cores']:.1f}")
    if args.skip_8b:
        report.line("the 8B shape: left out (--skip-8b)")
    elif left(deadline) < 120:
        report.line(f"the 8B shape: not run, {left(deadline):.0f} s left of the budget")
    else:
        eight_b(args, report, deadline)
    return 0


def eight_b(args, report: Report, deadline: float) -> None:
    """bench_cuda_export.py in the time left; its lines taken into this report, its last JSON line (the whole
    report so far) into the numbers."""
    command = [sys.executable, str(REPO / "bench/bench_cuda_export.py"), "--size", "8b", "--provider", args.provider,
               "--work", str(args.work / "8b")]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(60.0, left(deadline)))
    except subprocess.TimeoutExpired:
        report.line(f"the 8B shape: not done in the {args.budget:.0f} s budget")
        return
    lines = done.stdout.splitlines()
    found = [line for line in lines if line.startswith("{")]
    if found:
        report.numbers["8b"] = json.loads(found[-1])
    for text in lines:
        report.line(f"  8B: {text[:300]}")
    if done.returncode != 0:
        report.line(f"the 8B shape failed: {done.stderr.strip()[-1500:]}")


if __name__ == "__main__":
    sys.exit(main())
