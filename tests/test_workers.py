"""`attnserve serve --workers N` (server/workers/): front-door processes on shared ports in front of one engine
process. The answers are one process's, every worker serves, the one queue decides admission, the metrics count
every worker's requests, and no request goes unanswered when a worker or the engine is killed, or on a drain."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from attnserve.client import error_details
from attnserve.client.client import make_request
from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, serving

TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog, twice over.", "Hello world",
         "Attention is all you need, and a key-padding mask."]
# A call whose worker or engine is killed under it ends UNAVAILABLE (the connection reset, or the worker's engine
# gone); never in silence (every call has a timeout and must end before it).
ENDED = {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
KEY = "k-" + "7" * 20
AUTH = (("authorization", f"Bearer {KEY}"),)


def workers_of(server: ServerProcess, count: int, timeout: float = 60) -> list[int]:
    """The pids of the server's `count` workers, once each serves."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        tasks = Path(f"/proc/{server.process.pid}/task")
        pids = [int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()]
        if len(pids) == count and server.log_tail(400).count('"worker_serving"') >= count:
            return pids
        time.sleep(0.2)
    raise AssertionError(f"{count} workers did not start: {server.log_tail()}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def embed(server: ServerProcess, texts: list[str], metadata=None, int8: bool = False, **options) -> pb.EmbedResponse:
    request = make_request(texts, truncate=True, **options)
    if int8:
        request.embedding_type = pb.EMBEDDING_TYPE_INT8
    with server.channel() as channel:
        return server.stub(channel).Embed(request, timeout=60, metadata=metadata)


def rows(reply: pb.EmbedResponse, field: str = "sentence_embedding", dtype: str = "<f4") -> list[np.ndarray]:
    return [np.frombuffer(getattr(e, field).data, dtype) for e in reply.embeddings]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def two_workers(artifacts, tmp_path_factory):
    process = ServerProcess(artifacts, "--workers", "2", log_path=tmp_path_factory.mktemp("workers") / "server.log")
    with serving(process):
        workers_of(process, 2)
        yield process


@pytest.fixture(scope="module")
def guarded_workers(artifacts, tmp_path_factory):
    """Two workers behind an API key and one queue of 256 tokens."""
    process = ServerProcess(artifacts, "--workers", "2", "--api-key", KEY, "--max-queue-tokens", "256",
                            "--max-wait-ms", "50", log_path=tmp_path_factory.mktemp("guarded") / "server.log")
    with serving(process):
        workers_of(process, 2)
        yield process


def test_two_workers_answer_as_one_process_does(two_workers, server):
    """Token embeddings and attention maps cross the link as raw frames; int8 needs the model's calibrated ranges,
    which a worker asks the engine process for from its thread pool."""
    one, two = embed(server, TEXTS, token_embeddings=True), embed(two_workers, TEXTS, token_embeddings=True)
    for a, b in zip(one.embeddings, two.embeddings, strict=True):
        assert (a.num_tokens, a.truncated) == (b.num_tokens, b.truncated)
    for field in ("sentence_embedding", "token_embeddings"):
        np.testing.assert_allclose(np.concatenate(rows(two, field)), np.concatenate(rows(one, field)), atol=2e-5)
    one, two = (rows(embed(s, TEXTS[:2], attention_layers=[0, -1]), "attentions") for s in (server, two_workers))
    for a, b in zip(one, two, strict=True):
        assert a.size > 0
        np.testing.assert_allclose(b, a, atol=2e-5)  # every layer and head, as one process gives them
    one, two = (np.stack(rows(embed(s, TEXTS, int8=True), dtype=np.int8)).astype(int)
                for s in (server, two_workers))
    assert np.abs(two - one).max() <= 1  # a rounding step at most


def test_the_http_door_of_the_workers_answers_openais_and_teis_clients(two_workers):
    import openai
    from tei_client import HttpClient

    want = np.stack(rows(embed(two_workers, TEXTS)))
    with openai.OpenAI(base_url=f"{two_workers.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        got = client.embeddings.create(input=TEXTS, model="sentence-transformers/all-MiniLM-L6-v2")
    np.testing.assert_allclose(np.array([d.embedding for d in got.data], dtype=np.float32), want, atol=2e-5)
    assert got.usage.prompt_tokens == sum(e.num_tokens for e in embed(two_workers, TEXTS).embeddings)
    np.testing.assert_allclose(np.array(HttpClient(two_workers.http_url, timeout=60).embed(TEXTS), dtype=np.float32),
                               want, atol=2e-5)


def test_every_worker_serves_and_every_request_is_counted(two_workers):
    """Connections spread over the workers (SO_REUSEPORT); the metrics port and KServe's statistics count the
    requests of both."""
    def ok_requests() -> float:
        with urllib.request.urlopen(two_workers.metrics_url, timeout=30) as response:
            return sum(float(line.rsplit(" ", 1)[1]) for line in response.read().decode().splitlines()
                       if line.startswith("attnserve_requests_total{") and 'method="Embed"' in line
                       and 'code="OK"' in line)

    def successes() -> int:
        stats = get_json(f"{two_workers.http_url}/v2/models/stats")["model_stats"][0]["inference_stats"]
        return stats["success"]["count"]

    before, before_stats, calls = ok_requests(), successes(), 24
    with ThreadPoolExecutor(8) as pool:  # a channel (a connection) each
        replies = list(pool.map(lambda i: embed(two_workers, [TEXTS[i % 4]]), range(calls)))
    assert all(len(r.embeddings) == 1 for r in replies)
    assert len({line for line in two_workers.log_tail(400).splitlines() if '"worker_serving"' in line}) >= 2
    assert ok_requests() - before == calls
    # Each worker's outcome reaches the engine before its reply reaches the client.
    assert successes() - before_stats == calls


def test_api_keys_hold_in_every_worker_and_the_one_queue_decides_admission(guarded_workers):
    """A queue of 256 tokens across both workers: a burst is partly refused with RESOURCE_EXHAUSTED and retry
    advice, the rest answered; nothing else."""
    server = guarded_workers
    with server.channel() as channel:
        stub = server.stub(channel)
        for _ in range(4):  # new connections: either worker
            with pytest.raises(grpc.RpcError) as refused:
                stub.Embed(make_request(TEXTS[:1]), timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert len(stub.Embed(make_request(TEXTS[:1]), timeout=30, metadata=AUTH).embeddings) == 1
    request = urllib.request.Request(f"{server.http_url}/v1/embeddings", data=json.dumps({"input": "hi"}).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http_refused:
        urllib.request.urlopen(request, timeout=30)
    assert http_refused.value.code == 401
    advice = []

    def call(_) -> grpc.StatusCode:
        try:
            embed(server, [" ".join(["attention"] * 100)], metadata=AUTH)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                advice.append(error_details(e).retry_delay)
            return e.code()

    with ThreadPoolExecutor(24) as pool:
        codes = Counter(pool.map(call, range(48)))
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert codes[grpc.StatusCode.OK] > 0 and codes[grpc.StatusCode.RESOURCE_EXHAUSTED] > 0, codes
    assert all(delay is not None and delay > 0 for delay in advice)


def under_load(server: ServerProcess, until_error: bool = False):
    """8 clients sending requests until the returned event is set; each also stops at an error other than
    UNAVAILABLE (until_error: at any error). Returns the event, the codes counted, and the clients' futures."""
    stop, codes, lock = threading.Event(), Counter(), threading.Lock()

    def client(i):
        with server.channel() as channel:
            stub = server.stub(channel)
            while not stop.is_set():
                try:
                    stub.Embed(make_request([TEXTS[i % 4]] * 4, truncate=True), timeout=30)
                    code = grpc.StatusCode.OK
                except grpc.RpcError as e:
                    code = e.code()
                with lock:
                    codes[code] += 1
                if code != grpc.StatusCode.OK and (until_error or code != grpc.StatusCode.UNAVAILABLE):
                    return

    pool = ThreadPoolExecutor(8)
    clients = [pool.submit(client, i) for i in range(8)]
    pool.shutdown(wait=False)
    time.sleep(1.5)
    return stop, codes, clients


def test_a_worker_killed_under_load_is_restarted(two_workers):
    """The server goes on with the replacement."""
    victim, survivor = workers_of(two_workers, 2)
    stop, codes, clients = under_load(two_workers)
    os.kill(victim, signal.SIGKILL)
    time.sleep(2.0)
    stop.set()
    for c in clients:
        c.result(timeout=60)  # every call ended: none was left unanswered
    assert set(codes) <= ENDED and codes[grpc.StatusCode.OK] > 0, codes
    replacement = [pid for pid in workers_of(two_workers, 2) if pid != survivor]
    assert replacement and victim not in replacement
    assert '"worker_died"' in two_workers.log_tail(400)
    assert len(embed(two_workers, TEXTS).embeddings) == 4


def test_sigterm_drains_every_worker_and_exits_0(two_workers):
    """Last of the tests on two_workers: its clients stop at their first error, as a client of one process is
    tested."""
    workers = workers_of(two_workers, 2)
    stop, codes, clients = under_load(two_workers, until_error=True)
    returncode = two_workers.terminate()
    stop.set()
    for c in clients:
        c.result(timeout=60)
    assert returncode == 0, two_workers.log_tail()
    assert set(codes) <= ENDED, codes
    assert not any(alive(pid) for pid in workers)
    assert "Traceback" not in two_workers.log_tail(400)


def test_the_engine_killed_under_load_ends_every_request(artifacts, tmp_path):
    server = ServerProcess(artifacts, "--workers", "2", log_path=tmp_path / "server.log")
    server.wait_serving()
    workers = workers_of(server, 2)
    stop, codes, clients = under_load(server, until_error=True)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)
    for c in clients:
        c.result(timeout=60)  # each client stops at its first error: every call in flight ended
    stop.set()
    assert set(codes) <= ENDED and codes[grpc.StatusCode.UNAVAILABLE] > 0, codes
    end = time.monotonic() + 30
    while any(alive(pid) for pid in workers) and time.monotonic() < end:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers), "the workers outlived their engine"
    log = server.log_tail(400)
    assert '"engine_lost"' in log and "Traceback" not in log
