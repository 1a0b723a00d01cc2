"""The front door alone (issue 35): what a one-text request costs the server, against what its stack costs.

A tiny model (one layer, hidden 32, all-MiniLM-L6-v2's tokenizer, random weights) makes the graph's share of a
request negligible, so what is measured is the door: parsing, validation, tokenizing, the batcher, the reply and
its serialization, metrics. Side by side in one run, each under the same closed-loop load:

  core  the protocol-neutral core alone, in-process (no network, no door): one-text requests from 64 tasks;
  http  wrk -t1 -c64 POSTing OpenAI's /v1/embeddings with one short text (base64, as the openai SDK asks),
        against `attnserve serve` (each --workers count given) and a bare aiohttp app that parses the body with
        orjson, hops once through the event loop and answers a fixed 32-float vector;
  grpc  a grpc.aio client process keeping 64 Embed calls of one short text in flight over 4 channels, against
        the same servers and a bare grpc.aio servicer that parses the EmbedRequest and answers a fixed
        EmbedResponse.

The server's CPU per request is its process tree's user + system seconds (/proc, the workers and engine
process included) over the requests answered; the ratio to the bare stack's is the door's overhead, which the
issue wants at most 3x on each door. `--workers 2 ÷ 1` requests/s is reported with the cores each run used. The
client shares the machine's cores, so requests/s depends on the client as well; CPU per request does not.

With --granian (granian installed), the same bare handler on Granian's embedded RSGI server is a row too: whether
a Rust HTTP stack in the process would cost less than aiohttp (issue 48 item 2).

    python bench/bench_front_door.py                       # --workers 1, 3 rounds of 5 s
    python bench/bench_front_door.py --workers 1 2 --rounds 2
    python bench/bench_front_door.py --doors http --rounds 2 --granian
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_http_stack import POST_LUA, serve_aiohttp  # noqa: E402
from bench_serve import cpu_seconds as tree_cpu_seconds  # noqa: E402
from machine import machine_lines  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog."
DIMENSION = 32
CONNECTIONS, CHANNELS = 64, 4
TARGETS = {"http": 3.0, "grpc": 3.0, "workers": 1.5}
OPENAI_BODY = orjson.dumps({"input": TEXT, "model": "tiny", "encoding_format": "base64"})


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --- the tiny model ------------------------------------------------------------------------------------------


def tiny_model(root: Path) -> Path:
    """A 1-layer hidden-32 BERT sentence-transformer with MiniLM's tokenizer, exported for fp32 on this CPU."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from attnserve.default_model import default_checkpoint_dir

    artifacts = root / "artifacts"
    if (artifacts / "manifest.json").exists():
        return artifacts
    minilm = default_checkpoint_dir()
    bert = root / "bert"
    config = transformers.BertConfig(vocab_size=30522, hidden_size=DIMENSION, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(bert, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(str(minilm)).save_pretrained(bert)
    transformer = Transformer(str(bert), max_seq_length=256)
    SentenceTransformer(modules=[transformer, Pooling(DIMENSION, "mean"), Normalize()], device="cpu").save(
        str(root / "tiny"))
    subprocess.run([sys.executable, "-m", "attnserve.cli", "export", "--checkpoint", str(root / "tiny"),
                    "--out", str(artifacts), "--name", "tiny", "--precision", "fp32", "--provider", "cpu"],
                   check=True)
    return artifacts


def machine_busy() -> float:
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


# --- the core alone ------------------------------------------------------------------------------------------


def core_alone(artifacts: Path, requests: int = 9600, clients: int = 64) -> float:
    """In a child process: microseconds of CPU per one-text request through the protocol-neutral core (validation,
    tokenizing, the batcher, the graph, the reply and OpenAI's JSON), no network and no door: the share of a
    request's cost that is attnserve's own beside its stack's."""
    out = subprocess.run([sys.executable, __file__, "--core-alone", str(artifacts), str(requests), str(clients)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def run_core_alone(artifacts: Path, requests: int, clients: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from attnserve.config import EngineConfig, ServerConfig
    from attnserve.server.app import start_models
    from attnserve.server.core import Core
    from attnserve.server.http.openai import render
    from attnserve.server.http.wire import BASE64_FLOAT_BYTES
    from attnserve.server.metrics import Metrics
    from attnserve.server.model_sources import ModelSource
    from attnserve.server.models import Models
    from attnserve.server.requests import EncodeRequest

    async def main() -> None:
        config = ServerConfig()
        models = Models.load([ModelSource("tiny", artifacts)], EngineConfig(precision="fp32", provider="cpu"), config,
                             Metrics())
        core = Core(models, config, ThreadPoolExecutor(4), 4)
        await start_models(models)

        async def client(n: int) -> None:
            for _ in range(n):
                await core.encode(EncodeRequest(inputs=[TEXT], normalize=True), None,
                                  lambda reply: render(reply, "tiny", True), BASE64_FLOAT_BYTES)

        await asyncio.gather(*(client(20) for _ in range(clients)))  # warm
        cpu = time.process_time()
        await asyncio.gather(*(client(requests // clients) for _ in range(clients)))
        print((time.process_time() - cpu) / (requests // clients * clients) * 1e6)
        for batcher in models.default.batchers:
            batcher.close()
            await batcher.join()
        models.default.inference.shutdown()

    asyncio.run(main())


# --- the bare stacks -----------------------------------------------------------------------------------------


def serve_bare_http(port: int) -> None:
    import base64

    from aiohttp import web

    vector = base64.b64encode(np.random.default_rng(0).standard_normal(DIMENSION).astype("<f4").tobytes()).decode()

    async def embeddings(request):
        body = orjson.loads(await request.read())
        await asyncio.sleep(0)  # the hop awaiting a batch takes
        return web.Response(body=orjson.dumps({
            "object": "list", "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": body.get("model"), "usage": {"prompt_tokens": 12, "total_tokens": 12}}),
            content_type="application/json")

    asyncio.run(serve_aiohttp(embeddings, port))


def serve_bare_granian(port: int) -> None:
    """The same bare handler as serve_bare_http's on Granian's embedded server (RSGI, its Rust HTTP stack feeding
    this process's asyncio loop): the stack issue 48 item 2 asks to try where aiohttp itself is the cost."""
    import base64

    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server

    vector = base64.b64encode(np.random.default_rng(0).standard_normal(DIMENSION).astype("<f4").tobytes()).decode()
    headers = [("content-type", "application/json")]

    async def embeddings(scope, proto) -> None:
        body = orjson.loads(await proto())
        await asyncio.sleep(0)  # the hop awaiting a batch takes
        proto.response_bytes(200, headers, orjson.dumps({
            "object": "list", "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": body.get("model"), "usage": {"prompt_tokens": 12, "total_tokens": 12}}))

    asyncio.run(Server(embeddings, address="127.0.0.1", port=port, interface=Interfaces.RSGI, websockets=False,
                       http=HTTPModes.http1, log_enabled=False).serve())


def serve_bare_grpc(port: int) -> None:
    import grpc

    from attnserve.v1 import encoder_pb2 as pb

    vector = np.random.default_rng(0).standard_normal(DIMENSION).astype("<f4")
    reply = pb.EmbedResponse(model="tiny")
    reply.embeddings.add(num_tokens=12).sentence_embedding.CopyFrom(
        pb.Tensor(shape=[DIMENSION], dtype=pb.FLOAT32, data=vector.tobytes()))

    async def embed(request, context):
        await asyncio.sleep(0)
        return reply

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("attnserve.v1.Encoder", {
            "Embed": grpc.unary_unary_rpc_method_handler(embed, pb.EmbedRequest.FromString,
                                                         pb.EmbedResponse.SerializeToString)})])
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


# --- the loads -----------------------------------------------------------------------------------------------


def grpc_client(port: int, seconds: float) -> None:
    """In its own process: CONNECTIONS Embed calls in flight for `seconds`; prints the replies counted."""
    import grpc

    from attnserve.v1 import encoder_pb2 as pb

    request = pb.EmbedRequest(inputs=[pb.Input(text=TEXT)], truncate=True).SerializeToString()

    async def main() -> None:
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CHANNELS)]
        calls = [c.unary_unary("/attnserve.v1.Encoder/Embed", request_serializer=None, response_deserializer=None)
                 for c in channels]
        done, failed = 0, 0
        end = time.monotonic() + seconds

        async def loop(call) -> None:
            nonlocal done, failed
            while time.monotonic() < end:
                try:
                    await call(request, timeout=30)
                    done += 1
                except grpc.aio.AioRpcError:
                    failed += 1

        await asyncio.gather(*(loop(calls[i % CHANNELS]) for i in range(CONNECTIONS)))
        print(done, failed, flush=True)
        for c in channels:
            await c.close()

    asyncio.run(main())


def http_load(port: int, seconds: float, lua: str) -> tuple[int, int]:
    out = subprocess.run(["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds:g}s", "-s", lua,
                          f"http://127.0.0.1:{port}/v1/embeddings"], capture_output=True, text=True,
                         env={**os.environ, "BODY": OPENAI_BODY.decode()}, check=True).stdout
    done = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return done, (int(bad.group(1)) if bad else 0) + (sum(int(x) for x in errors.groups()) if errors else 0)


def grpc_load(port: int, seconds: float) -> tuple[int, int]:
    out = subprocess.run([sys.executable, __file__, "--grpc-client", str(port), str(seconds)], capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def measured(pid: int, load) -> dict:
    """One load against the server whose process tree is pid: requests/s, its cores, its CPU per request."""
    cpu0, busy0, t0 = tree_cpu_seconds(pid), machine_busy(), time.monotonic()
    done, failed = load()
    seconds = time.monotonic() - t0
    cpu = tree_cpu_seconds(pid) - cpu0
    if failed or not done:
        raise RuntimeError(f"{failed} of {done + failed} requests failed")
    return {"rps": done / seconds, "cores": cpu / seconds, "ms": cpu / done * 1e3,
            "machine_cores": (machine_busy() - busy0) / seconds}


# --- the servers ---------------------------------------------------------------------------------------------


def free_port() -> int:
    from attnserve.server_process import free_port as free

    return free("127.0.0.1")


class Bare:
    def __init__(self, kind: str):
        self.port = free_port()
        self.process = subprocess.Popen([sys.executable, __file__, f"--bare-{kind}", str(self.port)])
        time.sleep(2.0)
        self.pid = self.process.pid

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


class Attnserve:
    def __init__(self, artifacts: Path, workers: int):
        from attnserve.server_process import ServerProcess

        flags = ["--precision", "fp32", "--provider", "cpu", "--workers", str(workers)]  # never auto's choice
        self.server = ServerProcess(artifacts, *flags, env={"ATTNSERVE_MAX_QUEUE_WAIT_MS": None})
        self.server.wait_serving(timeout=300)
        self.pid, self.port, self.http_port = self.server.process.pid, self.server.port, self.server.http_port

    def stop(self) -> None:
        self.server.process.send_signal(signal.SIGTERM)
        self.server.process.wait(60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="attnserve's --workers counts to run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--doors", nargs="+", default=["http", "grpc"], choices=["http", "grpc"])
    parser.add_argument("--granian", action="store_true",
                        help="also the bare handler on Granian's embedded RSGI server (HTTP; granian installed)")
    args = parser.parse_args(argv)
    for line in machine_lines():
        print(line)
    root = Path(os.environ.get("BENCH_TMP", tempfile.gettempdir())) / "bench-front-door"
    root.mkdir(parents=True, exist_ok=True)
    artifacts = tiny_model(root)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
        lua.write(POST_LUA)
    stacks = ["bare", *(["bare granian"] if args.granian else []), *(f"attnserve w{n}" for n in args.workers)]
    results: dict[tuple[str, str], list[dict]] = {}
    core_us = min(core_alone(artifacts) for _ in range(args.rounds))
    log(f"the core alone: {core_us:.1f} us of CPU a request")
    try:
        for round_ in range(args.rounds):
            for stack in stacks:
                for door in args.doors:
                    if stack == "bare granian" and door != "http":
                        continue
                    server = (Bare(door) if stack == "bare" else Bare("granian") if stack == "bare granian" else
                              Attnserve(artifacts, int(stack.split("w")[1])))
                    try:
                        port = server.port if stack.startswith("bare") or door == "grpc" else server.http_port
                        load = ((lambda p=port: http_load(p, 1.0, lua.name)) if door == "http"
                                else (lambda p=port: grpc_load(p, 1.0)))
                        load()  # warm-up
                        load = ((lambda p=port: http_load(p, args.seconds, lua.name)) if door == "http"
                                else (lambda p=port: grpc_load(p, args.seconds)))
                        result = measured(server.pid, load)
                    finally:
                        server.stop()
                    results.setdefault((door, stack), []).append(result)
                    log(f"round {round_} {door} {stack}: {result['rps']:,.0f} req/s, {result['cores']:.2f} cores, "
                        f"{result['ms']:.3f} ms CPU/request")
    finally:
        os.unlink(lua.name)
    print(report(results, args))
    print(f"the core alone (in this machine's process, no network: validation, tokenizing, batcher, graph, reply, "
          f"OpenAI's JSON): {core_us:.1f} us of CPU a request, best of {args.rounds}")
    return 0


def best(runs: list[dict]) -> dict:
    """The round of least CPU per request (the least disturbed one)."""
    return min(runs, key=lambda r: r["ms"])


def report(results: dict, args) -> str:
    lines = [f"\n{'door':<5} {'server':<14} {'requests/s':>11} {'server cores':>13} {'ms CPU/request':>15} "
             f"{'÷ bare':>7}   (best of {args.rounds} rounds of {args.seconds:g} s, {CONNECTIONS} in flight)"]
    for door in args.doors:
        bare = best(results[(door, "bare")])
        for (d, stack), runs in results.items():
            if d != door:
                continue
            r = best(runs)
            lines.append(f"{door:<5} {stack:<14} {r['rps']:>11,.0f} {r['cores']:>13.2f} {r['ms']:>15.3f} "
                         f"{r['ms'] / bare['ms']:>7.2f}")
    lines.append("")
    for door in args.doors:
        ratio = best(results[(door, "attnserve w1")])["ms"] / best(results[(door, "bare")])["ms"]
        lines.append(f"target {door}: CPU per request ÷ the bare {door} stack's {ratio:.2f} (<= {TARGETS[door]:g}): "
                     f"{'met' if ratio <= TARGETS[door] else 'NOT met'}")
    if 1 in args.workers and len(args.workers) > 1:
        for n in args.workers[1:]:
            for door in args.doors:
                ratio = best(results[(door, f'attnserve w{n}')])["rps"] / best(results[(door, "attnserve w1")])["rps"]
                lines.append(f"target {door}: requests/s with --workers {n} ÷ --workers 1 {ratio:.2f} "
                             f"(>= {TARGETS['workers']:g} at 2): {'met' if ratio >= TARGETS['workers'] else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--bare-http"]:
        serve_bare_http(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--bare-granian"]:
        serve_bare_granian(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--bare-grpc"]:
        serve_bare_grpc(int(sys.argv[2]))
    elif sys.argv[1:2] == ["--core-alone"]:
        run_core_alone(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1:2] == ["--grpc-client"]:
        grpc_client(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit(main())
