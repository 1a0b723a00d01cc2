"""The job driver's other encoders against the local engine: through a real `attnserve serve` (EmbedStream) within
float noise, and on a real local Ray byte for byte. Failures a healthy server does not produce on demand (a full
queue, a refused input, a dropped stream) come from a small in-process proxy in front of the real server."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.rpc import status_pb2
from grpc_status import rpc_status

from attnserve.client.client import CHANNEL_OPTIONS
from attnserve.config import ClientConfig, EngineConfig
from attnserve.engine.batching import plan_batches
from attnserve.engine.engine import Engine
from attnserve.errors import ArtifactError, AttnserveError, ConfigError, InvalidInputError
from attnserve.offline import job as job_module
from attnserve.offline import ray_encode, remote
from attnserve.offline.encode import encode_file, read_embeddings
from attnserve.offline.job import EncodeJob
from attnserve.offline.ray_encode import _attnserve_cause, _import_ray, _plan_actors, encode_file_ray
from attnserve.offline.rows import LateChunks, Prompt
from attnserve.server.grpc.status import detailed_status
from attnserve.v1 import encoder_pb2_grpc

from . import offline_helpers
from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from .offline_helpers import BAD_JSONL, RecordedProgress, errors_of, hostile_jsonl, on_a_terminal, text_file
from .test_server_load import mixed_texts

TOLERANCE = 1e-5  # the server batches inputs otherwise than the local path; floats differ in the last bits
NO_RAY = "the ray extra is not installed: pip install 'attnserve[ray]'"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (about 5 s): encode_file_ray joins it and leaves it running."""
    pytest.importorskip("ray", reason=NO_RAY)
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def engine(artifacts):
    """The local engine on the graph every Ray actor runs, the default one (offline/ray_encode.py), rather than the
    one calibration times fastest here: on a loaded machine that can be the other fp32 graph, whose bits differ."""
    from attnserve.engine.engine import embeddings_graph
    from attnserve.engine.manifest import load_manifest

    graph = embeddings_graph(load_manifest(artifacts), EngineConfig())[2]
    return Engine.from_directory(artifacts, EngineConfig(graph=graph.name))


class Driver(NamedTuple):
    """An encoder other than this process's engine: its name, the job's runner, the server it goes through."""

    name: str
    run: Callable  # (job, **the driver's keywords) -> its totals
    target: str | None = None

    def encode(self, src: Path, out: Path, progress=None, **options):
        return self.run(EncodeJob(src, out, progress=False, **options), progress=progress)


def on_ray(artifacts, **options) -> Driver:
    return Driver("ray", lambda job, **kw: encode_file_ray(job, EngineConfig(), artifacts, **options, **kw))


def through(target: str) -> Driver:
    return Driver("server", lambda job, **kw: remote.encode_file_remote(job, ClientConfig(target=target), **kw), target)


@pytest.fixture(params=["server", "ray"])
def driver(request, artifacts) -> Driver:
    if request.param == "server":
        return through(request.getfixturevalue("server").target)
    request.getfixturevalue("local_ray")
    return on_ray(artifacts)


def both(engine, driver: Driver, src: Path, tmp_path: Path, **options):
    """The same job locally and through the driver, their rows held equal: (local output, other output, its stats)."""
    local, other = tmp_path / "local.parquet", tmp_path / f"{driver.name}.parquet"
    encode_file(engine, EncodeJob(src, local, progress=False, **options))
    stats = driver.run(EncodeJob(src, other, progress=False, **options))
    want, got = pq.read_table(local), pq.read_table(other)
    assert stats.texts + stats.resumed_rows == len(set(got.column("id").to_pylist()))  # rows of a text, or its chunks
    if driver.name == "ray":
        assert got.schema.equals(want.schema, check_metadata=True) and other.read_bytes() == local.read_bytes()
    else:
        assert got.schema.equals(want.schema, check_metadata=False)
        for column in ("id", "num_tokens", "truncated"):
            assert got.column(column).to_pylist() == want.column(column).to_pylist(), column
        assert not got.num_rows or np.abs(read_embeddings(other) - read_embeddings(local)).max() <= TOLERANCE
        meta, local_meta = (json.loads(t.schema.metadata[b"attnserve"]) for t in (got, want))
        assert meta == {**local_meta, "server": driver.target}  # model, precision, pooling, normalize, input: as local
    assert not list(other.parent.glob(".*partial")) and not list(other.parent.glob(".*parts"))
    return local, other, stats


