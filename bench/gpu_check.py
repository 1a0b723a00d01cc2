"""Every GPU measurement this project has asked for, in one run and one report (issue 48, item 5). Run by
bench/gpu_check.sh, which installs onnxruntime-gpu first; it can run alone where attnserve[gpu] is installed.

    python bench/gpu_check.py --report gpu_report.txt            # on a machine with an NVIDIA GPU
    python bench/gpu_check.py --provider cpu --texts 200 --budget 300 --skip-8b    # a dry run of the steps, no GPU

Rows, in this order (each measured once, side by side in this run; what the deadline leaves no time for is named
in the report, not skipped silently):
  offline ÷ graph    all-MiniLM-L6-v2's fp16 graph (exported and verified on CUDA here; --minilm-files: its own
                     files with random weights): Engine.encode of the mixed corpus (tokenizing, batching, the reply
                     arrays) ÷ the same batches, already tokenized and padded, through the session alone, at the
                     engine's batch budget (target >= 0.6) and at each --offline-budgets; the tokenizer's seconds.
  serving ÷ offline  `serve --workers auto`, 256 gRPC clients, one text a request, the corpus sent --passes times over
                     --channels connections (the door processes share the port: one connection would reach one of
                     them); target >= 0.7. Each serving row also gives where a batch's time went: the event loop's
                     milliseconds a batch against the batch thread's own (tensors, onnxruntime's run, rows; the
                     Triton statistics), and the queue's wait. --profile: py-spy records this row's processes.
  --also FLAGS       the same load with `--workers auto FLAGS` (repeatable), first among the rows below.
  door processes     requests/s of the same load with --workers 1, 2, 4, 8 and 16 (--door-processes).
  batches in flight  --batches-in-flight 1 against 2 (workers auto).
  switch interval    --gil-switch-interval-ms 5 (Python's own) and 0.1 (--switch-intervals), against the default.
  8B                 bench/bench_cuda_export.py: the Qwen3-Embedding-8B shape exported straight into fp16, its peak
                     RSS, and the first answer's cosine to sentence-transformers, in the time left.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_serve import BenchError, embed_request, offline_round, serving_round, start_server, stop_server  # noqa: E402

TARGETS = {"offline_over_graph": 0.6, "serving_over_offline": 0.7}
DOOR_PROCESSES = (1, 2, 4, 8, 16)
# The offline leads still open (docs/performance.md, "CUDA"): the next chunk tokenized while one runs, with and
# without encode's intra-op threads (which spin on every core between runs, beside the tokenizer's).
OFFLINE_VARIANTS = ("overlaps_tokenizing=1", "threads=1 overlaps_tokenizing=1", "threads=1")
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


def minilm_checkpoint(files: Path, out: Path, seed: int = 0) -> Path:
    """all-MiniLM-L6-v2's own config, tokenizer and pipeline files (`files`: the package's folder without its
    weights) with transformers' seeded initialisation for weights. The lent machine has no network, and the real
    weights (91 MB) would be two more carried parts; a graph's speed does not depend on its weights' values."""
    import torch
    import transformers

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(files, out)
    torch.manual_seed(seed)
    transformers.BertModel(transformers.BertConfig.from_pretrained(out)).save_pretrained(out, safe_serialization=True)
    return out


def export(out: Path, precision: str, provider: str, timeout: float, checkpoint: Path | None) -> float:
    """The model's graph for the run (the embedded default where no checkpoint is given), exported and verified on
    the provider; its seconds."""
    start = time.monotonic()
    command = [sys.executable, "-m", "attnserve.cli", "export", "--out", str(out), "--precision", precision,
               "--provider", provider]
    if checkpoint is not None:
        command += ["--checkpoint", str(checkpoint)]
    subprocess.run(command, check=True, timeout=timeout)
    return time.monotonic() - start


def offline_over_graph(engine, texts: list[str]) -> dict:
    """Engine.encode over the corpus, warm, against the graph alone on the same batches (fed before the clock), and
    the tokenizer's share."""
    engine.encode(texts, truncate=True)  # warm: every batch shape once
    start = time.perf_counter()
    encoded = engine.encode(texts, truncate=True)
    offline = time.perf_counter() - start
    start = time.perf_counter()
    tokenized = engine.tokenizer.encode_texts(texts, truncate=True)
    tokenizing = time.perf_counter() - start
    batches = engine.plan([len(x) for x in tokenized])
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
            "ratio": graph / offline, "offline_s": offline, "tokenizing_s": tokenizing, "graph_s": graph,
            "batches": len(batches)}


def model_stats(server) -> dict:
    """The served model's Triton statistics (server/statistics.py)."""
    import httpx

    return httpx.get(f"{server.http_url}/v2/models/stats", timeout=30).json()["model_stats"][0]


def batch_split(before: dict, after: dict) -> dict:
    """Per batch between two statistics: the milliseconds the batch's thread spent building its tensors, in
    onnxruntime (the GIL taken back included) and cutting rows."""
    def total(stats: dict, part: str) -> tuple[int, int]:
        rows = stats.get("batch_stats", [])
        return sum(r[part]["count"] for r in rows), sum(r[part]["ns"] for r in rows)

    split = {}
    for part in ("compute_input", "compute_infer", "compute_output"):
        (n1, ns1), (n0, ns0) = total(after, part), total(before, part)
        split[part + "_ms"] = (ns1 - ns0) / 1e6 / max(1, n1 - n0)
    return split


