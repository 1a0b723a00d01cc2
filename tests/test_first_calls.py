"""Every first call answered: a request that needs a graph the artifact directory does not hold yet (the attention
graphs, int8 embeddings' ranges) waits while it is built, within its deadline and --max-build-wait, then runs
(server/build_wait.py), as TEI, vLLM and Infinity answer every first request. Tried as users make them: Cohere's
SDK, a gRPC stub without a retry policy, curl. A request that will be refused anyway is refused before anything
is built; serve --build builds the graphs it names once the server serves."""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import threading
import time
from pathlib import Path

import cohere
import grpc
import httpx
import numpy as np
import pytest
from PIL import Image

from attnserve.engine.manifest import load_manifest
from attnserve.errors import GraphBuildingError, GraphUnavailableError, ShuttingDownError
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_sentence_transformer, save_tiny_bert, save_tiny_clip
from .conftest import run_cli
from .serving import ServerProcess, serving

TEXTS = ["The cat sat on the mat because it was tired.", "a second text"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny BERT saved by sentence-transformers: its builds take seconds."""
    root = tmp_path_factory.mktemp("tiny_first_calls")
    return save_sentence_transformer(save_tiny_bert(root / "bert", vocab_size=200), root / "st", "mean", True)


def served(checkpoint: Path, tmp_path: Path, *flags: str) -> ServerProcess:
    """The checkpoint served from a cache of its own: its first start exports the one graph it runs."""
    return ServerProcess(None, "--model", f"tiny={checkpoint}", *flags,
                         env={"ATTNSERVE_CACHE": str(tmp_path / "cache")}, log_path=tmp_path / "server.log")


def exported(tmp_path: Path) -> Path:
    (directory,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and (p / "manifest.json").is_file()]
    return directory


def grpc_attention(server: ServerProcess, timeout: float | None) -> pb.EmbedResponse:
    """A plain generated stub, no retry policy: what a user's own gRPC client does."""
    with server.channel() as channel:
        return server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text=TEXTS[0])], model="tiny",
                                                          attention=pb.AttentionOptions()), timeout=timeout)


def test_first_int8_and_attention_calls_wait_for_their_graphs(tiny, tmp_path):
    with serving(served(tiny, tmp_path)) as server:
        assert set(load_manifest(exported(tmp_path)).variants) == {"embeddings"}
        # Cohere's SDK raises on a 503 at once: its first int8 call must be answered.
        co = cohere.ClientV2(api_key="unused", base_url=server.http_url)  # its own timeout: 300 s
        reply = co.embed(model="tiny", input_type="search_document", texts=TEXTS, embedding_types=["int8", "float"])
        codes = np.array(reply.embeddings.int8)
        assert codes.shape == (2, 32) and codes.min() >= -128 and codes.max() <= 127
        manifest = load_manifest(exported(tmp_path))
        assert manifest.quantization is not None
        # The codes are the floats quantized over the ranges the build calibrated, as sentence-transformers does.
        ranges = manifest.quantization_ranges(None, True)
        floats = np.array(reply.embeddings.float_, dtype=np.float32)
        steps = (ranges[1] - ranges[0]) / 255
        want = np.clip((floats - ranges[0]) / steps - 128, -128, 127).astype(np.int8)
        assert np.abs(codes - want).max() <= 1

        # A deadline shorter than the attention build: DEADLINE_EXCEEDED, the build goes on.
        with pytest.raises(grpc.RpcError) as short:
            grpc_attention(server, timeout=0.5)
        assert short.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Then curl and a gRPC stub at once, both waiting on the one build.
        answers: dict[str, object] = {}

        def by_grpc() -> None:
            answers["grpc"] = grpc_attention(server, timeout=300)

        thread = threading.Thread(target=by_grpc)
        thread.start()
        curl = subprocess.run(["curl", "-sS", "-w", "\\n%{http_code}", "-H", "Content-Type: application/json", "-d",
                               '{"model": "tiny", "inputs": "The cat sat on the mat."}',
                               f"{server.http_url}/v1/attention"], capture_output=True, text=True, timeout=300)
        thread.join(300)
        body, status = curl.stdout.rsplit("\n", 1)
        assert status == "200", curl.stdout + curl.stderr
        assert '"attentions"' in body
        maps = np.frombuffer(answers["grpc"].embeddings[0].attentions.data, dtype="<f4")  # type: ignore[attr-defined]
        assert maps.size > 0
        log = server.log_tail(100_000)
    assert {"attention", "attention_last"} <= set(load_manifest(exported(tmp_path)).variants)
    assert log.count("attention weights were asked for") == 1, log  # one build for every request held
    assert "Traceback" not in log


def test_a_front_door_worker_holds_a_first_call_too(tiny, tmp_path):
    """--workers 2: the engine process builds, the worker's core waits on it through the link (server/workers/)."""
    with serving(served(tiny, tmp_path, "--workers", "2")) as server:
        reply = httpx.post(f"{server.http_url}/v1/attention", json={"model": "tiny", "inputs": TEXTS[0]}, timeout=300)
        assert reply.status_code == 200, reply.text
        with server.channel() as channel:
            answer = server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text=t) for t in TEXTS], model="tiny",
                                                                embedding_type=pb.EMBEDDING_TYPE_INT8), timeout=300)
        assert [e.sentence_embedding.dtype for e in answer.embeddings] == [pb.INT8, pb.INT8]


