"""The HTTP door under hostile input and every status of docs/http.md's table, on one real server with API keys,
small limits and short timeouts: raw sockets where a polite client cannot say the bytes, curl where the table says
what curl sees. Nothing answers 5xx unasked or writes a traceback, no key reaches the log, every route answers every
error in its family's envelope, and the server stays healthy.

The one fault injected: a batch holding token id POISON fails in Engine.run as a broken session would (a
sitecustomize module in the server process), since nothing a user sends makes a real session fail on demand.
"""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import textwrap
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.client import Client, RequestError, error_details
from attnserve.client.client import make_request
from attnserve.config import ServerConfig
from attnserve.errors import ConfigError
from attnserve.v1 import encoder_pb2 as pb
from server.logs import Throttle
from tests.conftest import run_cli
from tests.doors import MODEL, check_envelope, message
from tests.serving import ServerProcess, serving

KEY, FILE_KEY = "hostile-Key-8d1f0c", "sk-attnserve-test-2"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_REQUEST_BYTES, MAX_QUEUE_TOKENS = 64 * 1024, 2048
HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 2.0
EMBED = b'{"input": "hello", "model": ""}'
POISON = 4242
FAIL_ON_POISON = f"""
    import attnserve.engine.engine as engine

    _run = engine.Engine.run

    def run(self, inputs, attention=False, last_layer=False, token_states=True, narrow=False):
        if any({POISON} in x.ids for x in inputs):
            raise RuntimeError("injected: this batch's session run failed")
        return _run(self, inputs, attention, last_layer, token_states, narrow)

    engine.Engine.run = run
"""


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "sitecustomize.py").write_text(textwrap.dedent(FAIL_ON_POISON))
    (folder / "keys.txt").write_text(f"\n{FILE_KEY}\n\n")
    process = ServerProcess(
        artifacts, "--api-key", KEY, "--api-key-file", str(folder / "keys.txt"),
        "--max-request-bytes", str(MAX_REQUEST_BYTES), "--max-queue-tokens", str(MAX_QUEUE_TOKENS),
        "--max-batch-tokens", "256", "--http-header-timeout", str(HEADER_TIMEOUT),
        "--http-body-timeout", str(BODY_TIMEOUT), env={"ATTNSERVE_THREADS": "1", "PYTHONPATH": str(folder)},
        log_path=folder / "server.log")
    with serving(process):
        yield process
    for line in (folder / "server.log").read_text().splitlines():
        record = json.loads(line)  # JSON lines only: no raw traceback
        assert record["level"] != "error" or "injected" in record.get("error", ""), record


def server_log(server) -> str:
    return server.log_tail(lines=1_000_000)


# --- raw HTTP ---------------------------------------------------------------------------------------------------

def raw_request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                auth: bool = True) -> bytes:
    fields = {"Host": "localhost", **(AUTH if auth else {}), **(headers or {})}
    if body and "Transfer-Encoding" not in fields:
        fields.setdefault("Content-Length", str(len(body)))
        fields.setdefault("Content-Type", "application/json")
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
            + "\r\n").encode("latin-1") + body


def closes(reply: httpx.Response) -> bool:
    return reply.headers.get("connection", "").lower() == "close"


class Connection:
    """One kept-alive connection, read a reply at a time (Content-Length framed, as the server's replies are)."""

    def __init__(self, server, timeout: float = 30):
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=timeout)
        self.buffer = b""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def reply(self) -> httpx.Response | None:
        """The next reply; None if the server closed the connection first."""
        try:
            while b"\r\n\r\n" not in self.buffer:
                if not self._fill():
                    return None
        except ConnectionResetError:
            return None
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if status == 100:
            return self.reply()
        length = int(headers.get("content-length", 0))
        while len(self.buffer) < length:
            if not self._fill():
                break
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return httpx.Response(status, headers=headers, content=body)

    def first_status(self) -> int:
        """The status of the first reply's first line: 100 when a body is invited."""
        while b"\r\n" not in self.buffer:
            assert self._fill()
        return int(self.buffer.split(b" ", 2)[1])

    def closed_within(self, seconds: float) -> bool:
        """Whether the server closes the connection within `seconds` (what it still sends is read and dropped)."""
        self.sock.settimeout(seconds)
        try:
            while self._fill():
                pass
            return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


