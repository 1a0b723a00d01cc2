"""A first start on a checkpoint folder, as a user makes one (issue 45): its export logged in the server's format
(every line JSON under --log-format json), a port in use found before any export, the export cached by what the
checkpoint is rather than the name it is served under, --late-chunking refused from the checkpoint's modules before
it is exported, and a folder without sentence-transformers files warned about."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint

from .checkpoints import save_pipeline, save_tiny_bert
from .conftest import assert_one_line_error, run_cli
from .serving import ServerProcess

NOT_SENTENCE_TRANSFORMERS = "has no sentence-transformers files (modules.json, config_sentence_transformers.json)"


@pytest.fixture(scope="module")
def plain_bert(tmp_path_factory) -> Path:
    """A tiny BERT as transformers saves it: no modules.json, no config_sentence_transformers.json."""
    return save_tiny_bert(tmp_path_factory.mktemp("plain_bert") / "bert", vocab_size=200)


@pytest.fixture(scope="module")
def first_start(plain_bert, tmp_path_factory):
    """`serve --log-format json --model tiny=BERT` on an empty cache: it exports, then serves (its log, and the
    cache it exported into)."""
    root = tmp_path_factory.mktemp("first_start")
    cache = root / "cache"
    server = ServerProcess(None, "--model", f"tiny={plain_bert}", "--log-format", "json",
                           env={"ATTNSERVE_CACHE": str(cache)}, log_path=root / "server.log")
    try:
        server.wait_serving()
        yield server, cache
    finally:
        assert server.terminate() == 0, server.log_tail()


def log_events(server: ServerProcess) -> list[dict]:
    """Every line of the server's output, each parsed as JSON (the test fails on the first that is not)."""
    lines = [line for line in server.log_tail(100_000).splitlines() if line.strip()]
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
    return events


def test_json_logs_are_json_on_every_line_through_a_first_export_and_a_request(first_start):
    server, _ = first_start
    events = log_events(server)
    assert [e["event"] for e in events if e.get("event") in ("export", "serving")] == ["export", "serving"], events
    # The export child's progress lines, carried as data: the stage, of how many, its estimate.
    stage = next(e for e in events if "stage" in e)
    assert stage["logger"] == "attnserve.progress.export" and stage["event"] == "progress"
    assert (stage["stage"], stage["of"]) == (1, 1) and stage["step"].startswith("trace")
    assert isinstance(stage["seconds"], int) and isinstance(stage["elapsed_seconds"], float)
    assert any(e["message"].startswith("exporting bert ") for e in events)
    reply = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": ["hello world"], "model": "tiny"},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny"
    assert len(log_events(server)) >= len(events)  # and after the request, still every line


def test_a_folder_without_sentence_transformers_files_is_served_with_a_warning(first_start):
    server, _ = first_start
    (warning,) = [e for e in log_events(server) if e.get("event") == "pipeline_assumed"]
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
    metadata = json.loads(pq.read_schema(tmp_path / "out.parquet").metadata[b"attnserve"])
    assert metadata["model"] == plain_bert.name
    # encode warns too, on its stderr, as its other notes
    assert any(line.startswith("attnserve: warning: ") and NOT_SENTENCE_TRANSFORMERS in line
               for line in result.stderr.splitlines()), result.stderr


def test_a_port_in_use_is_refused_before_workers_auto_exports_the_model(plain_bert, tmp_path):
    """--workers auto measures the model (exporting it first, on an empty cache) before the server starts: the
    ports are checked before that. The listener shares its port (SO_REUSEPORT), as a --workers server's do."""
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


def test_late_chunking_of_a_dense_checkpoint_is_refused_before_it_is_exported(dense_checkpoint, tmp_path):
    cache = tmp_path / "cache"
    (tmp_path / "in.txt").write_text("One sentence. Another one.\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts", dense_checkpoint,
                     "--late-chunking", "sentences", env={"ATTNSERVE_CACHE": str(cache)})
    assert_one_line_error(result, "--late-chunking mean-pools token embeddings, and st's embedding is not a pooling",
                          "Transformer -> Pooling(mean) -> Dense")
    assert not cache.exists() or not any(cache.iterdir()), "exported before refusing"


def test_late_chunking_of_a_dense_artifact_directory_is_refused_before_it_loads(dense_checkpoint, tmp_path):
    """Before the engine opens it: a first start's calibration (calibration.json) never ran."""
    artifacts = tmp_path / "artifacts"
    build_artifacts(read_checkpoint(dense_checkpoint), artifacts, log=lambda m: None, variants=["embeddings"])
    (tmp_path / "in.txt").write_text("One sentence. Another one.\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "out.parquet", "--artifacts", artifacts,
                     "--late-chunking", "tokens")
    assert_one_line_error(result, "--late-chunking mean-pools token embeddings", "Dense(32->16")
    assert not (artifacts / "calibration.json").exists()
