"""A first start on a checkpoint folder, as a user makes one (issue 45), and every first call answered: a request
that needs a graph not built yet waits while it is built, within its deadline and --max-build-wait
(server/build_wait.py), as TEI, vLLM and Infinity answer every first request."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cohere
import grpc
import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from attnserve.engine.manifest import load_manifest
from attnserve.errors import GraphBuildingError, GraphUnavailableError, ShuttingDownError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint
from attnserve.server.build_wait import once_built
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_pipeline, save_sentence_transformer, save_tiny_bert, save_tiny_clip
from .conftest import assert_one_line_error, run_cli
from .serving import ServerProcess, serving

NOT_SENTENCE_TRANSFORMERS = "has no sentence-transformers files (modules.json, config_sentence_transformers.json)"
TEXTS = ["The cat sat on the mat because it was tired.", "a second text"]


@pytest.fixture(scope="module")
def plain_bert(tmp_path_factory) -> Path:
    """A tiny BERT as transformers saves it: no modules.json, no config_sentence_transformers.json."""
    return save_tiny_bert(tmp_path_factory.mktemp("plain_bert") / "bert", vocab_size=200)


@pytest.fixture(scope="module")
def first_start(plain_bert, tmp_path_factory):
    """`serve --log-format json --max-build-wait 0 --model tiny=BERT` on an empty cache: it exports, then serves."""
    root = tmp_path_factory.mktemp("first_start")
    server = ServerProcess(None, "--model", f"tiny={plain_bert}", "--log-format", "json", "--max-build-wait", "0",
                           env={"ATTNSERVE_CACHE": str(root / "cache")}, log_path=root / "server.log")
    with serving(server):
        yield server, root / "cache"


def log_events(server: ServerProcess) -> list[dict]:
    """Every line of the server's output, each parsed as JSON (the test fails on the first that is not)."""
    events = []
    for line in filter(str.strip, server.log_tail(100_000).splitlines()):
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    return events


def test_json_logs_are_json_on_every_line_through_a_first_export_and_a_request(first_start):
    server, _ = first_start
    events = log_events(server)
    assert [e["event"] for e in events if e.get("event") in ("export", "serving")] == ["export", "serving"], events
    stage = next(e for e in events if "stage" in e)  # the export child's progress lines, carried as data
    assert stage["logger"] == "attnserve.progress.export" and stage["event"] == "progress"
    assert (stage["stage"], stage["of"]) == (1, 1) and stage["step"].startswith("trace")
    assert isinstance(stage["seconds"], int) and isinstance(stage["elapsed_seconds"], float)
    assert any(e["message"].startswith("exporting bert ") for e in events)
    reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": ["hello world"], "model": "tiny"},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny"
    assert len(log_events(server)) >= len(events)  # and after the request, still every line
    (warning,) = [e for e in events if e.get("event") == "pipeline_assumed"]  # no sentence-transformers files
    assert warning["level"] == "warning" and (warning["pooling"], warning["normalize"]) == ("mean", False)
    assert NOT_SENTENCE_TRANSFORMERS in warning["message"]
    assert all(how in warning["message"] for how in ("--pooling cls", "--normalize", "modules.json")), warning