def _input(tmp_path: Path, case: str) -> tuple[Path, dict]:
    """(the input file, the job's options) of a case."""
    if case in ("txt", "txt cut, with a prompt"):
        texts = VARIED_TEXTS + mixed_texts(60, seed=7)  # unicode, truncated texts, mixed lengths
        options = {"chunk_rows": 20} if case == "txt" else {"dimensions": 32, "prompt": Prompt(text="query: ")}
        return text_file(tmp_path / "texts.txt", texts), options
    if case == "jsonl":
        rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(mixed_texts(30, seed=8))]
        rows[3] = {"id": "r3", "token_ids": [101, 7592, 2088, 102]}
        rows[17] = {"id": "r17", "token_ids": [101] + [2088] * 400 + [102]}  # over max_seq_length: cut and marked
        return text_file(tmp_path / "rows.jsonl", map(json.dumps, rows)), {"normalize": False, "chunk_rows": 16}
    if case == "parquet":
        texts = [f"document number {i} " * (i % 7 + 1) for i in range(60)]
        pq.write_table(pa.table({"body": texts, "id": list(range(100, 160))}), tmp_path / "in.parquet")
        return tmp_path / "in.parquet", {"text_column": "body", "chunk_rows": 16}
    (tmp_path / "empty.txt").write_text("")
    return tmp_path / "empty.txt", {}


@pytest.mark.parametrize("case", ["txt", "txt cut, with a prompt", "jsonl", "parquet", "empty"])
def test_each_input_gives_the_local_rows(driver, engine, tmp_path, case):
    src, options = _input(tmp_path, case)
    _, other, _ = both(engine, driver, src, tmp_path, **options)
    table = pq.read_table(other)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), options.get("dimensions", 384))
    if case.startswith("txt"):
        assert table.column("truncated").to_pylist()[:8] == [False] * 6 + [True, True]
    elif case == "jsonl":
        assert table.column("id").to_pylist()[:4] == ["r0", "r1", "r2", "r3"] and table.column("truncated")[17].as_py()
    elif case == "parquet":
        assert table.column("id").to_pylist() == list(range(100, 160))
        assert pq.ParquetFile(other).metadata.num_row_groups == 4  # a row group per chunk, several in flight
    else:
        assert table.num_rows == 0 and table.column_names == ["id", "embedding", "num_tokens", "truncated"]


@pytest.mark.parametrize("rows", ["bad", "hostile"])
def test_bad_rows_are_set_aside_as_locally(driver, engine, tmp_path, rows):
    src = tmp_path / "rows.jsonl"
    if rows == "bad":
        src.write_text(BAD_JSONL)
    else:
        hostile_jsonl(src)
    _, other, _ = both(engine, driver, src, tmp_path, on_error="skip", chunk_rows=2 if rows == "bad" else 10)
    errors = (tmp_path / f"{driver.name}.errors.jsonl").read_bytes()
    assert errors == (tmp_path / "local.errors.jsonl").read_bytes()
    assert rows == "hostile" or pq.read_table(other).column("id").to_pylist() == [10, 14]
    with pytest.raises(InvalidInputError) as local_failure:
        encode_file(engine, EncodeJob(src, tmp_path / "failed.parquet", progress=False))
    with pytest.raises(InvalidInputError) as failure:
        driver.run(EncodeJob(src, tmp_path / "failed.parquet", progress=False))
    assert str(failure.value) == str(local_failure.value)
    assert rows == "bad" or "rows.jsonl: line 2: invalid JSON: nested too deeply" in str(failure.value)