def test_without_waiting_the_old_answer_is_retryable(tiny, tmp_path):
    """--max-build-wait 0: refused at once with 503 graph_building and Retry-After, as a client polling expects."""
    with serving(served(tiny, tmp_path, "--max-build-wait", "0")) as server:
        first = httpx.post(f"{server.http_url}/v1/attention", json={"model": "tiny", "inputs": TEXTS[0]}, timeout=60)
        assert first.status_code == 503, first.text
        assert first.json()["error"]["code"] == "graph_building" and int(first.headers["Retry-After"]) >= 1
        assert "--max-build-wait" in first.json()["error"]["message"]


def test_serve_build_builds_the_graphs_it_names_once_serving(tiny, tmp_path):
    with serving(served(tiny, tmp_path, "--build", "attention,int8")) as server:
        deadline = time.monotonic() + 240
        while "built attention" not in server.log_tail(100_000) and time.monotonic() < deadline:
            time.sleep(0.5)
        manifest = load_manifest(exported(tmp_path))
        assert {"attention", "attention_last"} <= set(manifest.variants) and manifest.quantization is not None
        started = time.monotonic()
        reply = httpx.post(f"{server.http_url}/v1/attention", json={"model": "tiny", "inputs": TEXTS[0]}, timeout=60)
        assert reply.status_code == 200 and time.monotonic() - started < 10
        assert "building" not in server.log_tail(100_000).split("built attention")[-1]


def test_serve_build_refuses_a_name_of_no_graph(tiny, tmp_path):
    result = run_cli("serve", "--model", f"tiny={tiny}", "--build", "attention,nonsense", "--port", "0",
                     "--http-port", "-1", "--metrics-port", "-1", env={"ATTNSERVE_CACHE": str(tmp_path / "cache")})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--build nonsense: not a graph of" in result.stderr and "attention, int8" in result.stderr


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((np.random.default_rng(seed).random((40, 50, 3)) * 255).astype(np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_image_int8_without_ranges_is_refused_before_any_build(tmp_path):
    """An image model's int8 needs the request's own ranges (the model's are calibrated on texts): refused with
    400 at once, no build started; with ranges it is answered, on a fresh cache."""
    clip = save_tiny_clip(tmp_path / "tiny-clip")
    with serving(served(clip, tmp_path)) as server:
        image = f"data:image/png;base64,{base64.b64encode(png(0)).decode()}"
        started = time.monotonic()
        refused = httpx.post(f"{server.http_url}/v2/embed", json={"model": "tiny", "images": [image],
                                                                   "embedding_types": ["int8"]}, timeout=60)
        assert refused.status_code == 400, refused.text
        assert time.monotonic() - started < 5
        assert "need the request's own ranges" in refused.text, refused.text
        assert "building" not in server.log_tail(100_000)
        size = load_manifest(exported(tmp_path)).embedding_size
        ranges = np.vstack((np.full(size, -0.5), np.full(size, 0.5))).astype("<f4")
        with server.channel() as channel:
            reply = server.stub(channel).Embed(pb.EmbedRequest(
                model="tiny", inputs=[pb.Input(image=pb.Image(data=png(1)))], embedding_type=pb.EMBEDDING_TYPE_INT8,
                ranges=pb.Tensor(shape=[2, size], dtype=pb.FLOAT32, data=ranges.tobytes())), timeout=300)
        codes = reply.embeddings[0].sentence_embedding
        assert list(codes.shape) == [size] and codes.dtype == pb.INT8


class Build:
    """What Engine.require answers while a build runs: GraphBuildingError until `done` is set, then the build's
    outcome (None: built; an error: it failed)."""

    def __init__(self):
        self.done, self.outcome, self.asked = threading.Event(), None, 0

    def require(self, needs, what):
        self.asked += 1
        if not self.done.is_set():
            raise GraphBuildingError("being built", 1.0, tuple(needs), what)
        if self.outcome is not None:
            raise self.outcome

    async def prepare(self):
        self.require(("attention",), "attention weights")
        return "prepared"


def held(build: Build, most_wait: float, draining: asyncio.Event | None = None):
    from concurrent.futures import ThreadPoolExecutor

    from attnserve.server.build_wait import once_built

    return once_built(build.prepare, build.require, ThreadPoolExecutor(1), most_wait, draining or asyncio.Event())


def test_a_held_request_runs_once_built_and_asks_only_for_what_it_needs():
    async def main():
        build = Build()
        asyncio.get_running_loop().call_later(0.5, build.done.set)
        assert await held(build, 60) == "prepared"
        return build.asked

    assert 2 <= asyncio.run(main()) <= 6  # prepared twice; asked again at 0.2, 0.6 s: no busy loop


def test_a_held_request_ends_with_the_build_the_bound_or_the_drain():
    async def failed():
        build = Build()
        build.outcome = GraphUnavailableError("could not build: the checkpoint is gone")
        asyncio.get_running_loop().call_later(0.3, build.done.set)
        await held(build, 60)

    with pytest.raises(GraphUnavailableError, match="gone"):
        asyncio.run(failed())
    with pytest.raises(GraphBuildingError, match="--max-build-wait"):
        asyncio.run(held(Build(), 0.3))

    async def drained():
        draining = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, draining.set)
        started = time.monotonic()
        with pytest.raises(ShuttingDownError):
            await held(Build(), 60, draining)
        return time.monotonic() - started

    assert asyncio.run(drained()) < 2
