"""`attnserve encode --server`: the same output as the local path, through a real `attnserve serve` over EmbedStream.

The local side runs offline.encode.encode_file in this process (what `attnserve encode` runs); the remote side is
the real command in a subprocess against the shared server fixture. Server failures that a healthy server does not
produce on demand (a full queue, a refused input, a dropped stream) come from a small in-process proxy in front of
the real server that forwards each request and fails the ones it is told to.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.rpc import status_pb2
from grpc_status import rpc_status

from attnserve.client.client import CHANNEL_OPTIONS
from attnserve.config import ClientConfig
from attnserve.errors import AttnserveError, InvalidInputError
from attnserve.offline import job as job_module
from attnserve.offline import remote
from attnserve.offline.encode import encode_file, read_embeddings
from attnserve.offline.job import EncodeJob
from attnserve.server.grpc.status import detailed_status
from attnserve.v1 import encoder_pb2_grpc

from .conftest import VARIED_TEXTS, assert_one_line_error, run_cli
from .offline_helpers import RecordedProgress, on_a_terminal
from .serving import free_port
from .test_server_load import mixed_texts

TOLERANCE = 1e-5  # the server batches inputs differently from the local path; floats differ in the last bits


def local_encode(engine, src: Path, out: Path, **options) -> pa.Table:
    encode_file(engine, EncodeJob(src, out, progress=False, **options))
    return pq.read_table(out)


def remote_cli(server_target: str, src: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    result = run_cli("encode", src, "-o", out, "--server", server_target, "--no-progress", *extra)
    assert result.returncode == 0, result.stderr
    return result


def assert_same_output(remote_path: Path, local: pa.Table, target: str) -> None:
    got = pq.read_table(remote_path)
    assert got.schema.equals(local.schema, check_metadata=False)
    for column in ("id", "num_tokens", "truncated"):
        assert got.column(column).to_pylist() == local.column(column).to_pylist(), column
    assert np.abs(read_embeddings(remote_path) - read_embeddings_of(local)).max() <= TOLERANCE
    meta, local_meta = (json.loads(t.schema.metadata[b"attnserve"]) for t in (got, local))
    assert meta == {**local_meta, "server": target}  # model, precision, pooling, normalize, input: as local
    assert not list(remote_path.parent.glob(".*partial")) and not list(remote_path.parent.glob(".*parts"))


def read_embeddings_of(table: pa.Table) -> np.ndarray:
    return table.column("embedding").combine_chunks().values.to_numpy().reshape(len(table), -1)


def test_txt_through_the_server_equals_local_encode(server, engine, tmp_path):
    texts = VARIED_TEXTS + mixed_texts(60, seed=7)  # unicode, truncated texts, mixed lengths
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    local = local_encode(engine, src, tmp_path / "local.parquet")
    result = remote_cli(server.target, src, tmp_path / "remote.parquet", "--chunk-rows", "20")
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"encoded {len(texts)} texts, {sum(local.column('num_tokens').to_pylist())} tokens")
    assert summary.endswith(f"-> {tmp_path / 'remote.parquet'}")
    assert_same_output(tmp_path / "remote.parquet", local, server.target)
    assert local.column("truncated").to_pylist()[6:8] == [True, True]


def test_jsonl_with_ids_token_ids_and_no_normalize(server, engine, tmp_path):
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(mixed_texts(30, seed=8))]
    rows[3] = {"id": "r3", "token_ids": [101, 7592, 2088, 102]}
    rows[17] = {"id": "r17", "token_ids": [101] + [2088] * 400 + [102]}  # over max_seq_length: cut and marked
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    local = local_encode(engine, src, tmp_path / "local.parquet", normalize=False, chunk_rows=16)
    remote_cli(server.target, src, tmp_path / "remote.parquet", "--no-normalize", "--chunk-rows", "16")
    assert_same_output(tmp_path / "remote.parquet", local, server.target)
    assert local.column("truncated").to_pylist()[17] is True


def test_parquet_with_a_chosen_text_column(server, engine, tmp_path):
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(60)]
    pq.write_table(pa.table({"body": texts, "id": list(range(100, 160))}), tmp_path / "in.parquet")
    local = local_encode(engine, tmp_path / "in.parquet", tmp_path / "local.parquet", text_column="body",
                         chunk_rows=16)
    remote_cli(server.target, tmp_path / "in.parquet", tmp_path / "remote.parquet", "--text-column", "body",
               "--chunk-rows", "16")  # several chunks in flight at once: order must hold across them
    assert_same_output(tmp_path / "remote.parquet", local, server.target)
    assert pq.ParquetFile(tmp_path / "remote.parquet").metadata.num_row_groups == 4  # a row group per chunk


def test_empty_text_line_is_one_line_naming_it(server, tmp_path):
    (tmp_path / "in.txt").write_text("good\n\nafter a blank line\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--server", server.target)
    assert_one_line_error(result, "in.txt: line 2: empty text")
    assert not (tmp_path / "o.parquet").exists()


def test_unreachable_server_is_one_line(tmp_path):
    (tmp_path / "in.txt").write_text("hello\n")
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--server", target)
    assert_one_line_error(result, f"no attnserve server at {target} (start one with `attnserve serve`)",
                          "the same command resumes")
    assert not (tmp_path / "o.parquet").exists()


def test_progress_bar_on_a_terminal_and_the_summary_line(server, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(40, seed=9)) + "\n")
    returncode, terminal, stdout = on_a_terminal(
        [sys.executable, "-m", "attnserve.cli", "encode", str(src), "-o", str(tmp_path / "o.parquet"), "--server",
         server.target, "--chunk-rows", "20"])
    assert returncode == 0, terminal.decode(errors="replace")
    assert b"encode: 100%" in terminal and b"40/40" in terminal
    assert stdout.strip().startswith("encoded 40 texts, ") and "tokens/s" in stdout


# --- failures a healthy server does not produce on demand: a proxy in front of the real server -------------------


# The server's own builder of statuses with details, for the failures the proxy fakes.
error_status = detailed_status


def queue_full(index: int, retry_delay: float | None = None):
    return error_status(grpc.StatusCode.RESOURCE_EXHAUSTED, f"request {index}: queue full: 65000 of 65536 tokens "
                        "waiting", "QUEUE_FULL", index, retry_delay=retry_delay)


class Proxy(encoder_pb2_grpc.EncoderServicer):
    """Forwards each request of a stream as one Embed to the real server; fail(stream, index, request) may
    return a status (error_status) to end the stream there instead, as the real server ends it."""

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

    def close(self):
        self._server.stop(0)
        self._channel.close()


@pytest.fixture
def proxy_factory(server):
    proxies = []

    def make(fail=None) -> Proxy:
        proxies.append(Proxy(server.target, fail))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def remote_job(src: Path, out: Path, **options) -> EncodeJob:
    return EncodeJob(src, out, progress=False, **options)


@pytest.fixture
def small_requests(monkeypatch):
    """Requests of 8 inputs and a window of 4, so that a file of a few dozen rows makes several of each."""
    monkeypatch.setattr(remote, "REQUEST_INPUTS", 8)
    monkeypatch.setattr(remote, "WINDOW_REQUESTS", 4)
    monkeypatch.setattr(remote, "BACKOFF_SECONDS", 0.01)


def test_a_full_queue_is_retried_from_the_same_position_without_losing_or_repeating_rows(
        proxy_factory, engine, small_requests, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(40, seed=10)) + "\n")
    local = local_encode(engine, src, tmp_path / "local.parquet", chunk_rows=25)

    def fail(stream, index, request):  # stream 0 fails at request 3, stream 1 at once, then none
        if (stream, index) in ((0, 3), (1, 0)):
            return queue_full(index)

    proxy = proxy_factory(fail)
    stats = remote.encode_file_remote(remote_job(src, tmp_path / "remote.parquet", chunk_rows=25),
                                      ClientConfig(target=proxy.target))
    assert_same_output(tmp_path / "remote.parquet", local, proxy.target)
    assert len(proxy.streams) == 3 and len(proxy.streams[0]) == 3 and proxy.streams[1] == []
    assert sum(map(sum, proxy.streams)) == 40  # every row answered exactly once
    assert stats.texts == 40 and stats.tokens == sum(local.column("num_tokens").to_pylist())


def test_the_servers_retry_delay_is_waited_for(proxy_factory, small_requests, tmp_path, monkeypatch):
    (tmp_path / "in.txt").write_text("one\ntwo\n")
    slept = []
    monkeypatch.setattr(remote.time, "sleep", slept.append)
    proxy = proxy_factory(lambda stream, index, request: queue_full(index, retry_delay=1.5) if stream == 0 else None)
    remote.encode_file_remote(remote_job(tmp_path / "in.txt", tmp_path / "o.parquet"),
                              ClientConfig(target=proxy.target))
    assert slept == [1.5]  # RetryInfo's delay, longer than our own first backoff (0.01 s here)
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 2


def details_left_out(index):
    """grpc's own size limit, or a proxy's, carries no reason: only the server's QUEUE_FULL is retried."""
    return rpc_status.to_status(status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                                  message=f"request {index}: queue full"))