def exchange(server, data: bytes) -> httpx.Response | None:
    with Connection(server) as connection:
        connection.send(data)
        return connection.reply()


def curl(server, path: str, body: dict | bytes | None = None, key: str | None = KEY, method: str | None = None,
         headers: tuple[str, ...] = ()) -> tuple[int, dict, bytes]:
    """curl's view of one request: (status, headers in lower case, body)."""
    args = ["curl", "-s", "-D", "-", f"{server.http_url}{path}", *(["-X", method] if method else [])]
    args += [f for header in ((f"Authorization: Bearer {key}",) if key is not None else ()) + headers
             for f in ("-H", header)]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    out = subprocess.run(args, input=data, capture_output=True, timeout=60, check=True).stdout
    head, _, payload = out.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl's Expect: 100-continue on large bodies
        head, _, payload = payload.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, payload


def assert_healthy(server) -> None:
    assert curl(server, "/health", key=None)[0] == 200
    status, _, body = curl(server, "/v1/embeddings", {"input": "still serving", "model": MODEL})
    assert status == 200 and len(json.loads(body)["data"]) == 1


# --- requests that do not parse -------------------------------------------------------------------------------------

# Requests that aiohttp cannot parse, each with the key in it somewhere, and the other classes of parse error.
MALFORMED = {
    "key with a control byte": f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\x01\r\n\r\n",
    "key after DEL": f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \x7f{KEY}\r\n\r\n",
    "key in a bad header name": f"GET /info HTTP/1.1\r\nHost: x\r\nX-{KEY}\x01: y\r\n\r\n",
    "key in a bad request line": f"GET /{KEY} HTTP/9.9\r\nHost: x\r\n\r\n",
    "key in a bare-LF request": f"GET /info HTTP/1.1\nHost: x\nAuthorization: Bearer {KEY}\n\n",
    "key in a folded header": f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n {KEY}\r\n\r\n",
    "key in a NUL path": f"GET /{KEY}\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    "key in a long line": f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}{'k' * 9000}\r\n\r\n",
    "bad chunk size": "POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "negative chunk size": "POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\n{}\r\n0\r\n\r\n",
    "chunk size overflow": "POST /embed HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + "f" * 40 + "\r\n",
    "long URL": "GET /" + "a" * 100_000 + " HTTP/1.1\r\nHost: x\r\n\r\n",
    "large header": "GET /info HTTP/1.1\r\nHost: x\r\nX-Big: " + "b" * 20_000 + "\r\n\r\n",
    "too many headers": "GET /info HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-H{i}: v\r\n" for i in range(300)) + "\r\n",
    "missing Host": "GET /info HTTP/1.1\r\n\r\n",
    "bad method": "FOO /info HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad method token": "G@T /info HTTP/1.1\r\nHost: x\r\n\r\n",
    "Content-Length and chunked": "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n{}",
    "two Content-Lengths": "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "TLS on the HTTP port": "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + "\x00" * 40,
    "HTTP/2 preface": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "unknown content coding": "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Encoding: zstd\r\n"
                              "Content-Length: 2\r\n\r\n{}",
}


def test_a_request_that_does_not_parse_is_a_4xx_in_json_quoting_none_of_its_bytes_and_never_logged(server):
    """aiohttp answers these before any route runs, in text/plain quoting the bad line (the key included): the door
    answers TEI's envelope instead (the path is unknown), names the kind of problem and closes the connection (the
    framing past a bad head cannot be trusted); the log gets throttled WARNING lines, no key, no traceback."""
    for name, data in MALFORMED.items():
        reply = exchange(server, data.encode("latin-1"))
        assert reply is not None and 400 <= reply.status_code < 500, name
        assert reply.headers["content-type"].startswith("application/json"), (name, reply.content)
        assert check_envelope("tei", reply, reply.status_code)["error_type"] == "Validation" and reply.json()["error"]
        assert KEY.encode() not in reply.content and b"\\x" not in reply.content, (name, reply.content)
        assert closes(reply), name
    for _ in range(30):  # a flood of them: a few lines, never one a request
        assert exchange(server, MALFORMED["bad chunk size"].encode()).status_code == 400
    assert httpx.post(server.http_url + "/v1/embeddings", content=EMBED, headers=AUTH, timeout=30).status_code == 200
    time.sleep(0.5)  # the last lines reach the file
    log = server_log(server)
    assert KEY not in log and KEY.encode().hex() not in log and "Traceback" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["level"] in ("error", "critical")]
    warnings = [line for line in lines if line.get("event") == "bad_http_request"]
    assert warnings and len(warnings) < 30
    assert all(set(w) <= {"time", "level", "logger", "message", "event", "error", "code", "peer", "held_back"}
               for w in warnings)


