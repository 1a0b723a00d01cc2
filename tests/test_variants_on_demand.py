"""Your own model, serving at once (issue 33): a checkpoint's first run builds the one graph it runs; every other
variant is built when first needed (attention, a --precision, `export --all`), verified first, and listed only then.
With --max-build-wait 0 a request for a graph being built is refused retryably (HTTP 503 + Retry-After, gRPC
UNAVAILABLE + RetryInfo) while it builds; one the server cannot build gets HTTP 501 / FAILED_PRECONDITION."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from attnserve.client import Client
from attnserve.client.status import error_details
from attnserve.config import ClientConfig, EngineConfig
from attnserve.engine.engine import Engine
from attnserve.engine.manifest import load_manifest
from attnserve.errors import ArtifactError
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import load_encoder, read_checkpoint
from attnserve.v1 import encoder_pb2 as pb

from .checkpoints import save_sentence_transformer, save_tiny_bert
from .conftest import assert_one_line_error, run_cli
from .serving import ServerProcess, serving

TEXT = "The cat sat on the mat because it was tired."
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny BERT saved by sentence-transformers: builds take seconds."""
    root = tmp_path_factory.mktemp("tiny_on_demand")
    return save_sentence_transformer(save_tiny_bert(root / "bert", vocab_size=200), root / "st", "mean", True)


@pytest.fixture(scope="module")
def first_exports(tmp_path_factory, checkpoint, tiny) -> dict[str, Path]:
    """As a CPU run's first export leaves them (the plain fp32 graph alone): all-MiniLM-L6-v2's, and the tiny BERT's
    for the tests that build a variant on demand (the build is what they check)."""
    out = {"minilm": checkpoint, "tiny": read_checkpoint(tiny)}
    for name, ckpt in out.items():
        out[name] = tmp_path_factory.mktemp(f"first_export_{name}") / "artifacts"
        build_artifacts(ckpt, out[name], log=lambda m: None, variants=["embeddings"])
    return out


@pytest.fixture
def fresh(first_exports, tmp_path) -> Path:
    """A private copy of MiniLM's first export, for a test that grows it."""
    return Path(shutil.copytree(first_exports["minilm"], tmp_path / "artifacts"))


@pytest.fixture
def fresh_tiny(first_exports, tmp_path) -> Path:
    return Path(shutil.copytree(first_exports["tiny"], tmp_path / "artifacts"))


def grpc_attention_refused(server) -> grpc.RpcError:
    with server.channel() as channel, pytest.raises(grpc.RpcError) as refused:
        server.stub(channel).Embed(pb.EmbedRequest(inputs=[pb.Input(text=TEXT)], attention=pb.AttentionOptions()),
                                   timeout=30)
    return refused.value