@pytest.mark.parametrize("where", ["local", "ray", "server"])
def test_progress_moves_per_engine_batch_or_per_reply(artifacts, request, tmp_path, where):
    texts = mixed_texts(60, seed=23)
    job = EncodeJob(text_file(tmp_path / "texts.txt", texts), tmp_path / "o.parquet", chunk_rows=30, progress=False)
    config = EngineConfig(max_batch_size=8)
    engine = Engine.from_directory(artifacts, config)
    progress = RecordedProgress()
    if where == "server":  # through a proxy that counts each reply's inputs
        proxy = request.getfixturevalue("proxy_factory")()
        through(proxy.target).run(job, progress=progress)
        expected = [n for stream in proxy.streams for n in stream]
        assert len(expected) >= 5
    else:
        if where == "local":
            encode_file(engine, job, progress=progress)
            budget = engine.batch_tokens  # as calibrated here
        else:
            request.getfixturevalue("local_ray")
            encode_file_ray(job, config, artifacts, ray_actors=1, progress=progress)
            # The actor runs the graph named to it and times its own batch budget (engine/calibration.py: a graph
            # forced by name keeps its own record), recorded beside the artifacts: an engine here reads it.
            actors = ray_encode.RayEncoder(config, artifacts, None, 1).config
            budget = Engine.from_directory(artifacts, actors).batch_tokens
        expected = [len(batch) for chunk in (texts[:30], texts[30:]) for batch in plan_batches(
            [len(t) for t in engine.tokenizer.encode_texts(chunk)], budget, 8)]
        assert len(expected) >= 8
    assert progress.total == 60 and progress.steps == expected and progress.closed


def test_chunks_done_out_of_order_on_two_actors_are_written_in_order(local_ray, artifacts, engine, tmp_path,
                                                                     monkeypatch):
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
    _, other, _ = both(engine, on_ray(artifacts, ray_actors=2), tmp_path / "in.parquet", tmp_path,
                       text_column="body", chunk_rows=7)
    assert written == list(range(13)) and used == {0, 1}  # both actors encoded chunks
    assert pq.read_table(other).column("id").to_pylist() == list(range(100, 190))
    assert pq.ParquetFile(other).metadata.num_row_groups == 13  # one per chunk, as locally


def test_ray_resumes_an_interrupted_local_run_with_the_same_bytes(local_ray, artifacts, engine, tmp_path,
                                                                  monkeypatch):
    src = text_file(tmp_path / "texts.txt", mixed_texts(40, seed=6))
    clean, out = tmp_path / "clean.parquet", tmp_path / "out.parquet"
    encode_file(engine, EncodeJob(src, clean, chunk_rows=8, progress=False))
    offline_helpers.interrupted_run(engine, EncodeJob(src, out, chunk_rows=8, progress=False), monkeypatch, 2)
    stats = on_ray(artifacts).encode(src, out, chunk_rows=8)
    assert (stats.resumed_rows, stats.texts) == (16, 24) and out.read_bytes() == clean.read_bytes()


def test_late_chunking_on_ray_writes_the_local_bytes(local_ray, artifacts, engine, tmp_path):
    """One row per chunk (tests/test_long_inputs.py checks them against transformers), the same on the actors."""
    rows = [{"id": 1, "text": " ".join(f"Sentence {i} of a long text." for i in range(90))},
            {"id": 2, "token_ids": [101, 2023, 102]}, {"id": 3, "text": "Short. Two sentences."}]
    src = text_file(tmp_path / "docs.jsonl", map(json.dumps, rows))
    _, other, stats = both(engine, on_ray(artifacts), src, tmp_path, on_error="skip", chunk_rows=2,
                           late_chunking=LateChunks("tokens", 50))
    table = pq.read_table(other)
    assert stats.texts == 2 and stats.skipped == 1
    assert table.column_names == ["id", "chunk", "start", "stop", "embedding", "num_tokens"]
    assert set(table.column("num_tokens").to_pylist()[:-2]) == {50}


def test_the_command_prints_its_summary_and_writes_the_local_bytes_or_names_a_bad_line(local_ray, artifacts,
                                                                                      engine, tmp_path):
    src = text_file(tmp_path / "texts.txt", mixed_texts(30, seed=7))
    encode_file(engine, EncodeJob(src, tmp_path / "local.parquet", chunk_rows=10, progress=False))
    # --ray-address: the command joins the module's Ray, as it would a cluster's, instead of starting its own.
    flags = ("--artifacts", artifacts, "--engine", "ray", "--ray-address", local_ray.get_runtime_context().gcs_address)
    result = run_cli("encode", src, "-o", tmp_path / "ray.parquet", *flags, "--no-progress", "--ray-actors", "2",
                     "--chunk-rows", "10")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("encoded 30 texts, ") and "tokens/s, padding" in result.stdout
    assert not result.stderr.strip(), result.stderr  # Ray's console chatter stays in its log files
    assert (tmp_path / "ray.parquet").read_bytes() == (tmp_path / "local.parquet").read_bytes()
    (tmp_path / "rows.jsonl").write_text(BAD_JSONL)
    with pytest.raises(InvalidInputError) as local_failure:
        encode_file(engine, EncodeJob(tmp_path / "rows.jsonl", tmp_path / "local.parquet", progress=False))
    result = run_cli("encode", tmp_path / "rows.jsonl", "-o", tmp_path / "out.parquet", *flags)
    assert_one_line_error(result, "rows.jsonl: line 2: invalid JSON", "--on-error skip")
    assert result.stderr.strip() == f"attnserve encode: error: {local_failure.value}"
    assert not (tmp_path / "out.parquet").exists()


