"""Every HTTP status of the table in docs/http.md, as `curl` sees it, and API keys on both protocols, against one real
`attnserve serve` process with keys and small limits; it is still healthy after each.

The one fault injected: a batch holding token id POISON fails in Engine.run as a broken session would (a
sitecustomize module in the server process), since nothing a user sends makes a real session fail on demand.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.client import Client, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.v1 import encoder_pb2 as pb
from tests.conftest import run_cli
from tests.serving import ServerProcess, serving

KEY, FILE_KEY = "sk-attnserve-test-1", "sk-attnserve-test-2"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
POISON = 4242
MAX_REQUEST_BYTES, MAX_QUEUE_TOKENS = 65536, 2048
FAIL_ON_POISON = f"""
    import attnserve.engine.engine as engine

    _run = engine.Engine.run

    def run(self, inputs, attention=False, last_layer=False):
        if any({POISON} in x.ids for x in inputs):
            raise RuntimeError("injected: this batch's session run failed")
        return _run(self, inputs, attention, last_layer)

    engine.Engine.run = run
"""


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("status")
    (folder / "sitecustomize.py").write_text(textwrap.dedent(FAIL_ON_POISON))
    (folder / "keys.txt").write_text(f"\n{FILE_KEY}\n\n")
    process = ServerProcess(
        artifacts, "--api-key", KEY, "--api-key-file", str(folder / "keys.txt"),
        "--max-request-bytes", str(MAX_REQUEST_BYTES), "--max-queue-tokens", str(MAX_QUEUE_TOKENS),
        "--max-batch-tokens", "256", env={"PYTHONPATH": str(folder)}, log_path=folder / "server.log")
    with serving(process):
        yield process
    for line in (folder / "server.log").read_text().splitlines():
        record = json.loads(line)  # JSON lines only: no raw traceback
        assert record["level"] != "error" or "injected" in record.get("error", ""), record


def curl(server, path: str, body: dict | bytes | None = None, key: str | None = KEY, method: str | None = None,
         headers: tuple[str, ...] = ()) -> tuple[int, dict, bytes]:
    """curl's view of one request: (status, headers in lower case, body)."""
    args = ["curl", "-s", "-D", "-", f"{server.http_url}{path}", *(["-X", method] if method else [])]
    if key is not None:
        args += ["-H", f"Authorization: Bearer {key}"]
    for header in headers:
        args += ["-H", header]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    out = subprocess.run(args, input=data, capture_output=True, timeout=60, check=True).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue on large bodies
        head, _, payload = payload.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    return status, {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}, payload


def assert_healthy(server) -> None:
    assert curl(server, "/health", key=None)[0] == 200
    status, _, body = curl(server, "/v1/embeddings", {"input": "still serving", "model": MODEL})
    assert status == 200 and len(json.loads(body)["data"]) == 1


# case: (path, body, key, extra curl arguments, status, the error (OpenAI's "code", or TEI's "error_type"))
STATUSES = {
    "bad input": ("/v1/embeddings", {"input": ["ok", ""], "model": MODEL}, KEY, {}, 400, "invalid_input"),
    "a body that is not JSON": ("/embed", b"{'inputs': 'x'}", KEY, {}, 400, "Validation"),
    "no API key": ("/v1/embeddings", {"input": "x", "model": MODEL}, None, {}, 401, "invalid_api_key"),
    "a wrong API key": ("/embed", {"inputs": "x"}, "sk-wrong", {}, 401, "Unauthorized"),
    "an unknown model": ("/v1/embeddings", {"input": "x", "model": "text-embedding-3-large"}, KEY, {}, 404,
                         "model_not_found"),
    "a method the route has not": ("/v1/embeddings", None, KEY, {"method": "PUT"}, 405, "method_not_allowed"),
    "a body over --max-request-bytes": ("/embed", {"inputs": ["x" * 1000] * 70}, KEY, {}, 413, "Validation"),
    "a deadline": ("/embed", {"inputs": ["word " * 200] * 4}, KEY, {"headers": ("X-Request-Timeout: 0.000001",)},
                   504, "Overloaded"),
    "a failed batch": ("/v1/embeddings", {"input": [[101, POISON, 102]], "model": MODEL}, KEY, {}, 500,
                       "batch_failed"),
}