def serving(artifacts: Path, args, requests: list[bytes], flags: tuple[str, ...], profile: Path | None = None
            ) -> dict:
    """One server with flags, the closed loop of CLIENTS clients over its gRPC door; its numbers, with where a
    batch's time went. profile: py-spy records every process of the server during the load into this file."""
    server = start_server(artifacts, precision=args.precision, provider=args.provider, flags=flags)
    try:
        server.wait_serving(timeout=args.start_timeout)
        serving_round(server, requests[:CLIENTS * 4], CLIENTS, args.channels)  # warm: shapes, connections
        before = model_stats(server)
        spy = start_profile(server.process.pid, profile) if profile is not None else None
        if profile is not None and spy is None:
            print("no py-spy on the PATH: the load runs unprofiled", flush=True)
        try:
            result = serving_round(server, requests, CLIENTS, args.channels)
        finally:
            if spy is not None:
                stop_profile(spy)
        result.update(batch_split(before, model_stats(server)))
    finally:
        status = stop_server(server)
    if status != 0:
        raise BenchError(f"the server ({' '.join(flags)}) did not drain and exit 0 on SIGTERM: {status}")
    result["loop_batch_ms"] = 1e3 * result["inference_s"] / max(1.0, result["batches"])
    return result


def start_profile(pid: int, out: Path) -> subprocess.Popen | None:
    """py-spy (carried by gpu_check.sh) sampling the server and its door processes, native frames included."""
    spy = shutil.which("py-spy")
    if spy is None:
        return None
    log = open(out.with_suffix(".log"), "wb")  # py-spy's own account (attached, samples, errors)
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--subprocesses", "--rate", "250",
                             "--format", "raw", "--output", str(out)], stdout=log, stderr=log)