def test_an_engine_that_cannot_open_in_an_actor_is_a_one_line_error(local_ray, artifacts_copy, tmp_path,
                                                                    monkeypatch):
    start_ray = ray_encode._start_ray

    def start_then_break_the_artifacts(*args):
        (artifacts_copy / "embeddings_fused.onnx").unlink()  # as on a cluster node without the file
        return start_ray(*args)

    monkeypatch.setattr(ray_encode, "_start_ray", start_then_break_the_artifacts)
    job = EncodeJob(text_file(tmp_path / "texts.txt", ["hello"]), tmp_path / "out.parquet", progress=False)
    with pytest.raises(ArtifactError, match="artifact file missing: .*embeddings_fused.onnx") as failure:
        encode_file_ray(job, EngineConfig(), artifacts_copy)
    assert "\n" not in str(failure.value) and not (tmp_path / "out.parquet").exists()


class SlowStartingRay:
    """Ray's start as a loaded machine gives it: the node misses Ray's 30 s `fails` times (Ray's own message), then
    starts. Records what _start_ray asked of it."""

    def __init__(self, fails: int):
        self.fails, self.calls = fails, []

    def is_initialized(self) -> bool:
        return False

    def init(self, **options) -> None:
        self.calls.append("init")
        if self.fails:
            self.fails -= 1
            raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                            "failed to startup or the GCS has become overloaded.")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_a_local_ray_that_missed_its_start_time_is_started_once_more():
    """CI saw Ray's node miss its fixed 30 s on two busy cores: the local Ray is shut down and started again, and
    a second miss is one line naming it. A cluster asked for by address is not started again."""
    once = SlowStartingRay(fails=1)
    assert ray_encode._start_ray(once, None) is True
    assert once.calls == ["init", "shutdown", "init"]
    twice = SlowStartingRay(fails=2)
    with pytest.raises(ConfigError, match=r"^a local Ray did not start \(twice\): The current node timed out") as e:
        ray_encode._start_ray(twice, None)
    assert "\n" not in str(e.value) and twice.calls == ["init", "shutdown", "init", "shutdown"]
    joined = SlowStartingRay(fails=1)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_encode._start_ray(joined, "ray://cluster:10001")
    assert joined.calls == ["init"]


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
    pytest.importorskip("ray", reason=NO_RAY)
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
    pytest.importorskip("ray", reason=NO_RAY)
    with pytest.raises(ConfigError, match="--ray-actors must be positive, got 0"):
        encode_file_ray(EncodeJob(text_file(tmp_path / "in.txt", ["hello"]), tmp_path / "o.parquet"), EngineConfig(),
                        artifacts, ray_actors=0)


def test_a_run_on_a_terminal_leaves_no_escape_code_behind(artifacts, tmp_path):
    """Starting a local Ray imports its CLI logger, which runs colorama.init(): its exit hook wrote ESC [0m to
    the terminal after the summary line. The command starts its own Ray here, as a user's does (about 5 s)."""
    pytest.importorskip("ray", reason=NO_RAY)
    src = text_file(tmp_path / "texts.txt", ["one text", "another"])
    returncode, terminal, _ = on_a_terminal(
        [sys.executable, "-m", "attnserve.cli", "encode", str(src), "-o", str(tmp_path / "o.parquet"), "--artifacts",
         str(artifacts), "--no-progress", "--engine", "ray"], stdout_too=True, env={**os.environ, "RAY_ADDRESS": ""})
    assert returncode == 0, terminal
    assert terminal.startswith(b"encoded 2 texts, ") and terminal.endswith(b"o.parquet\r\n"), terminal
    assert b"\x1b" not in terminal