@pytest.mark.parametrize("case", list(STATUSES))
def test_curl_gets_the_status_of_the_table_and_the_server_stays_healthy(server, case):
    path, body, key, extra, expected, kind = STATUSES[case]
    status, headers, payload = curl(server, path, body, key, **extra)
    assert status == expected, payload
    error = json.loads(payload)["error"]
    assert (error["code"] if isinstance(error, dict) else json.loads(payload)["error_type"]) == kind, payload
    if status == 401:
        assert headers["www-authenticate"] == "Bearer"
    assert_healthy(server)


def test_the_messages_say_what_is_wrong(server):
    # More tokens than the whole queue holds (2,304 of 2,048): admitted in parts, answered whole.
    status, _, body = curl(server, "/v1/embeddings", {"input": ["word " * 300] * 9, "model": MODEL, "truncate": True})
    assert status == 200 and len(json.loads(body)["data"]) == 9
    _, _, body = curl(server, "/embed", b"{'inputs': 'x'}")
    assert json.loads(body)["error"] == "the body is not JSON: key must be a string at line 1 column 2"
    _, _, body = curl(server, "/v1/embeddings", {"input": [[101, POISON, 102]], "model": MODEL})
    assert json.loads(body)["error"]["message"] == (
        "the batch this request ran in failed (RuntimeError); the server is still serving, retry the request")
    status, _, body = curl(server, "/v1/embeddings", {"input": "x", "model": MODEL},
                           headers=("X-Request-Timeout: soon",))
    assert status == 400 and json.loads(body)["error"] == {
        "message": "X-Request-Timeout: 'soon' is not a positive number of seconds", "type": "invalid_request_error",
        "param": "X-Request-Timeout", "code": "invalid_input"}


def test_overload_is_429_with_retry_after_and_the_sdk_raises_rate_limit_error(server):
    """24 requests of ~1,000 tokens at once into a queue of 2,048: most are refused at once, the rest answered."""
    body = {"input": [f"load {i} " + "word " * 250 for i in range(4)], "model": MODEL, "truncate": True}
    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(lambda _: curl(server, "/v1/embeddings", body), range(24)))
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) == {200, 429} and statuses[429] > 0, statuses
    for status, headers, payload in answers:
        if status == 429:
            assert int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) >= 50, headers
            assert json.loads(payload)["error"]["code"] == "queue_full"

    errors: list = []
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=KEY, max_retries=0) as client:
        def create(_):
            try:
                client.embeddings.create(input=body["input"], model=MODEL, extra_body={"truncate": True})
                return "ok"
            except openai.RateLimitError as e:
                errors.append(e)
                return "rate limited"
        outcomes = Counter(ThreadPoolExecutor(24).map(create, range(24)))
    assert set(outcomes) == {"ok", "rate limited"}, outcomes
    assert all(e.status_code == 429 and e.response.headers["retry-after"] for e in errors)
    assert_healthy(server)


