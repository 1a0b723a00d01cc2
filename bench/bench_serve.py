"""Serving benchmark: `attnserve serve` under 64 concurrent clients against the offline engine.

Everything is measured side by side in one run, on the same mixed-length
corpus (bench/corpus.py) and the same artifacts, and read as ratios, since
absolute tokens/s depend on the machine:

  offline   Engine.encode(texts, truncate=True) in this process (fp32, CPU
            provider, default batch limits): the same length-sorted batching
            the server does, with no RPCs. Tokenizing is timed too, because
            the server tokenizes as well.
  serving   one real `attnserve serve` subprocess (fp32, CPU provider,
            defaults otherwise), started once for the whole run on free
            loopback ports. --concurrency clients (grpc.aio coroutines in this
            process) each send their share of the corpus, one text per Embed
            request with truncate=True, one request at a time. tokens/s counts
            the num_tokens the server replies with, over the wall time from
            the first request to the last reply. Padding and mean batch size
            come from the server's Prometheus counters, as deltas over the load.
  latency   one short text, sent sequentially from one (synchronous) client to
            the otherwise idle server after a few warm-up calls; every
            round adds LATENCY_SAMPLES samples.

Each round runs offline, then serving, then latency; while one runs the other
side is idle (the server stays up but gets no requests during offline). The
best round of each throughput run is reported, as in bench_encode.py, since
the machine is noisy; the median over rounds is printed too.

To show where serving time goes, the CPU seconds of the server process
(/proc/<pid>/stat) and of this process (the clients) are taken over the load,
and the server's own inference-time histogram gives how busy its single
inference thread was.

The script exits 0 whether or not targets are met (it measures, it does not
test); an error (the server does not come up, a request fails, the server
does not exit 0 on SIGTERM) exits non-zero.

    python bench/bench_serve.py --artifacts /tmp/art              # 2000 texts, 3 rounds
    python bench/bench_serve.py --texts 400 --rounds 1            # quick check
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

try:
    from corpus import mixed_length_corpus  # run as a script: bench/ is on sys.path
except ImportError:
    from bench.corpus import mixed_length_corpus  # run as `python -m bench.bench_serve`

SHORT_TEXT = "The quick brown fox jumps over the lazy dog."
LATENCY_WARMUP = 10
LATENCY_SAMPLES = 300
REQUEST_TIMEOUT_S = 120.0  # per request; under full load a request waits for ~64 others at most
STOP_TIMEOUT_S = 60.0  # the server drains for up to its grace period (20 s) after SIGTERM
STDERR_TAIL_LINES = 40

TARGETS = {  # name: (comparison, bound, bound as shown)
    "serving_vs_offline": (">=", 0.85, "0.85"),
    "latency_p50_ms": ("<=", 10.0, "10 ms"),
    "padding_serving": ("<=", 0.10, "10%"),
}


class BenchError(Exception):
    pass


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def tuning_env_names() -> list[str]:
    """Every ATTNSERVE_* variable a setting reads: dropped so both sides run on the shipped defaults."""
    from attnserve.config import EngineConfig, ServerConfig

    return [f.metadata["env"] for cls in (EngineConfig, ServerConfig) for f in dataclasses.fields(cls)]


def cpu_seconds(pid: int | None = None) -> float:
    """user + system CPU seconds of a process, all its threads; None: this process."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"; comm may hold spaces
    # fields[0] is the state (field 3 of proc(5)): utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the server subprocess ----------------------------------------------------------------------