def test_the_same_checkpoint_under_another_name_reuses_its_export(first_start, plain_bert, tmp_path):
    """Served as tiny, encoded as itself: one export in the cache, and encode names the folder, not tiny."""
    server, cache = first_start
    (tmp_path / "in.txt").write_text("hello world\nanother text\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts", plain_bert,
                     "--no-progress", env={"ATTNSERVE_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    assert " to ONNX" not in result.stderr and "exporting" not in result.stderr, result.stderr
    exported = [p for p in cache.iterdir() if (p / "manifest.json").is_file()]
    assert len(exported) == 1 and exported[0].name.startswith(f"{plain_bert.name}-"), exported
    assert json.loads(pq.read_schema(tmp_path / "out.parquet").metadata[b"attnserve"])["model"] == plain_bert.name
    # encode warns too, on its stderr, as its other notes
    assert any(line.startswith("attnserve: warning: ") and NOT_SENTENCE_TRANSFORMERS in line
               for line in result.stderr.splitlines()), result.stderr


def test_without_waiting_the_old_answer_is_retryable(first_start):
    """--max-build-wait 0: refused at once with 503 graph_building and Retry-After, as a client polling expects. Last
    of the tests on first_start: the attention build it starts goes on as the server drains."""
    first = httpx.post(f"{first_start[0].http_url}/v1/attention", json={"model": "tiny", "inputs": TEXTS[0]},
                       timeout=60)
    assert first.status_code == 503, first.text
    assert first.json()["error"]["code"] == "graph_building" and int(first.headers["Retry-After"]) >= 1
    assert "--max-build-wait" in first.json()["error"]["message"]


def test_a_port_in_use_is_refused_before_workers_auto_exports_the_model(plain_bert, tmp_path):
    """--workers auto measures the model (exporting it first) before the server starts: the ports are checked before
    that. The listener shares its port (SO_REUSEPORT), as a --workers server's do."""
    cache = tmp_path / "cache"
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        result = run_cli("serve", "--model", f"tiny={plain_bert}", "--workers", "auto", "--host", "127.0.0.1",
                         "--port", str(port), "--http-port", "-1", "--metrics-port", "-1",
                         env={"ATTNSERVE_CACHE": str(cache)})
    assert_one_line_error(result, f"cannot listen on 127.0.0.1:{port} (gRPC, --port): Address already in use")
    assert time.monotonic() - started < 60
    assert not cache.exists() or not any(cache.iterdir()), "the model was exported before the ports were checked"


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory) -> Path:
    """A tiny sentence-transformers pipeline with a Dense layer after its pooling: no late chunking."""
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling

    root = tmp_path_factory.mktemp("dense")
    return save_pipeline(save_tiny_bert(root / "bert", vocab_size=64), root / "st",
                         lambda size: [Pooling(size, "mean"), Dense(size, 16)])


@pytest.mark.parametrize("exported, mode, fragments", [
    (False, "sentences", ["--late-chunking mean-pools token embeddings, and st's embedding is not a pooling",
                          "Transformer -> Pooling(mean) -> Dense"]),
    (True, "tokens", ["--late-chunking mean-pools token embeddings", "Dense(32->16"]),
], ids=["checkpoint", "artifact-directory"])
def test_late_chunking_of_a_dense_model_is_refused_before_it_is_exported_or_loaded(dense_checkpoint, tmp_path,
                                                                                   exported, mode, fragments):
    """Before it is exported, or (an artifact directory) before the engine opens it: no calibration.json."""
    cache, artifacts = tmp_path / "cache", tmp_path / "artifacts"
    if exported:
        build_artifacts(read_checkpoint(dense_checkpoint), artifacts, log=lambda m: None, variants=["embeddings"])
    (tmp_path / "in.txt").write_text("One sentence. Another one.\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts",
                     artifacts if exported else dense_checkpoint, "--late-chunking", mode,
                     env={"ATTNSERVE_CACHE": str(cache)})
    assert_one_line_error(result, *fragments)
    assert not cache.exists() or not any(cache.iterdir()), "exported before refusing"
    assert not (artifacts / "calibration.json").exists()


# --- first calls ----------------------------------------------------------------------------------------------------


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
        # Cohere's SDK raises on a 503 at once: its first int8 call must be answered (its own timeout: 300 s).
        reply = cohere.ClientV2(api_key="unused", base_url=server.http_url).embed(
            model="tiny", input_type="search_document", texts=TEXTS, embedding_types=["int8", "float"])
        codes = np.array(reply.embeddings.int8)
        assert codes.shape == (2, 32) and codes.min() >= -128 and codes.max() <= 127
        manifest = load_manifest(exported(tmp_path))
        assert manifest.quantization is not None
        # The codes are the floats quantized over the ranges the build calibrated, as sentence-transformers does.
        low, high = manifest.quantization_ranges(None, True)
        floats = np.array(reply.embeddings.float_, dtype=np.float32)
        want = np.clip((floats - low) / ((high - low) / 255) - 128, -128, 127).astype(np.int8)
        assert np.abs(codes - want).max() <= 1
        # A deadline shorter than the attention build: DEADLINE_EXCEEDED, the build goes on.
        with pytest.raises(grpc.RpcError) as short:
            grpc_attention(server, timeout=0.5)
        assert short.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # Then curl and a gRPC stub at once, both waiting on the one build.
        answers: dict[str, pb.EmbedResponse] = {}
        thread = threading.Thread(target=lambda: answers.update(grpc=grpc_attention(server, timeout=300)))
        thread.start()
        curl = subprocess.run(["curl", "-sS", "-w", "\\n%{http_code}", "-H", "Content-Type: application/json", "-d",
                               '{"model": "tiny", "inputs": "The cat sat on the mat."}',
                               f"{server.http_url}/v1/attention"], capture_output=True, text=True, timeout=300)
        thread.join(300)
        body, status = curl.stdout.rsplit("\n", 1)
        assert status == "200" and '"attentions"' in body, curl.stdout + curl.stderr
        assert np.frombuffer(answers["grpc"].embeddings[0].attentions.data, dtype="<f4").size > 0
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


def test_serve_build_builds_the_graphs_it_names_once_serving_and_refuses_a_name_of_no_graph(tiny, tmp_path):
    result = run_cli("serve", "--model", f"tiny={tiny}", "--build", "attention,nonsense", "--port", "0",
                     "--http-port", "-1", "--metrics-port", "-1", env={"ATTNSERVE_CACHE": str(tmp_path / "refused")})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--build nonsense: not a graph of" in result.stderr and "attention, int8" in result.stderr
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


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray((np.random.default_rng(seed).random((40, 50, 3)) * 255).astype(np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_image_int8_without_ranges_is_refused_before_any_build(tmp_path):
    """An image model's int8 needs the request's own ranges (the model's are calibrated on texts): refused with 400
    at once, no build started; with ranges it is answered, on a fresh cache."""
    with serving(served(save_tiny_clip(tmp_path / "tiny-clip"), tmp_path)) as server:
        image = f"data:image/png;base64,{base64.b64encode(png(0)).decode()}"
        started = time.monotonic()
        refused = httpx.post(f"{server.http_url}/v2/embed", json={"model": "tiny", "images": [image],
                                                                   "embedding_types": ["int8"]}, timeout=60)
        assert refused.status_code == 400 and "need the request's own ranges" in refused.text, refused.text
        assert time.monotonic() - started < 5
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

    def __init__(self, outcome: Exception | None = None):
        self.done, self.outcome, self.asked = threading.Event(), outcome, 0

    def require(self, needs, what):
        self.asked += 1
        if not self.done.is_set():
            raise GraphBuildingError("being built", 1.0, tuple(needs), what)
        if self.outcome is not None:
            raise self.outcome

    async def prepare(self):
        self.require(("attention",), "attention weights")
        return "prepared"

    async def held(self, most_wait: float, done_after: float | None = None, drain_after: float | None = None):
        """A request held by once_built; the build done, or the drain started, after so many seconds."""
        draining, loop = asyncio.Event(), asyncio.get_running_loop()
        if done_after is not None:
            loop.call_later(done_after, self.done.set)
        if drain_after is not None:
            loop.call_later(drain_after, draining.set)
        return await once_built(self.prepare, self.require, ThreadPoolExecutor(1), most_wait, draining)


def test_a_held_request_runs_once_built_and_asks_only_for_what_it_needs():
    build = Build()
    assert asyncio.run(build.held(60, done_after=0.5)) == "prepared"
    assert 2 <= build.asked <= 6  # prepared twice; asked again at 0.2, 0.6 s: no busy loop


def test_a_held_request_ends_with_the_build_the_bound_or_the_drain():
    with pytest.raises(GraphUnavailableError, match="gone"):
        asyncio.run(Build(GraphUnavailableError("could not build: the checkpoint is gone")).held(60, done_after=0.3))
    with pytest.raises(GraphBuildingError, match="--max-build-wait"):
        asyncio.run(Build().held(0.3))
    started = time.monotonic()
    with pytest.raises(ShuttingDownError):
        asyncio.run(Build().held(60, drain_after=0.3))
    assert time.monotonic() - started < 2