@pytest.mark.parametrize("failure, message, streams", [
    (queue_full, r"is overloaded; gave up after 5 retries: request 0: queue full: .*; the same command resumes$",
     remote.RETRIES + 1),
    (lambda index: error_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "Received message larger than max (5000000 vs. "
                                "4194304)", "MESSAGE_TOO_LARGE", index),
     r"refused a request of 3 rows from line \d on as too large", 1),
    (details_left_out, "RESOURCE_EXHAUSTED: request 0: queue full$", 1),
    (lambda index: error_status(grpc.StatusCode.INVALID_ARGUMENT, f"request {index}: pooling 7 is not known",
                                "INVALID_INPUT", index, field="pooling", description="pooling 7 is not known"),
     r"refused a request of 3 rows from line \d on: pooling 7 is not known$", 1),
], ids=["queue full for good", "message too large", "no details", "request refused"])
def test_a_refusal_that_retrying_cannot_cure_is_one_line(proxy_factory, small_requests, tmp_path, failure, message,
                                                         streams):
    (tmp_path / "in.txt").write_text("one\ntwo\nthree\n")
    proxy = proxy_factory(lambda stream, index, request: failure(index))
    with pytest.raises(AttnserveError, match=message):
        remote.encode_file_remote(remote_job(tmp_path / "in.txt", tmp_path / "o.parquet"),
                                  ClientConfig(target=proxy.target))
    assert len(proxy.streams) == streams and not (tmp_path / "o.parquet").exists()