def test_the_throttle_lets_a_few_lines_a_period_through_and_counts_the_rest():
    now = [0.0]
    throttle = Throttle(limit=3, period=60, clock=lambda: now[0])
    assert [throttle.allow() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 59.9
    assert throttle.allow() is None
    now[0] = 60.0
    assert throttle.allow() == 3  # the first line of the next period says how many were left out
    assert throttle.allow() == 0


# --- bodies whose Content-Encoding lies ---------------------------------------------------------------------------

INFER = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}).encode()
# A route of each family -> (path, a good body).
ROUTES = {"openai": ("/v1/embeddings", EMBED), "openai-no-v1": ("/embeddings", EMBED),
          "tei": ("/embed", b'{"inputs": "hello"}'), "kserve": (f"/v2/models/{MODEL}/infer", INFER)}


@pytest.mark.parametrize("family", list(ROUTES))
def test_a_body_whose_content_encoding_lies_is_a_400_and_a_true_one_is_read(server, family):
    """A lie is a 400 naming the coding, and the connection says whether it goes on; real gzip and deflate bodies
    are read, on a connection kept."""
    path, body = ROUTES[family]
    for encoding in ("gzip", "deflate", "br"):
        with Connection(server) as connection:
            connection.send(raw_request("POST", path, body, {"Content-Encoding": encoding}))
            reply = connection.reply()
            assert reply is not None and encoding in message(check_envelope(family, reply, 400))
            if closes(reply):
                assert connection.closed_within(15)
                continue
            connection.send(raw_request("POST", path, body))
            assert connection.reply().status_code == 200
    with Connection(server) as connection:
        for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            connection.send(raw_request("POST", path, data, {"Content-Encoding": encoding}))
            reply = connection.reply()
            assert reply.status_code == 200 and not closes(reply), reply.content


def test_pipelined_http10_chunked_and_expect_continue_requests_are_answered_and_early_errors_keep_the_connection(
        server):
    with Connection(server) as connection:
        connection.send(raw_request("POST", "/v1/embeddings", EMBED) * 3 + raw_request("GET", "/info"))
        assert [connection.reply().status_code for _ in range(4)] == [200, 200, 200, 200]
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EMBED), EMBED)
        connection.send(raw_request("POST", "/v1/embeddings", chunked, {"Transfer-Encoding": "chunked",
                                                                       "Content-Type": "application/json"}))
        assert connection.reply().status_code == 200
        connection.send(raw_request("POST", "/v1/embeddings", headers={
            "Expect": "100-continue", "Content-Length": str(len(EMBED)), "Content-Type": "application/json"}))
        time.sleep(0.2)
        connection.send(EMBED)
        assert connection.reply().status_code == 200
        # 401 and 404 come before the route reads the body: it is read past, and the next request is answered.
        for request, status in ((raw_request("POST", "/v1/embeddings", EMBED, auth=False), 401),
                                (raw_request("POST", "/v2/models/nope/infer", b'{"inputs": []}'), 404),
                                (raw_request("POST", "/v1/embeddings", EMBED), 200)):
            connection.send(request)
            assert connection.reply().status_code == status
    http10 = raw_request("POST", "/v1/embeddings", EMBED).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    assert exchange(server, http10).status_code == 200


# --- HEAD, 405 and GET / -------------------------------------------------------------------------------------------