def test_the_command_through_a_server_shows_a_bar_on_a_terminal_and_its_summary_line(server, engine, tmp_path):
    texts = mixed_texts(40, seed=9)
    src, out = text_file(tmp_path / "texts.txt", texts), tmp_path / "o.parquet"
    returncode, terminal, stdout = on_a_terminal([sys.executable, "-m", "attnserve.cli", "encode", str(src), "-o",
                                                  str(out), "--server", server.target, "--chunk-rows", "20"])
    assert returncode == 0, terminal.decode(errors="replace")
    assert b"encode: 100%" in terminal and b"40/40" in terminal
    summary = stdout.strip().splitlines()[-1]
    assert summary.startswith(f"encoded 40 texts, {engine.encode(texts).num_tokens.sum()} tokens")
    assert "tokens/s" in summary and summary.endswith(f"-> {out}")


def queue_full(index: int, retry_delay: float | None = None):
    return detailed_status(grpc.StatusCode.RESOURCE_EXHAUSTED, f"request {index}: queue full: 65000 of 65536 tokens "
                           "waiting", "QUEUE_FULL", index, retry_delay=retry_delay)


class Proxy(encoder_pb2_grpc.EncoderServicer):
    """Forwards each request of a stream as one Embed to the real server; fail(stream, index, request) may
    return a status (detailed_status, the server's own builder) to end the stream there, as the server ends it."""

    def __init__(self, upstream: str, fail=None):
        self.fail = fail or (lambda stream, index, request: None)
        self.streams: list[list[int]] = []  # inputs per answered request, per stream
        self._channel = grpc.insecure_channel(upstream, CHANNEL_OPTIONS)
        self._stub = encoder_pb2_grpc.EncoderStub(self._channel)
        self._server = grpc.server(ThreadPoolExecutor(4), options=CHANNEL_OPTIONS)
        encoder_pb2_grpc.add_EncoderServicer_to_server(self, self._server)
        self.target = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def GetModelInfo(self, request, context):
        return self._stub.GetModelInfo(request, timeout=30)

    def EmbedStream(self, requests, context):
        answered: list[int] = []
        self.streams.append(answered)
        for index, request in enumerate(requests):
            failure = self.fail(len(self.streams) - 1, index, request)
            if failure:
                context.abort_with_status(failure)
            answered.append(len(request.inputs))
            yield self._stub.Embed(request, timeout=30)

    def encode(self, *args, **options):
        return through(self.target).encode(*args, **options)

    def close(self):
        self._server.stop(0)
        self._channel.close()


@pytest.fixture
def small_requests(monkeypatch):
    """Requests of 8 inputs and a window of 4, so that a file of a few dozen rows makes several of each."""
    monkeypatch.setattr(remote, "REQUEST_INPUTS", 8)
    monkeypatch.setattr(remote, "WINDOW_REQUESTS", 4)
    monkeypatch.setattr(remote, "BACKOFF_SECONDS", 0.01)


@pytest.fixture
def proxy_factory(server, small_requests):
    proxies = []

    def make(fail=None) -> Proxy:
        proxies.append(Proxy(server.target, fail))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def test_a_full_queue_is_retried_from_the_same_position_without_losing_or_repeating_rows(proxy_factory, engine,
                                                                                        tmp_path):
    src = text_file(tmp_path / "texts.txt", mixed_texts(40, seed=10))
    proxy = proxy_factory(lambda stream, index, request: queue_full(index) if (stream, index) in ((0, 3), (1, 0))
                          else None)  # stream 0 fails at request 3, stream 1 at once, then none
    _, _, stats = both(engine, through(proxy.target), src, tmp_path, chunk_rows=25)
    assert len(proxy.streams) == 3 and len(proxy.streams[0]) == 3 and proxy.streams[1] == []
    assert sum(map(sum, proxy.streams)) == 40  # every row answered exactly once
    assert stats.tokens == sum(pq.read_table(tmp_path / "local.parquet").column("num_tokens").to_pylist())


def test_the_servers_retry_delay_is_waited_for(proxy_factory, tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(remote.time, "sleep", slept.append)
    proxy = proxy_factory(lambda stream, index, request: queue_full(index, retry_delay=1.5) if stream == 0 else None)
    proxy.encode(text_file(tmp_path / "in.txt", ["one", "two"]), tmp_path / "o.parquet")
    assert slept == [1.5]  # RetryInfo's delay, longer than our own first backoff (0.01 s here)
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 2


def details_left_out(index):
    """grpc's own size limit, or a proxy's, carries no reason: only the server's QUEUE_FULL is retried."""
    return rpc_status.to_status(status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                                  message=f"request {index}: queue full"))


