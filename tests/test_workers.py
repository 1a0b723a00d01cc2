"""`attnserve serve --workers N` (server/workers/): front-door processes on shared ports in front of one engine
process. Real servers on loopback, real clients: the answers are one process's, every worker serves, the one queue
decides admission, the statistics and metrics count every worker's requests, and no request goes unanswered when a
worker or the engine is killed under load, or when the server drains."""

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

import grpc
import numpy as np
import pytest

from attnserve.client import error_details
from attnserve.client.client import make_request
from attnserve.v1 import encoder_pb2 as pb
from tests.serving import ServerProcess, serving

TEXTS = ["The cat sat on the mat.", "A quick brown fox jumps over the lazy dog, twice over.", "Hello world",
         "Attention is all you need, and a key-padding mask."]
# Codes a call may end with when its worker or the engine is killed under it: the connection reset, or the
# worker's UNAVAILABLE (its engine is gone); never silence (every call below has a timeout and must end before it).
RETRYABLE = {grpc.StatusCode.UNAVAILABLE}


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(x) for x in f.read().split()]
    return found


def workers_of(server: ServerProcess, count: int, timeout: float = 60) -> list[int]:
    """The pids of the server's `count` workers, once each serves."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = children(server.process.pid)
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


def embed(server: ServerProcess, texts: list[str], metadata=None, **options) -> pb.EmbedResponse:
    with server.channel() as channel:
        return server.stub(channel).Embed(make_request(texts, truncate=True, **options), timeout=60, metadata=metadata)


def vectors(reply: pb.EmbedResponse) -> np.ndarray:
    return np.stack([np.frombuffer(e.sentence_embedding.data, "<f4") for e in reply.embeddings])


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def metric(server: ServerProcess, name: str, labels: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=30) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and all(part in line for part in labels.split(",")))


@pytest.fixture(scope="module")
def two_workers(artifacts, tmp_path_factory):
    process = ServerProcess(artifacts, "--workers", "2", log_path=tmp_path_factory.mktemp("workers") / "server.log")
    with serving(process):
        workers_of(process, 2)
        yield process


def test_two_workers_answer_as_one_process_does(two_workers, server):
    one, two = embed(server, TEXTS, token_embeddings=True), embed(two_workers, TEXTS, token_embeddings=True)
    np.testing.assert_allclose(vectors(two), vectors(one), atol=2e-5)
    for a, b in zip(one.embeddings, two.embeddings, strict=True):
        assert (a.num_tokens, a.truncated) == (b.num_tokens, b.truncated)
        np.testing.assert_allclose(np.frombuffer(b.token_embeddings.data, "<f4"),
                                   np.frombuffer(a.token_embeddings.data, "<f4"), atol=2e-5)
    # Attention maps cross the link as raw frames: every layer and head, as one process gives them.
    maps = {}
    for name, target in (("one", server), ("two", two_workers)):
        with target.channel() as channel:
            reply = target.stub(channel).Embed(make_request(TEXTS[:2], truncate=True, attention_layers=[0, -1]),
                                               timeout=60)
        maps[name] = [np.frombuffer(e.attentions.data, "<f4") for e in reply.embeddings]
    for a, b in zip(maps["one"], maps["two"], strict=True):
        assert a.size > 0
        np.testing.assert_allclose(b, a, atol=2e-5)


def test_the_http_door_of_the_workers_answers_the_openai_sdk(two_workers):
    import openai

    with openai.OpenAI(base_url=f"{two_workers.http_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        got = client.embeddings.create(input=TEXTS, model="sentence-transformers/all-MiniLM-L6-v2")
    openai_vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    np.testing.assert_allclose(openai_vectors, vectors(embed(two_workers, TEXTS)), atol=2e-5)
    assert got.usage.prompt_tokens == sum(e.num_tokens for e in embed(two_workers, TEXTS).embeddings)


def test_quantized_embeddings_ask_the_engine_for_their_ranges(two_workers, server):
    """int8 needs the model's calibrated ranges (Engine.require("quantization")): a worker asks the engine process
    from its thread pool, and answers as one process does."""
    codes = {}
    for name, target in (("one", server), ("two", two_workers)):
        request = make_request(TEXTS, truncate=True)
        request.embedding_type = pb.EMBEDDING_TYPE_INT8
        with target.channel() as channel:
            reply = target.stub(channel).Embed(request, timeout=60)
        codes[name] = np.stack([np.frombuffer(e.sentence_embedding.data, np.int8) for e in reply.embeddings])
    assert np.abs(codes["two"].astype(int) - codes["one"].astype(int)).max() <= 1  # a rounding step at most


def test_teis_client_embeds_through_the_workers(two_workers):
    from tei_client import HttpClient

    got = np.array(HttpClient(two_workers.http_url, timeout=60).embed(TEXTS), dtype=np.float32)
    np.testing.assert_allclose(got, vectors(embed(two_workers, TEXTS)), atol=2e-5)


KEY = "k-" + "7" * 20
AUTH = (("authorization", f"Bearer {KEY}"),)


@pytest.fixture(scope="module")
def guarded_workers(artifacts, tmp_path_factory):
    """Two workers behind an API key and one queue of 256 tokens."""
    process = ServerProcess(artifacts, "--workers", "2", "--api-key", KEY, "--max-queue-tokens", "256",
                            "--max-wait-ms", "50", log_path=tmp_path_factory.mktemp("guarded") / "server.log")
    with serving(process):
        workers_of(process, 2)
        yield process


def test_api_keys_hold_in_every_worker(guarded_workers):
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


def test_every_worker_serves_and_every_request_is_counted(two_workers):
    """Connections spread over the workers (SO_REUSEPORT); the metrics port and KServe's statistics count the
    requests of both."""
    before_stats = get_json(f"{two_workers.http_url}/v2/models/stats")["model_stats"][0]["inference_stats"]
    before = metric(two_workers, "attnserve_requests_total", 'method="Embed",code="OK"')
    calls = 24
    with ThreadPoolExecutor(8) as pool:  # a channel (a connection) each
        replies = list(pool.map(lambda i: embed(two_workers, [TEXTS[i % 4]]), range(calls)))
    assert all(len(r.embeddings) == 1 for r in replies)
    served = {line for line in two_workers.log_tail(400).splitlines() if '"worker_serving"' in line}
    assert len(served) >= 2
    assert metric(two_workers, "attnserve_requests_total", 'method="Embed",code="OK"') - before == calls
    after_stats = get_json(f"{two_workers.http_url}/v2/models/stats")["model_stats"][0]["inference_stats"]
    # Each worker's outcome reaches the engine before its reply reaches the client; the last stats call's own
    # connection may have gone to either worker.
    assert after_stats["success"]["count"] - before_stats["success"]["count"] == calls


def test_the_one_queue_decides_admission(guarded_workers):
    """A queue of 256 tokens across both workers: a burst is partly refused with RESOURCE_EXHAUSTED and retry
    advice, the rest answered; nothing else."""
    server = guarded_workers
    long_text = " ".join(["attention"] * 100)
    codes: Counter = Counter()
    advice = []

    def call(_):
        try:
            embed(server, [long_text], metadata=AUTH)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                advice.append(error_details(e).retry_delay)
            return e.code()

    with ThreadPoolExecutor(24) as pool:
        codes.update(pool.map(call, range(48)))
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert codes[grpc.StatusCode.OK] > 0 and codes[grpc.StatusCode.RESOURCE_EXHAUSTED] > 0, codes
    assert all(delay is not None and delay > 0 for delay in advice)


def load(server: ServerProcess, stop: threading.Event, codes: Counter, lock: threading.Lock, clients: int = 8,
         until_error: bool = False):
    """Clients sending requests until stop is set; each also stops at an error other than UNAVAILABLE (until_error:
    at any error)."""
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
    pool = ThreadPoolExecutor(clients)
    return pool, [pool.submit(client, i) for i in range(clients)]


def test_a_worker_killed_under_load_is_restarted(two_workers):
    """Last of the tests on two_workers: its server goes on with the replacement, and stops as cleanly."""
    server = two_workers
    victim, survivor = workers_of(server, 2)
    codes: Counter = Counter()
    lock, stop = threading.Lock(), threading.Event()
    pool, clients = load(server, stop, codes, lock)
    time.sleep(1.5)
    os.kill(victim, signal.SIGKILL)
    time.sleep(2.0)
    stop.set()
    for c in clients:
        c.result(timeout=60)  # every call ended: none was left unanswered
    pool.shutdown()
    assert set(codes) <= {grpc.StatusCode.OK} | RETRYABLE, codes
    assert codes[grpc.StatusCode.OK] > 0
    replacement = [pid for pid in workers_of(server, 2) if pid != survivor]
    assert replacement and victim not in replacement
    assert '"worker_died"' in server.log_tail(400)
    assert len(embed(server, TEXTS).embeddings) == 4


def test_the_engine_killed_under_load_ends_every_request(artifacts, tmp_path):
    server = ServerProcess(artifacts, "--workers", "2", log_path=tmp_path / "server.log")
    server.wait_serving()
    workers = workers_of(server, 2)
    codes: Counter = Counter()
    lock, stop = threading.Lock(), threading.Event()
    pool, clients = load(server, stop, codes, lock, until_error=True)
    time.sleep(1.5)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(10)
    for c in clients:
        c.result(timeout=60)  # each client stops at its first error: every call in flight ended
    stop.set()
    pool.shutdown()
    assert set(codes) <= {grpc.StatusCode.OK} | RETRYABLE, codes
    assert codes[grpc.StatusCode.UNAVAILABLE] > 0
    end = time.monotonic() + 30
    while any(alive(pid) for pid in workers) and time.monotonic() < end:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers), "the workers outlived their engine"
    log = server.log_tail(400)
    assert '"engine_lost"' in log and "Traceback" not in log


def test_sigterm_drains_every_worker_and_exits_0(artifacts, tmp_path):
    server = ServerProcess(artifacts, "--workers", "2", log_path=tmp_path / "server.log")
    server.wait_serving()
    workers = workers_of(server, 2)
    codes: Counter = Counter()
    lock, stop = threading.Lock(), threading.Event()
    pool, clients = load(server, stop, codes, lock, until_error=True)  # as a client of one process is tested
    time.sleep(1.5)
    returncode = server.terminate()
    stop.set()
    for c in clients:
        c.result(timeout=60)
    pool.shutdown()
    assert returncode == 0, server.log_tail()
    assert set(codes) <= {grpc.StatusCode.OK} | RETRYABLE, codes
    assert not any(alive(pid) for pid in workers)
    assert "Traceback" not in server.log_tail(400)