def cosines_to_sentence_transformers(folder: Path, got: np.ndarray, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    want = SentenceTransformer(str(folder), device="cpu").encode(texts)
    return (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)


def test_a_checkpoint_served_builds_only_the_graph_it_runs(tiny, tmp_path):
    with serving(ServerProcess(None, "--model", f"tiny={tiny}", env={"ATTNSERVE_CACHE": str(tmp_path / "cache")},
                               log_path=tmp_path / "server.log")) as server:
        reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": ["hello"], "model": "tiny"}, timeout=60)
        assert reply.status_code == 200, reply.text
        log = server.log_tail(20_000)
    (directory,) = [p for p in (tmp_path / "cache").iterdir() if p.is_dir() and (p / "manifest.json").is_file()]
    assert set(load_manifest(directory).variants) == {"embeddings"}
    assert "stage 1 of 1: trace" in log and "to ONNX: embeddings" in log, log


def test_an_attention_request_is_refused_retryably_until_its_graphs_are_built(fresh_tiny, tiny, tmp_path):
    """--max-build-wait 0: HTTP 503 + Retry-After and gRPC UNAVAILABLE + RetryInfo while the attention graphs build
    in the background; then the same requests answer with maps equal to PyTorch's, and the manifest lists them."""
    import torch

    fresh, model = fresh_tiny, load_manifest(fresh_tiny).model
    with serving(ServerProcess(fresh, "--max-build-wait", "0", log_path=tmp_path / "server.log")) as server:
        first = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": TEXT}, timeout=60)
        assert first.status_code == 503, first.text
        assert first.json()["error"]["code"] == "graph_building"
        assert 1 <= int(first.headers["Retry-After"]) <= 30 and int(first.headers["retry-after-ms"]) > 0
        assert "being built now" in first.json()["error"]["message"]
        details = error_details(grpc_attention_refused(server))
        assert details.code == grpc.StatusCode.UNAVAILABLE and details.reason == "GRAPH_BUILDING", details
        assert details.retry_delay is not None and details.retry_delay > 0 and details.retryable
        # Embeddings are served meanwhile, by the graph that was there.
        assert httpx.post(f"{server.http_url}/v1/embeddings", json={"input": [TEXT], "model": model},
                          timeout=60).status_code == 200
        deadline = time.monotonic() + 180
        while True:
            reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": TEXT}, timeout=60)
            if reply.status_code == 200 or time.monotonic() > deadline:
                break
            assert reply.status_code == 503, reply.text
            time.sleep(float(reply.headers["retry-after-ms"]) / 1e3)
        assert reply.status_code == 200, server.log_tail()
        with Client(server.target) as client:  # the client waits on its own; built now: one call, the same maps
            result = client.attention(TEXT)
        log = server.log_tail(50_000)
    assert {"attention", "attention_last"} <= set(load_manifest(fresh).variants)
    assert "building attention, attention_last" in log and "verified attention.onnx" in log
    tokens = Engine.from_directory(fresh, build=False).tokenizer.encode_texts([TEXT])[0]
    ids = torch.from_numpy(np.asarray([tokens.ids]))
    with torch.no_grad():
        _, maps = load_encoder(read_checkpoint(tiny))(ids, torch.ones_like(ids), True)
    want = maps[-1, 0].numpy()  # the last layer (the default), every head
    np.testing.assert_allclose(np.array(reply.json()["data"][0]["attentions"][0], dtype=np.float32), want, atol=1e-5)
    np.testing.assert_allclose(result.attentions[0], want, atol=1e-5)


def test_a_client_waits_for_the_build_it_started(fresh_tiny, tmp_path):
    """Client.attention on a server that has not built the attention graphs retries as the server says
    (build_wait), and answers."""
    with serving(ServerProcess(fresh_tiny, log_path=tmp_path / "server.log")) as server:
        with Client(config=ClientConfig(target=server.target, build_wait=300)) as client:
            result = client.attention(TEXT, layers=[0])
        with Client(config=ClientConfig(target=server.target, build_wait=0)) as client:
            client.attention(TEXT)  # built now: no wait needed
    assert result.attentions.shape[0] == 1 and np.allclose(result.attentions.sum(-1), 1, atol=1e-5)


def test_a_graph_that_cannot_be_built_is_a_clear_501(fresh, tmp_path):
    """Artifacts exported whole before graphs were built as needed (no source): refused at once, not retryably,
    saying what to do; over gRPC FAILED_PRECONDITION."""
    manifest = json.loads((fresh / "manifest.json").read_text())
    del manifest["source"]
    (fresh / "manifest.json").write_text(json.dumps(manifest))
    with serving(ServerProcess(fresh, log_path=tmp_path / "server.log")) as server:
        reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": TEXT}, timeout=60)
        assert reply.status_code == 501, reply.text
        assert reply.json()["error"]["code"] == "graph_unavailable"
        assert "export them again" in reply.json()["error"]["message"]
        refused = grpc_attention_refused(server)
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and not error_details(refused).retryable


def test_a_build_that_fails_names_why_and_is_not_retried(fresh, tmp_path):
    """The checkpoint the directory was exported from is gone: the first request starts a build, which fails, and
    it gets 501 with the build's own reason, as every such request after it; the server serves the rest."""
    manifest = json.loads((fresh / "manifest.json").read_text())
    manifest["source"]["checkpoint"] = str(tmp_path / "moved-away")
    (fresh / "manifest.json").write_text(json.dumps(manifest))
    with serving(ServerProcess(fresh, log_path=tmp_path / "server.log")) as server:
        for _ in range(2):  # the first waited on the build that failed; the next is refused at once
            reply = httpx.post(f"{server.http_url}/v1/attention", json={"inputs": TEXT}, timeout=120)
            assert reply.status_code == 501, reply.text
            assert "moved-away" in reply.json()["error"]["message"] and "gone" in reply.json()["error"]["message"]
        assert httpx.post(f"{server.http_url}/v1/embeddings", json={"input": [TEXT], "model": MODEL},
                          timeout=60).status_code == 200
        assert "Traceback" not in server.log_tail(50_000)


def test_a_precision_not_built_yet_is_built_before_the_run(fresh_tiny, tiny):
    """--precision int8 on a directory that holds fp32 only: the engine builds int8 first (its child's lines said),
    then runs it; it holds its bar against sentence-transformers."""
    lines: list[str] = []
    engine = Engine.from_directory(fresh_tiny, EngineConfig(precision="int8"), build_log=lines.append)
    assert engine.precision == "int8" and "embeddings_int8" in load_manifest(fresh_tiny).variants
    assert any("int8" in line for line in lines), lines
    texts = [TEXT, "another sentence about something else"]
    cosine = cosines_to_sentence_transformers(tiny, engine.encode(texts).embeddings, texts)
    assert cosine.min() >= 0.99, cosine


def test_processes_adding_one_variant_together_build_it_once(first_exports, tmp_path):
    out = Path(shutil.copytree(first_exports["tiny"], tmp_path / "artifacts"))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != "manifest.json"}
    runs = [subprocess.Popen([sys.executable, "-m", "attnserve.export.build_process", "add", str(out), "--variants",
                              "embeddings_fused"], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    said = [run.communicate(timeout=300)[1] for run in runs]
    assert all(run.returncode == 0 for run in runs), said
    assert sum(text.count("optimizing: ") for text in said) == 1, said  # one built it, the others found it
    assert "embeddings_fused" in load_manifest(out).variants
    # What was listed before is as it was: a listed file is never written again.
    assert {name: (out / name).stat().st_mtime_ns for name in before} == before


def test_export_all_on_its_own_directory_adds_what_it_lacks(tiny, tmp_path):
    out = tmp_path / "artifacts"
    first = run_cli("export", "--checkpoint", tiny, "--out", out)
    assert first.returncode == 0, first.stderr
    traced = (out / "embeddings.onnx").stat().st_mtime_ns
    again = run_cli("export", "--all", "--checkpoint", tiny, "--out", out)
    assert again.returncode == 0, again.stderr
    assert "tracing the graph" not in again.stderr and (out / "embeddings.onnx").stat().st_mtime_ns == traced
    assert {"embeddings_fused", "embeddings_int8", "embeddings_fp16", "attention"} <= set(load_manifest(out).variants)


def test_the_traces_own_graph_added_over_an_earlier_trace_is_listed_and_unknown_names_are_refused(tiny, tmp_path):
    """A first build of the fused graph alone traced the plain one without listing it; adding the plain graph later
    verifies it and lists it in manifest.json (it was verified and then left out). A variant of another kind's is
    refused in one line, not silently skipped (a reranker's directory asked for "embeddings" held no graph)."""
    from attnserve.export.artifacts import add_variants

    out = tmp_path / "artifacts"
    build_artifacts(read_checkpoint(tiny), out, log=lambda m: None, variants=["embeddings_fused"])
    assert set(load_manifest(out).variants) == {"embeddings_fused"} and "fp32" in load_manifest(out).traces
    add_variants(out, ["embeddings"], log=lambda m: None)
    assert set(load_manifest(out).variants) == {"embeddings", "embeddings_fused"}
    with pytest.raises(ArtifactError, match="^no variant 'scores' for a model of kind embedder; one of embeddings, "):
        build_artifacts(read_checkpoint(tiny), tmp_path / "other", log=lambda m: None, variants=["scores"])
    assert not (tmp_path / "other").exists()


def test_the_last_layers_maps_are_cut_from_a_listed_attention_graph(tiny, tmp_path):
    """A directory with the attention graph but not attention_last (`export` of chosen variants): the first request
    for the last layer's maps builds attention_last from the listed graph, which is not traced nor written again."""
    from attnserve.export.artifacts import add_variants

    out = tmp_path / "artifacts"
    build_artifacts(read_checkpoint(tiny), out, log=lambda m: None, variants=["embeddings", "attention"])
    traced = (out / "attention.onnx").stat().st_mtime_ns
    lines: list[str] = []
    manifest = add_variants(out, ["attention_last"], log=lines.append)
    assert "attention_last" in manifest.variants and (out / "attention.onnx").stat().st_mtime_ns == traced
    assert not [line for line in lines if "tracing" in line], lines
    engine = Engine.from_directory(out, EngineConfig(), attention=True, build=False)
    inputs = engine.tokenizer.encode_texts([TEXT])
    whole, last = engine.run(inputs, attention=True), engine.run(inputs, attention=True, last_layer=True)
    assert last.map_layers != whole.map_layers  # the last layer's graph ran
    assert last.attentions is not None and whole.attentions is not None
    np.testing.assert_allclose(last.attentions[-1], whole.attentions[-1], atol=1e-5)


def test_export_straight_into_fp16_holds_no_fp32_copy(tiny, tmp_path):
    """A half-precision run's first export traces the model in fp16 (export/half_precision.py): no fp32 weights
    file, the fp16 graph verified against PyTorch's fp32 outputs, and it encodes as sentence-transformers does."""
    out = tmp_path / "artifacts"
    lines: list[str] = []
    build_artifacts(read_checkpoint(tiny), out, log=lines.append, variants=["embeddings_fp16"], trace="fp16")
    # The weights are loaded once, in fp16, for the reference (computed in fp32 a layer at a time) and the trace
    # alike: loading them in fp32 first held 4x the fp16 weights (the Qwen3-4B shape ran out of 24 GB).
    loads = [line for line in lines if "loading the weights" in line and "... still " not in line]  # no heartbeat
    assert len(loads) == 1 and "in fp16" in loads[0], lines
    manifest = load_manifest(out)
    assert set(manifest.variants) == {"embeddings_fp16"} and set(manifest.traces) == {"fp16"}
    assert not (out / "weights.fp32.data").exists() and (out / "weights.fp16.data").is_file()
    assert manifest.variants["embeddings_fp16"].parity["min_cosine_sentence_embedding"] >= 0.999
    texts = ["hello world", "a b c d e f"]
    got = Engine.from_directory(out, EngineConfig(precision="fp16"), build=False).encode(texts).embeddings
    cosine = cosines_to_sentence_transformers(tiny, got, texts)
    assert cosine.min() >= 0.999, cosine


def test_a_sharded_checkpoint_exports(tmp_path):
    """model.safetensors.index.json and its shards, as transformers saves a model past max_shard_size."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    plain, sharded = save_tiny_bert(tmp_path / "bert", vocab_size=200), tmp_path / "sharded"
    torch.manual_seed(0)
    transformers.BertModel.from_pretrained(plain).save_pretrained(sharded, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (plain / name).is_file():
            shutil.copy(plain / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file() and not (sharded / "model.safetensors").exists()
    st = save_sentence_transformer(sharded, tmp_path / "st", "mean", True)
    build_artifacts(read_checkpoint(st), tmp_path / "artifacts", log=lambda m: None, variants=["embeddings"])
    got = Engine.from_directory(tmp_path / "artifacts", build=False).encode(["hello world"]).embeddings
    assert np.abs(got - SentenceTransformer(str(st), device="cpu").encode(["hello world"])).max() <= 1e-5


def test_a_checkpoint_with_only_vocab_txt_gets_the_tokenizer_transformers_builds(tmp_path, checkpoint):
    """No tokenizer.json, but BERT's vocab.txt and tokenizer_config.json: built as transformers' AutoTokenizer
    builds its fast tokenizer (into the cache, the checkpoint's folder untouched), and the export's own tokenizer
    check holds it to sentence-transformers'."""
    import pyarrow.parquet as pq
    from sentence_transformers import SentenceTransformer

    copy, texts_file = tmp_path / "checkpoint", Path(__file__).parent.parent / "examples" / "texts.txt"
    shutil.copytree(checkpoint.directory, copy)
    (copy / "tokenizer.json").unlink()
    result = run_cli("encode", texts_file, "-o", tmp_path / "out.parquet", "--artifacts", copy,
                     env={"ATTNSERVE_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert "has no tokenizer.json: building it from vocab.txt" in result.stderr
    assert not (copy / "tokenizer.json").exists()
    got = np.stack(pq.read_table(tmp_path / "out.parquet")["embedding"].to_numpy(zero_copy_only=False))
    texts = [line for line in texts_file.read_text().splitlines() if line.strip()]
    want = SentenceTransformer(str(checkpoint.directory), device="cpu").encode(texts[:len(got)])
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("args, message", [
    (("encode", "in.txt", "-o", "{t}/o.parquet", "--precison", "int8"),
     "attnserve encode: error: unrecognized argument --precison; did you mean --precision?"),
    (("serve", "--artifacts", "{t}/nowhere", "--port", "0", "--http-port", "-1", "--metrics-port", "-1"),
     "--artifacts: {t}/nowhere does not exist"),
], ids=["a mistyped flag is named by its subcommand with the closest", "a missing artifacts folder"])
def test_a_command_line_mistake_is_one_line(tmp_path, args, message):
    result = run_cli(*(a.format(t=tmp_path) for a in args))
    assert_one_line_error(result, message.format(t=tmp_path))


def test_the_build_runs_in_a_process_of_its_own(fresh):
    """engine/builds.py: a build's failure comes back as one line, the child's own words."""
    from attnserve.engine.builds import add_in_child
    from attnserve.errors import ArtifactError

    with pytest.raises(ArtifactError, match="no variant 'nonsense'"):
        add_in_child(fresh, ["nonsense"], "CPUExecutionProvider", lambda line: None)
    assert os.path.isfile(fresh / "manifest.json")


def test_a_first_start_serves_at_once_and_times_its_graphs_after(fresh, tmp_path):
    """No calibration record for this CPU: the server serves on the default graph and batch budget at once, times
    them beside the requests, records the choice (calibration.json) and plans its batches by it from then on; the
    next start reads the record."""
    def events(process) -> list[dict]:
        return [json.loads(line) for line in process.log_tail(100_000).splitlines() if line.startswith("{")]

    with serving(ServerProcess(fresh, "--log-format", "json", log_path=tmp_path / "server.log")) as server:
        reply = httpx.post(f"{server.http_url}/embed", json={"inputs": [TEXT]}, timeout=60)
        assert reply.status_code == 200, reply.text
        deadline = time.monotonic() + 120
        while not any(e.get("event") == "calibrated" for e in events(server)) and time.monotonic() < deadline:
            assert httpx.post(f"{server.http_url}/embed", json={"inputs": [TEXT]}, timeout=60).status_code == 200
            time.sleep(0.5)
        first = events(server)
    assert "not timed on this CPU yet" in next(e for e in first if e.get("event") == "serving")["graphs"][MODEL]
    calibrated = next(e for e in first if e.get("event") == "calibrated")
    assert calibrated["graph"] == "embeddings" and calibrated["batch_tokens"] in (512, 1024, 2048), calibrated
    assert "calibrated now" in calibrated["message"] and (fresh / "calibration.json").is_file()
    with serving(again := ServerProcess(fresh, "--log-format", "json", log_path=tmp_path / "again.log")):
        pass
    lines = events(again)
    assert "calibrated for this CPU" in next(e for e in lines if e.get("event") == "serving")["graphs"][MODEL]
    assert not any(e.get("event") == "calibrated" for e in lines)