class ServerProcess:
    """One `attnserve serve` on 127.0.0.1; port 0 lets the server bind free ports itself (no race
    between finding a port and binding it), and its "serving" log line says which it got."""

    def __init__(self, artifacts: Path):
        self.cmd = [sys.executable, "-m", "attnserve.cli", "serve", "--artifacts", str(artifacts),
                    "--provider", "cpu", "--precision", "fp32", "--host", "127.0.0.1", "--port", "0",
                    "--metrics-port", "0", "--log-format", "json", "--log-level", "INFO"]
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.serving_event: dict | None = None
        self._serving = threading.Event()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in tuning_env_names()}
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        # stderr must be drained all along, or a chatty server would block on a full pipe.
        threading.Thread(target=self._read_stderr, name="server-stderr", daemon=True).start()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.tail.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue  # e.g. "attnserve serve: error: ..." is plain text
            if isinstance(event, dict) and event.get("event") == "serving":
                self.serving_event = event
                self._serving.set()

    def stderr_tail(self) -> str:
        return "\n".join(f"  | {line}" for line in self.tail) or "  | (nothing)"

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._serving.wait(0.2):
            if self.proc.poll() is not None:
                raise BenchError(f"the server exited with {self.proc.returncode} before serving; its stderr:\n"
                                 f"{self.stderr_tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"the server did not log \"serving\" within {timeout:.0f} s; its stderr:\n"
                                 f"{self.stderr_tail()}")
        self._check_health(max(1.0, deadline - time.monotonic()))

    def _check_health(self, timeout: float) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=True)
            except grpc.RpcError as e:
                raise BenchError(f"health check failed: {e.code().name}: {e.details()}") from None
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            raise BenchError(f"the server logged \"serving\" but its health status is "
                             f"{health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")

    @property
    def target(self) -> str:
        return self.serving_event["address"]

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.serving_event['metrics_port']}/metrics"

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> int | None:
        """SIGTERM, then wait for the drain; the exit status, or None if it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


# --- server metrics -----------------------------------------------------------------------------


@dataclasses.dataclass
class ServerCounters:
    """The cumulative server metrics the benchmark reads; differences of two give an interval."""

    tokens: float = 0.0  # real tokens computed
    cells: float = 0.0  # token cells computed, padding included
    batches: float = 0.0
    batch_inputs: float = 0.0  # sum of batch sizes
    inference_s: float = 0.0  # time batches spent in onnxruntime
    queued_inputs: float = 0.0
    queue_s: float = 0.0  # time inputs waited in the queue before their batch started

    def __sub__(self, other: "ServerCounters") -> "ServerCounters":
        return ServerCounters(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def scrape(url: str) -> ServerCounters:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode("utf-8")
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    # A labelled histogram has no samples before its first observation: absent reads as 0.
    emb = (("graph", "embeddings"),)
    get = lambda name, labels=(): values.get((name, labels), 0.0)
    return ServerCounters(
        tokens=get("attnserve_batch_tokens_computed_total"), cells=get("attnserve_batch_cells_computed_total"),
        batches=get("attnserve_batch_size_count", emb), batch_inputs=get("attnserve_batch_size_sum", emb),
        inference_s=get("attnserve_inference_duration_seconds_sum", emb),
        queued_inputs=get("attnserve_queue_duration_seconds_count"),
        queue_s=get("attnserve_queue_duration_seconds_sum"))


# --- measurements -------------------------------------------------------------------------------


def offline_round(engine, texts: list[str]) -> dict:
    """The whole Engine.encode call is timed: stats.seconds would leave out tokenizing, which serving pays."""
    cpu0, start = cpu_seconds(), time.perf_counter()
    encoded = engine.encode(texts, truncate=True)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    stats = encoded.stats
    return {"tokens": stats.tokens, "seconds": seconds, "tokens_per_s": stats.tokens / seconds,
            "padding": stats.padding_fraction, "cores_used": cpu / seconds}


def embed_request(text: str):
    from attnserve.v1 import encoder_pb2 as pb

    return pb.EmbedRequest(inputs=[pb.Input(text=text)], truncate=True)


@dataclasses.dataclass
class LoadTally:
    """What the client coroutines record; they share one event loop, so no lock is needed."""

    tokens: int = 0
    replies: int = 0
    errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first_error: dict = dataclasses.field(default_factory=dict)
    finished: list = dataclasses.field(default_factory=list)  # perf_counter() when each client ran out of work


async def client_loop(stub, requests: list, tally: LoadTally) -> None:
    """One client: its share of the corpus, one request at a time, as a synchronous caller would send it."""
    import grpc

    for request in requests:
        try:
            reply = await stub.Embed(request, timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            tally.errors[e.code().name] += 1
            tally.first_error.setdefault(e.code().name, e.details())
            continue
        tally.replies += 1
        tally.tokens += sum(e.num_tokens for e in reply.embeddings)
    tally.finished.append(time.perf_counter())


async def load_async(server: ServerProcess, requests: list, concurrency: int, channels: int) -> dict:
    import grpc

    from attnserve.v1 import encoder_pb2_grpc

    # A local subchannel pool gives each channel its own TCP connection; without it, channels with
    # equal arguments share one connection and --channels would change nothing.
    options = [("grpc.use_local_subchannel_pool", 1)]
    pool = [grpc.aio.insecure_channel(server.target, options=options) for _ in range(channels)]
    try:
        stubs = [encoder_pb2_grpc.EncoderStub(channel) for channel in pool]
        # Connect every channel and make one call on each: connection setup is not what is measured.
        await asyncio.gather(*(stub.Embed(embed_request(SHORT_TEXT), timeout=REQUEST_TIMEOUT_S) for stub in stubs))
        # Client i takes texts i, i+concurrency, ...: every client gets the same mix of lengths.
        shares = [requests[i::concurrency] for i in range(concurrency)]
        tally = LoadTally()
        before, server_cpu0, client_cpu0 = scrape(server.metrics_url), server.cpu_seconds(), cpu_seconds()
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(stubs[i % channels], share, tally) for i, share in enumerate(shares)))
        seconds = time.perf_counter() - start
        server_cpu, client_cpu = server.cpu_seconds() - server_cpu0, cpu_seconds() - client_cpu0
        delta = scrape(server.metrics_url) - before
    finally:
        await asyncio.gather(*(channel.close() for channel in pool))
    if tally.errors:
        shown = "; ".join(f"{n} x {code} (first: {tally.first_error[code]})" for code, n in tally.errors.items())
        raise BenchError(f"{sum(tally.errors.values())} of {len(requests)} requests failed: {shown}")
    return {
        "tokens": tally.tokens, "requests": tally.replies, "seconds": seconds,
        "tokens_per_s": tally.tokens / seconds, "requests_per_s": tally.replies / seconds,
        "server_tokens": delta.tokens,
        "padding": (delta.cells - delta.tokens) / delta.cells if delta.cells else None,
        "mean_batch_size": delta.batch_inputs / delta.batches if delta.batches else None,
        "batches": delta.batches,
        # One inference thread runs every batch: its busy share of the wall time bounds throughput.
        "inference_busy": delta.inference_s / seconds,
        "mean_queue_ms": 1e3 * delta.queue_s / delta.queued_inputs if delta.queued_inputs else None,
        "server_cores": server_cpu / seconds, "client_cores": client_cpu / seconds,
        # The tail: once the first client runs out of work, fewer than `concurrency` requests are in flight.
        "first_client_done_s": min(tally.finished) - start, "last_client_done_s": max(tally.finished) - start,
    }


def serving_round(server: ServerProcess, requests: list, concurrency: int, channels: int) -> dict:
    return asyncio.run(load_async(server, requests, concurrency, channels))


def latency_round(server: ServerProcess, samples: int) -> list[float]:
    """Milliseconds per sequential request of one short text, from a blocking client (the simplest caller)."""
    import grpc

    from attnserve.v1 import encoder_pb2_grpc

    request = embed_request(SHORT_TEXT)
    with grpc.insecure_channel(server.target) as channel:
        stub = encoder_pb2_grpc.EncoderStub(channel)
        times = []
        for i in range(LATENCY_WARMUP + samples):
            start = time.perf_counter()
            try:
                stub.Embed(request, timeout=REQUEST_TIMEOUT_S)
            except grpc.RpcError as e:
                raise BenchError(f"latency request failed: {e.code().name}: {e.details()}") from None
            if i >= LATENCY_WARMUP:
                times.append((time.perf_counter() - start) * 1e3)
    return times


def percentiles(ms: list[float]) -> dict:
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": len(ms)}


# --- report -------------------------------------------------------------------------------------


def versions() -> dict:
    import onnxruntime

    from attnserve import __version__

    out = {"python": platform.python_version(), "attnserve": __version__, "onnxruntime": onnxruntime.__version__}
    for dist in ("grpcio", "protobuf", "prometheus_client", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def table(rows: list[tuple[str, str, str, str]]) -> str:
    header = ("run", "tokens/s", "padding", "vs offline")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    fmt = lambda r: " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths), *map(fmt, rows)])


def target_line(label: str, key: str, value: float | None, shown: str) -> tuple[str, dict]:
    op, bound, shown_bound = TARGETS[key]
    passed = None if value is None else value >= bound if op == ">=" else value <= bound
    verdict = "skipped" if passed is None else "PASS" if passed else "MISS"
    line = f"{label:<30} {shown if value is not None else '-':>8}   target {op} {shown_bound:<6} {verdict}"
    return line, {"value": value, "target": f"{op} {bound}", "pass": passed}


def report(args, manifest, artifacts: Path, corpus: dict, rounds: list[dict], latency_ms: list[list[float]]
           ) -> tuple[str, dict]:
    best_offline = max((r["offline"] for r in rounds), key=lambda x: x["tokens_per_s"])
    best_serving = max((r["serving"] for r in rounds), key=lambda x: x["tokens_per_s"])
    ratio = best_serving["tokens_per_s"] / best_offline["tokens_per_s"]
    median = {name: statistics.median(r[name]["tokens_per_s"] for r in rounds) for name in ("offline", "serving")}
    # Latency: the round with the lowest p50 (the least disturbed by neighbours), and all samples pooled.
    per_round = [percentiles(ms) for ms in latency_ms]
    best_latency = min(per_round, key=lambda x: x["p50"])
    pooled = percentiles([t for ms in latency_ms for t in ms])

    out = [f"attnserve serving benchmark: {manifest.model}, {args.texts} texts (seed {args.seed}), "
           f"{args.concurrency} clients over {args.channels} channel(s), {args.rounds} round(s), best round per run",
           "versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()),
           f"cpu: {os.cpu_count()} logical cores; onnxruntime default threads; provider CPU, fp32, "
           f"default batch limits on both sides",
           f"artifacts: {artifacts}",
           f"corpus: {args.texts} texts, {corpus['tokens']} tokens (mean {corpus['mean']:.1f}, max {corpus['max']}), "
           f"{corpus['truncated']} truncated at max_seq_length {manifest.max_seq_length}",
           ""]

    def row(label: str, result: dict) -> tuple[str, str, str, str]:
        padding = "-" if result["padding"] is None else f"{result['padding']:.1%}"
        return (label, f"{result['tokens_per_s']:.0f}", padding,
                f"{result['tokens_per_s'] / best_offline['tokens_per_s']:.2f}x")

    out.append(table([row("offline Engine.encode", best_offline),
                      row(f"serving, {args.concurrency} clients, 1 text/request", best_serving)]))
    out.append(f"median of {args.rounds} round(s): offline {median['offline']:.0f}, serving {median['serving']:.0f} "
               f"tokens/s ({median['serving'] / median['offline']:.2f}x)")
    s = best_serving
    out.append(f"serving (best round): {s['requests']} requests in {s['seconds']:.2f} s "
               f"({s['requests_per_s']:.0f}/s); mean batch size {s['mean_batch_size']:.1f} over "
               f"{s['batches']:.0f} batches; inference thread busy {s['inference_busy']:.0%} of wall; "
               f"mean queue wait {s['mean_queue_ms']:.1f} ms")
    out.append(f"cpu cores used: offline {best_offline['cores_used']:.2f}; serving: server "
               f"{s['server_cores']:.2f} + clients {s['client_cores']:.2f}; clients done between "
               f"{s['first_client_done_s']:.2f} and {s['last_client_done_s']:.2f} s")
    out.append(f"latency, one {corpus['short_tokens']}-token request at a time on an idle server: "
               f"p50 {best_latency['p50']:.2f} ms, p99 {best_latency['p99']:.2f} ms (best of {args.rounds} round(s) "
               f"of {LATENCY_SAMPLES}); all {pooled['n']} samples: p50 {pooled['p50']:.2f} ms, "
               f"p99 {pooled['p99']:.2f} ms")
    out.append("")
    targets = {}
    for label, key, value, shown in [
        ("serving / offline tokens/s", "serving_vs_offline", ratio, f"{ratio:.2f}"),
        ("latency p50 (short, idle)", "latency_p50_ms", best_latency["p50"], f"{best_latency['p50']:.2f} ms"),
        ("padding under load", "padding_serving", s["padding"],
         "-" if s["padding"] is None else f"{s['padding']:.1%}"),
    ]:
        line, targets[key] = target_line(label, key, value, shown)
        out.append(line)
    numbers = {"best": {"offline": best_offline, "serving": best_serving}, "median_tokens_per_s": median,
               "serving_vs_offline": ratio, "latency_ms": {"best_round": best_latency, "pooled": pooled,
                                                           "per_round": per_round}, "targets": targets}
    return "\n".join(out), numbers


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000, help="corpus size (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every measurement; best is kept (default 3)")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent clients (default 64)")
    parser.add_argument("--channels", type=int, default=1,
                        help="gRPC channels (connections) the clients share, round-robin (default 1)")
    parser.add_argument("--artifacts", help="artifact directory (default: the default model's, built on first use)")
    parser.add_argument("--start-timeout", type=float, default=300.0,
                        help="seconds to wait for the server to serve (default 300)")
    parser.add_argument("--json", help="also write every number to this JSON file")
    args = parser.parse_args(argv)
    if min(args.texts, args.rounds, args.concurrency, args.channels) < 1:
        parser.error("--texts, --rounds, --concurrency and --channels must be positive")
    args.channels = min(args.channels, args.concurrency)
    # A SIGTERM to the benchmark must still stop the server: SystemExit runs the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run(args)
    except BenchError as e:
        print(f"bench_serve: error: {e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    from attnserve.config import EngineConfig
    from attnserve.default_model import resolve_artifacts
    from attnserve.engine.engine import Engine
    from attnserve.errors import AttnserveError

    ignored = [k for k in tuning_env_names() if os.environ.get(k)]
    if ignored:
        log(f"ignoring {', '.join(ignored)}: both sides run on the default settings")
    try:
        artifacts = resolve_artifacts(args.artifacts)
    except AttnserveError as e:
        raise BenchError(str(e)) from None

    server = ServerProcess(artifacts)
    log(f"starting `{' '.join(server.cmd[1:])}`")
    server.start()
    output = numbers = None
    try:
        # Set up the offline side while the server loads its graphs; nothing here is timed.
        try:
            engine = Engine.from_directory(artifacts, EngineConfig(precision="fp32", provider="cpu"))
        except AttnserveError as e:
            raise BenchError(str(e)) from None
        texts = mixed_length_corpus(args.texts, args.seed)
        tokenized = engine.tokenizer.encode_texts(texts, truncate=True)
        lengths = np.array([len(x) for x in tokenized])
        corpus = {"tokens": int(lengths.sum()), "mean": float(lengths.mean()), "max": int(lengths.max()),
                  "truncated": sum(x.truncated for x in tokenized),
                  "short_tokens": len(engine.tokenizer.encode_texts([SHORT_TEXT])[0])}
        requests = [embed_request(t) for t in texts]  # built once: the clients should cost little CPU
        engine.encode(texts[:8])  # warm-up; the server warms itself up before it says "serving"

        server.wait_serving(args.start_timeout)
        log(f"server serving on {server.target}, metrics {server.metrics_url}")
        rounds, latency_ms = [], []
        for r in range(args.rounds):
            tag = f"round {r + 1}/{args.rounds}"
            offline = offline_round(engine, texts)
            log(f"{tag}: offline {offline['tokens_per_s']:.0f} tokens/s")
            serving = serving_round(server, requests, args.concurrency, args.channels)
            log(f"{tag}: serving {serving['tokens_per_s']:.0f} tokens/s, mean batch {serving['mean_batch_size']:.1f}, "
                f"server {serving['server_cores']:.2f} cores, clients {serving['client_cores']:.2f} cores")
            check_tokens(corpus["tokens"], offline, serving)
            latency_ms.append(latency_round(server, LATENCY_SAMPLES))
            log(f"{tag}: latency p50 {np.percentile(latency_ms[-1], 50):.2f} ms")
            rounds.append({"offline": offline, "serving": serving})
        output, numbers = report(args, engine.manifest, artifacts, corpus, rounds, latency_ms)
        numbers.update({"rounds": rounds, "corpus": corpus, "versions": versions(), "cpu_count": os.cpu_count(),
                        "config": {k: v for k, v in vars(args).items() if k != "json"} | {
                            "artifacts": str(artifacts), "model": engine.manifest.model}})
    finally:
        status = server.stop()
        if status != 0:  # reported even when an error is on its way out
            why = "did not exit within" if status is None else f"exited with {status} within"
            print(f"bench_serve: error: the server {why} {STOP_TIMEOUT_S:.0f} s of SIGTERM; its stderr:\n"
                  f"{server.stderr_tail()}", file=sys.stderr)
    print(output, flush=True)
    if args.json:
        numbers["server_exit_status"] = status
        Path(args.json).write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {args.json}")
    return 0 if status == 0 else 1


def check_tokens(expected: int, offline: dict, serving: dict) -> None:
    """Both sides must have computed the same tokens, or their tokens/s are not comparable."""
    counts = {"this process's tokenizer": expected, "offline Engine.encode": offline["tokens"],
              "the server's replies (num_tokens)": serving["tokens"],
              "the server's metrics": int(serving["server_tokens"])}
    if len(set(counts.values())) != 1:
        raise BenchError("token counts disagree: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    sys.exit(main())
