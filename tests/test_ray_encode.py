"""`attnserve encode --engine ray`: a real local Ray, real weights, real files; the same bytes as the local engine.

Ray starts once for the module (about 5 s) and the in-process runs share it; three tests run the
real command in a subprocess, as a user does, for its summary line, its one-line errors and what it
leaves on a terminal (that one starts its own Ray, as a user's command does).
Skipped where the ray extra is not installed (pip install 'attnserve[ray]').
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnserve.config import EngineConfig
from attnserve.engine.batching import plan_batches
from attnserve.errors import ArtifactError, AttnserveError, ConfigError, InvalidInputError
from attnserve.offline import ray_encode
from attnserve.offline.encode import encode_file
from attnserve.offline.job import EncodeJob
from attnserve.offline.ray_encode import _attnserve_cause, _import_ray, _plan_actors, encode_file_ray
from attnserve.offline.rows import Prompt

from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from .offline_helpers import BAD_JSONL, RecordedProgress, hostile_jsonl, interrupted_run, on_a_terminal
from .test_server_load import mixed_texts


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module: encode_file_ray joins it and leaves it running."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'attnserve[ray]'")
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def engine(artifacts):
    """The local engine on the graph every Ray actor runs, the default one (offline/ray_encode.py), rather than the
    one calibration times fastest here: on a loaded machine that can be the other fp32 graph, whose bits differ."""
    from attnserve.engine.engine import Engine, embeddings_graph
    from attnserve.engine.manifest import load_manifest

    graph = embeddings_graph(load_manifest(artifacts), EngineConfig())[2]
    return Engine.from_directory(artifacts, EngineConfig(graph=graph.name))


def _both(artifacts, engine, src: Path, tmp_path: Path, ray_actors: int | None = None, **job) -> tuple[Path, Path]:
    """The same job through the local engine and through Ray; returns (local output, ray output)."""
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    encode_file(engine, EncodeJob(src, local, progress=False, **job))
    stats = encode_file_ray(EncodeJob(src, remote, progress=False, **job), EngineConfig(), artifacts,
                            ray_actors=ray_actors)
    assert stats.texts == pq.read_table(remote).num_rows
    return local, remote


def assert_same_output(local: Path, remote: Path) -> None:
    """Row for row: ids, embeddings (bit for bit), num_tokens, truncated, schema and metadata; then the bytes."""
    expected, got = pq.read_table(local), pq.read_table(remote)
    assert got.schema.equals(expected.schema, check_metadata=True)
    for name in expected.column_names:
        assert got.column(name).equals(expected.column(name)), name
    assert remote.read_bytes() == local.read_bytes()
    assert not list(remote.parent.glob(".*partial")) and not list(remote.parent.glob(".*parts"))


@pytest.mark.parametrize("options", [{}, {"dimensions": 32, "prompt": Prompt(text="query: ")}],
                         ids=["as it is", "cut, with a prompt"])
def test_txt_equals_the_local_engine(local_ray, artifacts, engine, tmp_path, options):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(VARIED_TEXTS) + "\n", encoding="utf-8")
    assert_same_output(*_both(artifacts, engine, src, tmp_path, **options))
    table = pq.read_table(tmp_path / "ray.parquet")
    assert table.column("truncated").to_pylist() == [False] * 6 + [True, True]
    assert table.schema.field("embedding").type.list_size == options.get("dimensions", 384)


def test_jsonl_with_ids_and_token_ids_equals_the_local_engine(local_ray, artifacts, engine, tmp_path):
    rows = [{"id": "a", "text": "first text"}, {"id": "b", "token_ids": [101, 7592, 2088, 102]},
            {"id": "c", "text": VARIED_TEXTS[2]}, {"id": "d", "token_ids": list(range(1000, 1300))}]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert_same_output(*_both(artifacts, engine, src, tmp_path, normalize=False))
    assert pq.read_table(tmp_path / "ray.parquet").column("id").to_pylist() == ["a", "b", "c", "d"]


def test_parquet_in_several_chunks_on_two_actors_keeps_order(local_ray, artifacts, engine, tmp_path, monkeypatch):
    texts = mixed_texts(90, seed=5)
    pq.write_table(pa.table({"body": texts, "id": list(range(100, 190))}), tmp_path / "in.parquet", row_group_size=25)
    used, written, in_order = set(), [], ray_encode._in_order

    class Watched:
        """An actor handle that notes which actor each chunk is sent to."""

        def __init__(self, actor, index):
            self.actor, self.index = actor, index

        @property
        def encode(self):
            used.add(self.index)
            return self.actor.encode

    def spy(ray, actors, chunks, session):
        assert len(actors) == 2
        for done in in_order(ray, [Watched(a, i) for i, a in enumerate(actors)], chunks, session):
            written.append(done.chunk.index)
            yield done

    monkeypatch.setattr(ray_encode, "_in_order", spy)
    # 13 chunks of 7 rows over 2 actors: chunks finish out of order, and must be written in order.
    local, remote = _both(artifacts, engine, tmp_path / "in.parquet", tmp_path, ray_actors=2, text_column="body",
                          chunk_rows=7)
    assert written == list(range(13)) and used == {0, 1}  # both actors encoded chunks
    assert_same_output(local, remote)
    assert pq.read_table(remote).column("id").to_pylist() == list(range(100, 190))
    assert pq.ParquetFile(remote).metadata.num_row_groups == 13  # one per chunk, as locally


def test_progress_moves_per_engine_batch_on_the_actors(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "texts.txt"
    texts = mixed_texts(60, seed=8)
    src.write_text("\n".join(texts) + "\n")
    progress = RecordedProgress()
    config = EngineConfig(max_batch_size=8)
    encode_file_ray(EncodeJob(src, tmp_path / "ray.parquet", chunk_rows=30, progress=False), config, artifacts,
                    ray_actors=1, progress=progress)
    expected = [len(batch) for chunk in (texts[:30], texts[30:]) for batch in plan_batches(
        [len(t) for t in engine.tokenizer.encode_texts(chunk)], config.max_batch_tokens, 8)]
    assert progress.total == 60 and progress.steps == expected and len(expected) >= 8


def test_bad_rows_set_aside_match_the_local_engine(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text(BAD_JSONL)
    assert_same_output(*_both(artifacts, engine, src, tmp_path, on_error="skip", chunk_rows=2))
    assert (tmp_path / "ray.errors.jsonl").read_bytes() == (tmp_path / "local.errors.jsonl").read_bytes()
    assert pq.read_table(tmp_path / "ray.parquet").column("id").to_pylist() == [10, 14]


def test_empty_input_gives_an_empty_output_with_the_schema(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "empty.txt"
    src.write_text("")
    local, remote = _both(artifacts, engine, src, tmp_path)
    assert_same_output(local, remote)
    table = pq.read_table(remote)
    assert table.num_rows == 0 and table.column_names == ["id", "embedding", "num_tokens", "truncated"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)


def test_ray_resumes_an_interrupted_local_run_with_the_same_bytes(local_ray, artifacts, engine, tmp_path,
                                                                  monkeypatch):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(40, seed=6)) + "\n")
    clean = tmp_path / "clean.parquet"
    encode_file(engine, EncodeJob(src, clean, chunk_rows=8, progress=False))

    out = tmp_path / "out.parquet"
    interrupted_run(engine, EncodeJob(src, out, chunk_rows=8, progress=False), monkeypatch, after_chunks=2)
    stats = encode_file_ray(EncodeJob(src, out, chunk_rows=8, progress=False), EngineConfig(), artifacts)
    assert (stats.resumed_rows, stats.texts) == (16, 24)
    assert out.read_bytes() == clean.read_bytes()


def test_the_command_prints_its_summary_and_writes_the_local_bytes(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(30, seed=7)) + "\n")
    encode_file(engine, EncodeJob(src, tmp_path / "local.parquet", chunk_rows=10, progress=False))
    # --ray-address: the command joins the module's Ray, as it would a cluster's, instead of starting its own.
    result = run_cli("encode", src, "-o", tmp_path / "ray.parquet", "--artifacts", artifacts, "--no-progress",
                     "--engine", "ray", "--ray-address", local_ray.get_runtime_context().gcs_address,
                     "--ray-actors", "2", "--chunk-rows", "10")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("encoded 30 texts, ") and "tokens/s, padding" in result.stdout
    assert not result.stderr.strip(), result.stderr  # Ray's console chatter stays in its log files
    assert_same_output(tmp_path / "local.parquet", tmp_path / "ray.parquet")


def test_the_command_names_a_bad_line_in_one_line_as_the_local_engine_does(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text(BAD_JSONL)
    with pytest.raises(InvalidInputError) as local_failure:
        encode_file(engine, EncodeJob(src, tmp_path / "local.parquet", progress=False))
    result = run_cli("encode", src, "-o", tmp_path / "out.parquet", "--artifacts", artifacts, "--engine", "ray",
                     "--ray-address", local_ray.get_runtime_context().gcs_address)
    assert_one_line_error(result, "rows.jsonl: line 2: invalid JSON", "--on-error skip")
    assert result.stderr.strip() == f"attnserve encode: error: {local_failure.value}"
    assert not (tmp_path / "out.parquet").exists()


def test_an_engine_that_cannot_open_in_an_actor_is_a_one_line_error(local_ray, artifacts_copy, tmp_path,
                                                                    monkeypatch):
    src = tmp_path / "texts.txt"
    src.write_text("hello\n")
    start_ray = ray_encode._start_ray

    def start_then_break_the_artifacts(*args):
        (artifacts_copy / "embeddings_fused.onnx").unlink()  # as on a cluster node without the file
        return start_ray(*args)

    monkeypatch.setattr(ray_encode, "_start_ray", start_then_break_the_artifacts)
    with pytest.raises(ArtifactError, match="artifact file missing: .*embeddings_fused.onnx") as failure:
        encode_file_ray(EncodeJob(src, tmp_path / "out.parquet", progress=False), EngineConfig(), artifacts_copy)
    assert "\n" not in str(failure.value) and not (tmp_path / "out.parquet").exists()


class FakeRay:
    def __init__(self, cpus: int):
        self.cpus = cpus

    def cluster_resources(self) -> dict:
        return {"CPU": float(self.cpus)}


@pytest.mark.parametrize("cpus, threads, ray_actors, chunks, expected", [
    (2, 0, None, 1, (1, 2, 2)),  # one actor with every core, as the local engine
    (16, 0, None, 100, (8, 2, 2)),  # an actor per THREADS_PER_ACTOR cores
    (16, 0, None, 3, (3, 5, 5)),  # fewer chunks than that: an actor per chunk, with more threads
    (2, 0, 3, 9, (3, 1, 2 / 3)),  # more actors than cores: they share them rather than wait for them
    (8, 1, None, 9, (8, 1, 1)),  # --threads 1: an actor per core
    (8, 0, 2, 9, (2, 4, 4)),  # --ray-actors 2: the cores shared between them
])
def test_actor_plan(cpus, threads, ray_actors, chunks, expected):
    assert _plan_actors(FakeRay(cpus), EngineConfig(threads=threads), ray_actors, chunks) == expected


def test_an_error_raised_in_the_read_task_is_found_under_rays_wrapper():
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'attnserve[ray]'")
    from ray.exceptions import RayTaskError

    original = InvalidInputError("rows.jsonl: not UTF-8 text (invalid start byte at byte 6)")
    wrapped = RayTaskError("ReadReadChunks", "Traceback ...", original).as_instanceof_cause()
    assert isinstance(wrapped, InvalidInputError)  # a wrapper of the same class, whose message is a traceback
    assert _attnserve_cause(wrapped) is original
    assert _attnserve_cause(RayTaskError("submit", "Traceback ...", KeyError(2)).as_instanceof_cause()) is None


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(AttnserveError, match=r"--engine ray needs the ray extra: pip install 'attnserve\[ray\]'"):
        _import_ray()


def test_ray_actors_must_be_positive(artifacts, tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'attnserve[ray]'")
    (tmp_path / "in.txt").write_text("hello\n")
    with pytest.raises(ConfigError, match="--ray-actors must be positive, got 0"):
        encode_file_ray(EncodeJob(tmp_path / "in.txt", tmp_path / "o.parquet"), EngineConfig(), artifacts,
                        ray_actors=0)


def test_hostile_rows_are_set_aside_as_the_local_engine_sets_them_aside(local_ray, artifacts, engine, tmp_path):
    src = tmp_path / "rows.jsonl"
    hostile_jsonl(src)
    assert_same_output(*_both(artifacts, engine, src, tmp_path, on_error="skip", chunk_rows=10))
    assert (tmp_path / "ray.errors.jsonl").read_bytes() == (tmp_path / "local.errors.jsonl").read_bytes()
    with pytest.raises(InvalidInputError, match=r"rows.jsonl: line 2: invalid JSON: nested too deeply"):
        encode_file_ray(EncodeJob(src, tmp_path / "failed.parquet", progress=False), EngineConfig(), artifacts)


def test_a_run_on_a_terminal_leaves_no_escape_code_behind(artifacts, tmp_path):
    """Starting a local Ray imports its CLI logger, which runs colorama.init(): its exit hook wrote ESC [0m to
    the terminal after the summary line. The command starts its own Ray here, as a user's does (about 5 s)."""
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'attnserve[ray]'")
    src = tmp_path / "texts.txt"
    src.write_text("one text\nanother\n")
    returncode, terminal, _ = on_a_terminal(
        [sys.executable, "-m", "attnserve.cli", "encode", str(src), "-o", str(tmp_path / "o.parquet"), "--artifacts",
         str(artifacts), "--no-progress", "--engine", "ray"], stdout_too=True, env={**os.environ, "RAY_ADDRESS": ""})
    assert returncode == 0, terminal
    assert terminal.startswith(b"encoded 2 texts, ") and terminal.endswith(b"o.parquet\r\n"), terminal
    assert b"\x1b" not in terminal


def test_late_chunking_on_ray_writes_the_local_bytes(local_ray, artifacts, engine, tmp_path):
    """One row per chunk (tests/test_long_inputs.py checks them against transformers), the same on the actors."""
    from attnserve.offline.rows import LateChunks

    rows = [{"id": 1, "text": " ".join(f"Sentence {i} of a long text." for i in range(90))},
            {"id": 2, "token_ids": [101, 2023, 102]}, {"id": 3, "text": "Short. Two sentences."}]
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    job = dict(progress=False, on_error="skip", late_chunking=LateChunks("tokens", 50), chunk_rows=2)
    local, remote = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    encode_file(engine, EncodeJob(src, local, **job))
    stats = encode_file_ray(EncodeJob(src, remote, **job), EngineConfig(), artifacts)
    assert stats.texts == 2 and stats.skipped == 1
    assert_same_output(local, remote)
    table = pq.read_table(remote)
    assert table.column_names == ["id", "chunk", "start", "stop", "embedding", "num_tokens"]
    assert set(table.column("num_tokens").to_pylist()[:-2]) == {50}