def test_kserve_routes_take_the_key_and_map_errors_to_the_same_statuses(server):
    """Probes are open, as /health is; inference needs the key (tritonclient sends it as a header); errors take
    the statuses of the table in KServe's {"error"} envelope."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    for probe in ("/v2/health/live", "/v2/health/ready"):
        assert curl(server, probe, key=None)[0] == 200
    infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    path = f"/v2/models/{MODEL}/infer"
    for body, key, extra, expected in [
            (infer, None, {}, 401), (infer, "sk-wrong", {}, 401), (infer, KEY, {}, 200),
            ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["word " * 200]}]}, KEY,
             {"headers": ("X-Request-Timeout: 0.000001",)}, 504),
            ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x" * 80_000]}]}, KEY, {}, 413)]:
        status, headers, payload = curl(server, path, body, key, **extra)
        assert status == expected, payload
        assert status == 200 or set(json.loads(payload)) == {"error"}, payload
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"keyed"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [text])
        assert refused.value.status() == "401"
        reply = client.infer(MODEL, [text], headers={"Authorization": f"Bearer {KEY}"})
        assert reply.as_numpy("embedding").shape == (1, 384)
    finally:
        client.close()
    assert_healthy(server)


def test_api_keys_on_both_protocols(server):
    # HTTP: every route but /health needs a key; either key (--api-key, --api-key-file) is one.
    assert curl(server, "/health", key=None)[0] == 200
    assert curl(server, "/openapi.json", key=None)[0] == 401
    assert json.loads(curl(server, "/openapi.json", key=FILE_KEY)[2])["security"] == [{"apiKey": []}]
    for key, status in ((KEY, 200), (FILE_KEY, 200), (KEY + "x", 401), (KEY[:-1], 401), ("", 401)):
        assert curl(server, "/info", key=key)[0] == status, key
    with openai.OpenAI(base_url=f"{server.http_url}/v1", api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.embeddings.create(input="x", model=MODEL)
    # gRPC: the same value in the authorization metadata, on every method but health's.
    with server.channel() as channel:
        stub = server.stub(channel)
        assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        for call in (lambda **kw: stub.Embed(make_request(["x"]), timeout=10, **kw),
                     lambda **kw: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, **kw),
                     lambda **kw: list(stub.EmbedStream(iter([make_request(["x"])]), timeout=10, **kw))):
            for metadata in ((), (("authorization", "Bearer sk-wrong"),), (("authorization", KEY),)):
                with pytest.raises(grpc.RpcError) as error:
                    call(metadata=metadata)
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert error_details(error.value).reason == "UNAUTHENTICATED"
            assert call(metadata=(("authorization", f"Bearer {FILE_KEY}"),))
    # The Python client and the CLI send it: the argument, the flag, or ATTNSERVE_API_KEY.
    with Client(server.target, api_key=KEY) as client:
        assert client.embed(["with a key"]).shape == (1, 384)
    with Client(server.target) as client:
        with pytest.raises(RequestError, match="UNAUTHENTICATED: no API key"):
            client.embed(["without"])
    assert run_cli("embed", "x", "--target", server.target, "--api-key", KEY).returncode == 0
    assert run_cli("embed", "x", "--target", server.target, env={"ATTNSERVE_API_KEY": FILE_KEY}).returncode == 0
    refused = run_cli("embed", "x", "--target", server.target, env={"ATTNSERVE_API_KEY": "sk-wrong"})
    assert refused.returncode == 1
    assert refused.stderr.strip() == "attnserve embed: error: UNAUTHENTICATED: invalid API key"
    assert run_cli("health", "--target", server.target).returncode == 0  # health needs no key
    loadtest = run_cli("loadtest", "--target", server.target, "--api-key", KEY, "--requests", "6",
                       "--concurrency", "2", "--json", "-")
    assert loadtest.returncode == 0 and json.loads(loadtest.stdout)["codes"] == {"OK": 6}, loadtest.stdout
    metrics = server.metrics()
    assert metrics['attnserve_requests_total{code="UNAUTHENTICATED",method="Embed",protocol="grpc"}'] >= 4
    assert metrics['attnserve_requests_total{code="401",method="/info",protocol="http"}'] == 3
    log = Path(server.log_path).read_text()
    assert KEY not in log and FILE_KEY not in log  # keys are never logged


def test_encode_through_the_server_takes_the_key(server, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\nthree\n")
    refused = run_cli("encode", src, "-o", tmp_path / "refused.parquet", "--server", server.target, "--no-progress")
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    done = run_cli("encode", src, "-o", tmp_path / "out.parquet", "--server", server.target, "--api-key", KEY,
                   "--no-progress")
    assert done.returncode == 0, done.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out.parquet").num_rows == 3