@pytest.fixture
def no_client_checks(monkeypatch):
    """Rows the client would catch go to the server, as rows only the server can judge would."""
    monkeypatch.setattr(job_module.RowChecks, "error", lambda self, record: None)


def test_an_input_the_real_server_refuses_is_named_by_its_line(server, no_client_checks, small_requests, tmp_path):
    """By the server's structured error details (ErrorInfo, BadRequest), in the fourth request of 8 rows."""
    src = tmp_path / "in.txt"
    src.write_text("".join(f"text number {i}\n" for i in range(30)) + "   \n" + "the last one\n")
    with pytest.raises(InvalidInputError) as error:
        remote.encode_file_remote(remote_job(src, tmp_path / "o.parquet", chunk_rows=8),
                                  ClientConfig(target=server.target))
    assert str(error.value) == f"{src}: line 31: empty text (--on-error skip sets such rows aside)"


def test_skip_sets_a_refused_input_aside_and_keeps_the_rest(server, engine, no_client_checks, small_requests,
                                                            tmp_path):
    lines = mixed_texts(30, seed=11)
    lines[5], lines[22] = "", "  "
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o.parquet"
    stats = remote.encode_file_remote(remote_job(src, out, chunk_rows=10, on_error="skip"),
                                      ClientConfig(target=server.target))
    assert stats.skipped == 2 and stats.texts == 28
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [i for i in range(30) if i not in (5, 22)]
    expected = engine.encode([t for i, t in enumerate(lines) if i not in (5, 22)]).embeddings
    assert np.abs(read_embeddings(out) - expected).max() <= TOLERANCE
    errors = [json.loads(line) for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert [(e["line"], e["reason"]) for e in errors] == [(6, "empty text"), (23, "empty text")]


def test_a_run_cut_off_by_a_draining_server_resumes_after_its_written_chunks(proxy_factory, engine, small_requests,
                                                                            tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(48, seed=12)) + "\n")
    local = local_encode(engine, src, tmp_path / "local.parquet", chunk_rows=16)
    cut = {"on": True}

    def drain(stream, index, request):  # the replica goes away after 3 replies
        if cut["on"] and index == 3:
            return error_status(grpc.StatusCode.UNAVAILABLE, "the server is shutting down; reopen the stream on "
                                "another replica", "SHUTTING_DOWN", index)

    proxy = proxy_factory(drain)
    out = tmp_path / "remote.parquet"
    with pytest.raises(AttnserveError, match="is shutting down; the same command resumes$"):
        remote.encode_file_remote(remote_job(src, out, chunk_rows=16), ClientConfig(target=proxy.target))
    progress = json.loads((tmp_path / ".remote.parquet.parts" / "progress.json").read_text())
    assert len(progress["chunks"]) == 1 and not out.exists()  # 3 requests of 8: the first chunk of 16 is written
    cut["on"] = False
    stats = remote.encode_file_remote(remote_job(src, out, chunk_rows=16), ClientConfig(target=proxy.target))
    assert stats.resumed_rows == 16 and stats.texts == 32
    assert_same_output(out, local, proxy.target)


def test_progress_moves_per_reply(proxy_factory, small_requests, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(mixed_texts(40, seed=13)) + "\n")
    proxy = proxy_factory()
    progress = RecordedProgress()
    remote.encode_file_remote(remote_job(src, tmp_path / "o.parquet", chunk_rows=20),
                              ClientConfig(target=proxy.target), progress=progress)
    answered = [n for stream in proxy.streams for n in stream]
    assert progress.total == 40 and progress.steps == answered and len(answered) >= 5  # one step per reply