@pytest.mark.parametrize("failure, message, streams", [
    (queue_full, r"is overloaded; gave up after 5 retries: request 0: queue full: .*; the same command resumes$",
     remote.RETRIES + 1),
    (lambda index: detailed_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (5000000 "
                                   "vs. 4194304)", "MESSAGE_TOO_LARGE", index),
     r"refused a request of 3 rows from line \d on as too large", 1),
    (details_left_out, "RESOURCE_EXHAUSTED: request 0: queue full$", 1),
    (lambda index: detailed_status(grpc.StatusCode.INVALID_ARGUMENT, f"request {index}: pooling 7 is not known",
                                   "INVALID_INPUT", index, field="pooling", description="pooling 7 is not known"),
     r"refused a request of 3 rows from line \d on: pooling 7 is not known$", 1),
], ids=["queue full for good", "message too large", "no details", "request refused"])
def test_a_refusal_that_retrying_cannot_cure_is_one_line(proxy_factory, tmp_path, failure, message, streams):
    proxy = proxy_factory(lambda stream, index, request: failure(index))
    with pytest.raises(AttnserveError, match=message):
        proxy.encode(text_file(tmp_path / "in.txt", ["one", "two", "three"]), tmp_path / "o.parquet")
    assert len(proxy.streams) == streams and not (tmp_path / "o.parquet").exists()


def test_inputs_the_real_server_refuses_are_named_by_line_or_set_aside(server, engine, small_requests, tmp_path,
                                                                       monkeypatch):
    """By the server's structured error details (ErrorInfo, BadRequest): rows the client would catch go to the
    server, as rows only the server can judge would."""
    monkeypatch.setattr(job_module.RowChecks, "error", lambda self, record: None)
    direct = through(server.target).encode
    src = text_file(tmp_path / "in.txt", [f"text number {i}" for i in range(30)] + ["   ", "the last one"])
    with pytest.raises(InvalidInputError) as error:  # in the fourth request of 8 rows
        direct(src, tmp_path / "o.parquet", chunk_rows=8)
    assert str(error.value) == f"{src}: line 31: empty text (--on-error skip sets such rows aside)"
    lines = mixed_texts(30, seed=11)
    lines[5], lines[22] = "", "  "
    stats = direct(text_file(src, lines), tmp_path / "kept.parquet", chunk_rows=10, on_error="skip")
    assert stats.skipped == 2 and stats.texts == 28
    kept = [i for i in range(30) if i not in (5, 22)]
    assert pq.read_table(tmp_path / "kept.parquet").column("id").to_pylist() == kept
    expected = engine.encode([lines[i] for i in kept]).embeddings
    assert np.abs(read_embeddings(tmp_path / "kept.parquet") - expected).max() <= TOLERANCE
    assert [(e["line"], e["reason"]) for e in errors_of(tmp_path / "kept.errors.jsonl")] == [(6, "empty text"),
                                                                                          (23, "empty text")]


def test_a_run_cut_off_by_a_draining_server_resumes_after_its_written_chunks(proxy_factory, engine, tmp_path):
    src = text_file(tmp_path / "texts.txt", mixed_texts(48, seed=12))
    cut = {"on": True}

    def drain(stream, index, request):  # the replica goes away after 3 replies
        if cut["on"] and index == 3:
            return detailed_status(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; reopen the stream on "
                                   "another replica", "SHUTTING_DOWN", index)

    proxy = proxy_factory(drain)
    with pytest.raises(AttnserveError, match="is shutting down; the same command resumes$"):
        proxy.encode(src, tmp_path / "server.parquet", chunk_rows=16)
    progress = json.loads((tmp_path / ".server.parquet.parts" / "progress.json").read_text())
    assert len(progress["chunks"]) == 1 and not (tmp_path / "server.parquet").exists()  # 3 requests of 8: a chunk
    cut["on"] = False
    _, _, stats = both(engine, through(proxy.target), src, tmp_path, chunk_rows=16)
    assert stats.resumed_rows == 16 and stats.texts == 32