GETS = ["/", "/health", "/v2/health/live", "/v2/health/ready", "/info", "/v1/models", f"/v1/models/{MODEL}",
        "/openapi.json", "/v2", f"/v2/models/{MODEL}", f"/v2/models/{MODEL}/ready", f"/v2/models/{MODEL}/versions/1"]


def allowed(reply) -> set[str]:
    return {m.strip() for m in reply.headers["allow"].split(",")}


def test_head_answers_wherever_get_does_without_a_body_and_other_methods_get_405_listing_the_routes(server):
    for path in GETS:
        get = httpx.get(server.http_url + path, headers=AUTH, timeout=30)
        head = httpx.head(server.http_url + path, headers=AUTH, timeout=30)
        assert (get.status_code, head.status_code) == (200, 200), path
        length = get.headers.get("content-length", "0")
        assert head.content == b"" and head.headers.get("content-length", "0") == length, path
    assert httpx.head(server.http_url + "/health", timeout=30).status_code == 200  # open, as GET is
    for path in GETS[1:]:  # POST / is TEI's embed
        reply = httpx.post(server.http_url + path, headers=AUTH, json={}, timeout=30)
        assert reply.status_code == 405 and allowed(reply) == {"GET", "HEAD"}, path
    for path, _ in ROUTES.values():
        reply = httpx.put(server.http_url + path, headers=AUTH, json={}, timeout=30)
        # (KServe's infer path also matches its model-metadata GET route, a model name holding slashes.)
        assert reply.status_code == 405 and "POST" in allowed(reply), path


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_reading_an_infer_path_is_a_405_not_an_unknown_model(server, method):
    # A model name may hold slashes, but the metadata route takes none ending in a suffixed route's word: GET
    # /v2/models/NAME/infer is the infer route asked with the wrong method, whatever NAME is (as OPTIONS says).
    for path in (f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer", "/v2/models/nope/infer"):
        reply = httpx.request(method, server.http_url + path, headers=AUTH, timeout=30)
        assert reply.status_code == 405 and reply.headers["allow"] == "POST", (path, reply.text)
        if method == "GET":
            assert "not allowed" in message(check_envelope("kserve", reply, 405))
    reply = httpx.request("OPTIONS", server.http_url + f"/v2/models/{MODEL}/infer", headers=AUTH, timeout=30)
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"


def test_get_root_points_to_the_help(server):
    for headers in (AUTH, {}):  # open: the first thing a newcomer asks
        reply = httpx.get(server.http_url + "/", headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["help"]["openapi"] == "/openapi.json" and body["help"]["health"] == "/health"
        assert "POST /v1/embeddings" in body["routes"] and "POST /embed" in body["routes"]


# --- every route, every error, in its family's envelope ------------------------------------------------------------

FAMILY_OF = {"/v1/embeddings": "openai", "/embeddings": "openai", "/v1/rerank": "openai", "/v1/attention": "openai",
             "/embed": "tei", "/embed_all": "tei", "/rerank": "tei", "/tokenize": "tei", "/decode": "tei",
             "/": "tei", f"/v2/models/{MODEL}/infer": "kserve"}


@pytest.mark.parametrize("path", list(FAMILY_OF))
def test_every_error_of_every_route_is_in_its_familys_envelope(server, path):
    url = server.http_url + path
    for status, reply in {401: httpx.post(url, content=b"{}", timeout=30),
                          400: httpx.post(url, content=b"{nope", headers=AUTH, timeout=30),
                          405: httpx.put(url, content=b"{}", headers=AUTH, timeout=30),
                          413: httpx.post(url, content=b" " * (MAX_REQUEST_BYTES + 1), headers=AUTH, timeout=30),
                          }.items():
        check_envelope(FAMILY_OF[path], reply, status)
        assert reply.headers["content-type"].startswith("application/json")


UNKNOWN_MODEL = {"/v1/attention": {"model": "nope", "inputs": "a"},
                 "/v1/rerank": {"model": "nope", "query": "q", "documents": ["d"]},
                 "/v2/models/nope/infer": json.loads(INFER)}


# (path, family, a body naming an unknown model, or None: a GET of an unknown path)
@pytest.mark.parametrize("path,family", [
    ("/v1/embeddings", "openai"), ("/embeddings", "openai"), ("/v1/attention", "openai"), ("/v1/rerank", "openai"),
    ("/v2/models/nope/infer", "kserve"), ("/v1/nope", "openai"), ("/embeddings/x", "openai"), ("/v2/nope", "kserve"),
    ("/nope", "tei"), ("//v1/embeddings", "openai"), ("/v1/%2e%2e/health", "openai"), ("/" + "x" * 8000, "tei")],
    ids=lambda value: value[:30])
def test_an_unknown_model_or_path_is_a_404_in_the_familys_envelope(server, path, family):
    if path in ("/v1/embeddings", "/embeddings", *UNKNOWN_MODEL):
        body = UNKNOWN_MODEL.get(path, {"model": "nope", "input": "a"})
        reply = httpx.post(server.http_url + path, json=body, headers=AUTH, timeout=30)
        assert "nope" in message(check_envelope(family, reply, 404))
    else:
        check_envelope(family, exchange(server, raw_request("GET", path)), 404)


@pytest.mark.parametrize("family", ["openai", "tei", "kserve"])
def test_a_body_that_will_be_refused_is_not_invited_by_100_continue(server, family):
    """100 Continue starts a client's upload: a body over max_request_bytes, or sent without a valid key, is
    refused before a byte of it is sent; a good one is still invited; another expectation is ignored (RFC 9110)."""
    path, body = ROUTES[family]
    expect = {"Expect": "100-continue"}
    heads = [(raw_request("POST", path, headers={**expect, "Content-Length": str(MAX_REQUEST_BYTES + 1)}), 413)]
    heads += [(raw_request("POST", path, headers={**expect, "Content-Length": str(len(body)), **auth}, auth=False),
               401) for auth in ({}, {"Authorization": "Bearer wrong"})]
    for head, status in heads:
        with Connection(server) as connection:
            connection.send(head)
            assert connection.first_status() == status
    with Connection(server) as connection:
        connection.send(raw_request("POST", path, headers={**expect, "Content-Length": str(len(body)),
                                                           "Content-Type": "application/json"}))
        while b"\r\n\r\n" not in connection.buffer:
            assert connection._fill()
        assert connection.buffer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        connection.buffer = b""
        connection.send(body)
        assert connection.reply().status_code == 200
    check_envelope(family, exchange(server, raw_request("POST", path, b"{}", headers={"Expect": "something-else"})),
                   400)


# --- slow clients ---------------------------------------------------------------------------------------------------

def test_slowloris_heads_get_408_and_closed_while_others_are_served(server):
    clients = [Connection(server) for _ in range(8)]
    started = time.monotonic()
    try:
        for c in clients:
            c.send(b"GET /info HTTP/1.1\r\nHost: x\r\n")
        while time.monotonic() - started < HEADER_TIMEOUT - 0.5:  # a header line now and then, never the end
            for c in clients:
                c.send(b"X-Slow: 1\r\n")
            assert httpx.get(server.http_url + "/info", headers=AUTH, timeout=5).status_code == 200
            time.sleep(0.3)
        for c in clients:
            c.sock.settimeout(HEADER_TIMEOUT + 5)
            reply = c.reply()
            assert reply is not None and closes(reply)
            check_envelope("tei", reply, 408)
            assert c.closed_within(5)
        assert time.monotonic() - started < HEADER_TIMEOUT + 5
    finally:
        for c in clients:
            c.sock.close()
    with Connection(server) as silent:  # nothing sent at all: closed after the header timeout too
        silent.sock.settimeout(HEADER_TIMEOUT + 5)
        reply = silent.reply()
        assert reply is not None and reply.status_code == 408 and silent.closed_within(5)


@pytest.mark.parametrize("family", ["openai", "tei"])
def test_a_slow_body_gets_408_in_the_routes_envelope_and_the_connection_closes(server, family):
    path, body = ROUTES[family]
    with Connection(server) as connection:
        started = time.monotonic()
        connection.send(raw_request("POST", path, headers={"Content-Length": str(len(body)),
                                                           "Content-Type": "application/json"}) + body[:5])
        connection.sock.settimeout(BODY_TIMEOUT + 5)
        reply = connection.reply()
        assert reply is not None and closes(reply)
        check_envelope(family, reply, 408)
        assert time.monotonic() - started < BODY_TIMEOUT + 5
        assert connection.closed_within(15)  # aiohttp lingers up to 10 s for the rest, then closes


def test_timeouts_are_settings_that_refuse_nonsense():
    config = ServerConfig()
    assert (config.http_header_timeout, config.http_body_timeout) == (30.0, 60.0)
    for name in ("http_header_timeout", "http_body_timeout", "http_keepalive_timeout"):
        with pytest.raises(ConfigError, match=name):
            ServerConfig(**{name: 0})


def test_a_client_that_leaves_while_sending_its_body_is_logged_once_at_info_and_counted_never_as_an_error(server):
    """A Content-Length longer than the body sent, a chunked body cut mid-chunk, and a crowd of clients dropping
    mid-body: one INFO line each, no traceback, a 499 in the request metrics."""
    def gone_count() -> float:
        return sum(v for k, v in server.metrics().items()
                   if k.startswith("attnserve_requests_total{") and 'code="499"' in k and 'protocol="http"' in k)

    before, log_before = gone_count(), len(server_log(server))
    cut = [raw_request("POST", "/v1/embeddings", EMBED[:10], {"Content-Length": str(len(EMBED))}),
           raw_request("POST", "/embed", b"20\r\n" + b'{"inputs": "a', {"Transfer-Encoding": "chunked",
                                                                       "Content-Type": "application/json"})]
    sent = 0
    for data in [*cut, *[cut[i % 2] for i in range(40)]]:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
            sock.sendall(data)
            time.sleep(0.05)  # the server is reading the body when the connection closes
        sent += 1
    deadline = time.monotonic() + 30
    while gone_count() - before < sent and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone_count() - before == sent
    log = server_log(server)[log_before:]
    assert "Traceback" not in log and "unexpected error" not in log and '"level": "error"' not in log
    lines = [json.loads(line) for line in log.splitlines() if '"client_disconnected"' in line]
    assert len(lines) == sent and {line["level"] for line in lines} == {"info"}
    assert {line["method"] for line in lines} == {"/v1/embeddings", "/embed"}


# --- docs/http.md's table of statuses, as curl sees them -------------------------------------------------------

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
    infer = json.loads(INFER)
    tensor = lambda text: {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
    for body, key, extra, expected in [
            (infer, None, {}, 401), (infer, "sk-wrong", {}, 401), (infer, KEY, {}, 200),
            (tensor("word " * 200), KEY, {"headers": ("X-Request-Timeout: 0.000001",)}, 504),
            (tensor("x" * 80_000), KEY, {}, 413)]:
        status, headers, payload = curl(server, f"/v2/models/{MODEL}/infer", body, key, **extra)
        assert status == expected, payload
        assert status == 200 or set(json.loads(payload)) == {"error"}, payload
    client = triton.InferenceServerClient(server.http_url.removeprefix("http://"))
    try:
        text = triton.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"keyed"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, [text])
        assert refused.value.status() == "401"
        assert client.infer(MODEL, [text], headers=AUTH).as_numpy("embedding").shape == (1, 384)
    finally:
        client.close()
    assert_healthy(server)


def test_api_keys_on_both_protocols_the_client_and_the_cli(server, tmp_path):
    # HTTP: every route but /health needs a key; either key (--api-key, --api-key-file) is one.
    unauthorized = 'attnserve_requests_total{code="401",method="/info",protocol="http"}'
    before = server.metrics().get(unauthorized, 0)
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
    (tmp_path / "in.txt").write_text("one\ntwo\nthree\n")
    encode = lambda out, *key: run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / out, "--server", server.target,
                                       "--no-progress", *key)
    refused = encode("refused.parquet")
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    done = encode("out.parquet", "--api-key", KEY)
    assert done.returncode == 0, done.stderr
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out.parquet").num_rows == 3
    metrics = server.metrics()
    assert metrics['attnserve_requests_total{code="UNAUTHENTICATED",method="Embed",protocol="grpc"}'] >= 4
    assert metrics[unauthorized] - before == 3
    log = server_log(server)
    assert KEY not in log and FILE_KEY not in log  # keys are never logged