def stop_profile(spy: subprocess.Popen) -> None:
    spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled on Ctrl-C
    try:
        spy.wait(120)
    except subprocess.TimeoutExpired:
        spy.kill()


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
    parser.add_argument("--switch-intervals", default="5,0.1",
                        help="--gil-switch-interval-ms values to serve with beside the default (default 5,0.1: "
                             "Python's own, and less)")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy records the --workers auto row's processes (serve_profile.txt by the report)")
    parser.add_argument("--also", action="append", default=[], metavar="FLAGS",
                        help="serve flags to measure a row with beside --workers auto (repeatable)")
    parser.add_argument("--offline-budgets", default="2048",
                        help="batch token budgets the offline rows are also measured at (default 2048, the CPU's)")
    parser.add_argument("--offline-variants", action="append", metavar="K=V ...",
                        help="engine settings to measure an offline row with (repeatable), EngineConfig fields and "
                             "overlaps_tokenizing (default: " + "; ".join(OFFLINE_VARIANTS) + ")")
    parser.add_argument("--no-serving", action="store_true", help="the offline rows alone")
    parser.add_argument("--passes", type=int, default=3, help="times the corpus is sent in a serving load (default 3)")
    parser.add_argument("--skip-8b", action="store_true", help="leave the 8B shape out")
    parser.add_argument("--minilm-files", type=Path,
                        help="all-MiniLM-L6-v2's files without its weights (gpu_check.sh carries them): the model "
                             "is made from them with random weights; by default the embedded model, real weights")
    args = parser.parse_args()
    args.precision = "fp16" if args.provider == "cuda" else "fp32"
    if args.offline_variants is None:
        args.offline_variants = list(OFFLINE_VARIANTS)
    args.door_processes = [int(n) for n in args.door_processes.split(",") if n.strip()]
    args.switch_intervals = [float(n) for n in args.switch_intervals.split(",") if n.strip()]
    args.offline_budgets = [int(n) for n in args.offline_budgets.split(",") if n.strip()]
    deadline = time.monotonic() + args.budget
    args.report.parent.mkdir(parents=True, exist_ok=True)
    report = Report(args.report)
    report.line(f"bench/gpu_check.py, {time.strftime('%Y-%m-%d %H:%M:%S')}: {machine(args.provider)}")
    try:
        return measure(args, report, deadline)
    except (BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        report.line(f"stopped: {type(e).__name__}: {e}")
        return 1


def serving_lines(report: Report, r: dict) -> None:
    """Where a served request's time went: the batches' sizes and times, as the event loop and the batch's thread
    saw them, and whose CPU it was (the clients' cores say whether the load, not the server, was the ceiling)."""
    report.row("  mean batch, padding; server, client cores",
               f"{r['mean_batch_size'] or 0:.1f}, {r['padding'] or 0:.1%}; {r['server_cores']:.1f}, "
               f"{r['client_cores']:.1f}")
    report.row("  ms a batch: loop; thread's input, run, rows; queue ms",
               f"{r['loop_batch_ms']:.2f}; {r.get('compute_input_ms', 0):.2f}, {r.get('compute_infer_ms', 0):.2f}, "
               f"{r.get('compute_output_ms', 0):.2f}; {r['mean_queue_ms'] or 0:.0f}")


def left(deadline: float) -> float:
    return deadline - time.monotonic()


def measure(args, report: Report, deadline: float) -> int:
    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine
    from attnserve.loadtest.corpus import mixed_length_corpus

    artifacts = args.work / "minilm"
    checkpoint = None
    if args.minilm_files is not None:
        checkpoint = minilm_checkpoint(args.minilm_files, args.work / "minilm-checkpoint")
        report.line("all-MiniLM-L6-v2: its config, tokenizer and pipeline, random weights (seed 0)")
    seconds = export(artifacts, args.precision, args.provider, max(60.0, left(deadline)), checkpoint)
    report.row(f"export all-MiniLM-L6-v2 {args.precision} on {args.provider}, verified", f"{seconds:.0f} s")
    engine = Engine.from_directory(artifacts, EngineConfig(precision=args.precision, provider=args.provider))
    texts = mixed_length_corpus(args.texts, 0)
    budget = engine.batch_tokens
    for tokens in sorted({budget, *args.offline_budgets}, key=lambda t: t != budget):  # the engine's own first
        engine.batch_tokens = tokens
        graph = offline_over_graph(engine, texts)
        report.numbers[f"offline_over_graph at {tokens}"] = graph
        report.row(f"offline ({graph['offline_tokens_per_s']:,.0f} tokens/s) ÷ the graph alone "
                   f"({graph['graph_tokens_per_s']:,.0f}), batches of {tokens} tokens", f"{graph['ratio']:.2f}",
                   ">= 0.6" if tokens == budget else "", graph["ratio"] >= TARGETS["offline_over_graph"]
                   if tokens == budget else None)
        report.row("  seconds: offline; tokenizing; the graph alone",
                   f"{graph['offline_s']:.3f}; {graph['tokenizing_s']:.3f}; {graph['graph_s']:.3f}")
    engine.batch_tokens = budget
    offline = offline_round(engine, texts, os.getpid())
    del engine
    for variant in args.offline_variants:
        graph = offline_over_graph(variant_engine(artifacts, args, variant), texts)
        report.numbers[f"offline_over_graph {variant}"] = graph
        report.row(f"offline ÷ the graph alone, {variant}", f"{graph['ratio']:.2f}")
        report.row("  seconds: offline; tokenizing; the graph alone",
                   f"{graph['offline_s']:.3f}; {graph['tokenizing_s']:.3f}; {graph['graph_s']:.3f}")
    if args.no_serving:
        return 0
    requests = [embed_request(t).SerializeToString() for t in texts] * args.passes
    report.numbers["offline"] = offline
    auto = serving(artifacts, args, requests, ("--workers", "auto"),
                   profile=args.report.parent / "serve_profile.txt" if args.profile else None)
    ratio = auto["tokens_per_s"] / offline["tokens_per_s"]
    report.numbers["serving_auto"] = auto
    report.row(f"serving, --workers auto, {CLIENTS} clients ({auto['tokens_per_s']:,.0f} tokens/s, "
               f"{auto['requests_per_s']:,.0f} requests/s) ÷ offline",
               f"{ratio:.2f}", ">= 0.7", ratio >= TARGETS["serving_over_offline"])
    serving_lines(report, auto)
    rows = [*((flags, ("--workers", "auto", *flags.split())) for flags in args.also),
            *((f"--workers {n}", ("--workers", str(n))) for n in args.door_processes),
            *((f"--batches-in-flight {n}", ("--workers", "auto", "--batches-in-flight", str(n))) for n in (1, 2)),
            *((f"--gil-switch-interval-ms {ms:g}", ("--workers", "auto", "--gil-switch-interval-ms", str(ms)))
              for ms in args.switch_intervals)]
    for name, flags in rows:
        if left(deadline) < 45:
            report.line(f"not measured, out of time: {name}")
            continue
        result = serving(artifacts, args, requests, flags)
        report.numbers[name] = result
        report.row(f"{name}: requests/s (tokens/s)", f"{result['requests_per_s']:,.0f} ({result['tokens_per_s']:,.0f})")
        serving_lines(report, result)
    if args.skip_8b:
        report.line("the 8B shape: left out (--skip-8b)")
    elif left(deadline) < 120:
        report.line(f"the 8B shape: not run, {left(deadline):.0f} s left of the budget")
    else:
        eight_b(args, report, deadline)
    return 0


def variant_engine(artifacts: Path, args, variant: str):
    """An engine with the settings "k=v ..." (EngineConfig's fields; overlaps_tokenizing 0 or 1)."""
    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine

    settings = dict(item.split("=", 1) for item in variant.split())
    overlap = settings.pop("overlaps_tokenizing", None)
    fields = EngineConfig.__dataclass_fields__
    typed = {k: type(fields[k].default)(v) for k, v in settings.items()}
    engine = Engine.from_directory(artifacts, EngineConfig(precision=args.precision, provider=args.provider, **typed))
    if overlap is not None:
        engine.overlaps_tokenizing = overlap == "1"
    return engine


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
