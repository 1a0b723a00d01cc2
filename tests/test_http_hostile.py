"""The HTTP door under hostile input, on a real server over loopback with raw sockets where a polite client
cannot say the bytes: nothing answers 5xx or writes a traceback, no key reaches the log, a client's mistakes are
throttled WARNING lines, every route answers every error in its own family's envelope, a body that lies about its
encoding is a 400 and the connection says whether it goes on, HEAD answers wherever GET does, and slow clients
are cut off by the header and body timeouts.
"""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib

import httpx
import pytest

from attnserve.config import ServerConfig
from attnserve.errors import ConfigError
from server.logs import Throttle
from tests.serving import ServerProcess, serving

KEY = "hostile-Key-8d1f0c"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_REQUEST_BYTES = 64 * 1024
HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 2.0
EMBED = b'{"input": "hello", "model": ""}'


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    process = ServerProcess(artifacts, "--api-key", KEY, "--max-request-bytes", str(MAX_REQUEST_BYTES),
                            "--http-header-timeout", str(HEADER_TIMEOUT), "--http-body-timeout", str(BODY_TIMEOUT),
                            env={"ATTNSERVE_THREADS": "1"},
                            log_path=tmp_path_factory.mktemp("hostile") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="module")
def model(server) -> str:
    return httpx.get(server.http_url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]


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


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def closes(self) -> bool:
        return self.headers.get("connection", "").lower() == "close"

    def json(self):
        return json.loads(self.body)


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

    def reply(self) -> Reply | None:
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
        return Reply(status, headers, body)

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


def exchange(server, data: bytes) -> Reply | None:
    with Connection(server) as connection:
        connection.send(data)
        return connection.reply()


# --- keys and tracebacks never reach the log ---------------------------------------------------------------------

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


def test_malformed_requests_get_a_4xx_and_no_key_nor_traceback_reaches_the_log(server):
    for name, data in MALFORMED.items():
        reply = exchange(server, data.encode("latin-1"))
        assert reply is not None and 400 <= reply.status < 500, name
    # A flood of them: throttled to a few lines, never one a request.
    for _ in range(30):
        assert exchange(server, MALFORMED["bad chunk size"].encode()).status == 400
    # And a good request with the key, for the key's sake.
    assert httpx.post(server.http_url + "/v1/embeddings", content=EMBED, headers=AUTH, timeout=30).status_code == 200
    time.sleep(0.5)  # the last lines reach the file
    log = server_log(server)
    assert KEY not in log and KEY.encode().hex() not in log
    assert "Traceback" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert not [line for line in lines if line["level"] in ("error", "critical")]
    warnings = [line for line in lines if line.get("event") == "bad_http_request"]
    assert warnings and len(warnings) < 30
    assert all(set(w) <= {"time", "level", "logger", "message", "event", "error", "code", "peer", "held_back"}
               for w in warnings)


def test_a_request_that_does_not_parse_is_answered_in_json_that_quotes_none_of_its_bytes(server):
    # aiohttp answers these before any route runs, in text/plain quoting the bad line (the key included): the
    # door's TEI envelope instead (the path of an unparsed request is unknown), naming the kind of problem.
    for name, data in MALFORMED.items():
        reply = exchange(server, data.encode("latin-1"))
        assert reply is not None and reply.headers["content-type"].startswith("application/json"), (name, reply.body)
        body = check_envelope("tei", reply, reply.status)
        assert body["error_type"] == "Validation" and body["error"], name
        assert KEY.encode() not in reply.body and b"\\x" not in reply.body, (name, reply.body)
        assert reply.closes, name  # the framing past a bad head cannot be trusted


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

def _routes(model: str) -> dict[str, tuple[str, bytes]]:
    """A route of each family -> (path, a good body)."""
    kserve = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]})
    return {"openai": ("/v1/embeddings", EMBED), "openai-no-v1": ("/embeddings", EMBED),
            "tei": ("/embed", b'{"inputs": "hello"}'), "kserve": (f"/v2/models/{model}/infer", kserve.encode())}


def check_envelope(family: str, reply, status: int) -> dict:
    """Asserts the status and the envelope of `family`; returns the body. reply: an httpx reply or a Reply."""
    assert (reply.status_code if hasattr(reply, "status_code") else reply.status) == status
    body = reply.json()
    if family.startswith("openai"):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    elif family == "kserve":
        assert set(body) == {"error"} and isinstance(body["error"], str), body
    else:
        assert set(body) == {"error", "error_type"}, body
    return body


def message(body: dict) -> str:
    return body["error"]["message"] if isinstance(body["error"], dict) else body["error"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
@pytest.mark.parametrize("family", ["openai", "openai-no-v1", "tei", "kserve"])
def test_a_body_whose_content_encoding_lies_is_a_400_and_the_connection_says_what_follows(server, model,
                                                                                           family, encoding):
    path, body = _routes(model)[family]
    with Connection(server) as connection:
        connection.send(raw_request("POST", path, body, {"Content-Encoding": encoding}))
        reply = connection.reply()
        assert reply is not None
        assert encoding in message(check_envelope(family, reply, 400))
        if reply.closes:
            assert connection.closed_within(15)
            return
        connection.send(raw_request("POST", path, body))
        assert connection.reply().status == 200


@pytest.mark.parametrize("family", ["openai", "tei", "kserve"])
def test_real_gzip_and_deflate_bodies_work_and_keep_the_connection(server, model, family):
    path, body = _routes(model)[family]
    with Connection(server) as connection:
        for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            connection.send(raw_request("POST", path, data, {"Content-Encoding": encoding}))
            reply = connection.reply()
            assert reply.status == 200 and not reply.closes, reply.body


def test_an_error_answered_before_the_body_is_read_keeps_the_connection(server):
    # 401 and 404 come before the route reads the body: it is read past, and the next request is answered.
    with Connection(server) as connection:
        connection.send(raw_request("POST", "/v1/embeddings", EMBED, auth=False))
        assert connection.reply().status == 401
        connection.send(raw_request("POST", "/v2/models/nope/infer", b'{"inputs": []}'))
        assert connection.reply().status == 404
        connection.send(raw_request("POST", "/v1/embeddings", EMBED))
        assert connection.reply().status == 200


# --- HEAD, 405 and GET / -------------------------------------------------------------------------------------------

def _get_routes(model: str) -> list[str]:
    return ["/", "/health", "/v2/health/live", "/v2/health/ready", "/info", "/v1/models", f"/v1/models/{model}",
            "/openapi.json", "/v2", f"/v2/models/{model}", f"/v2/models/{model}/ready",
            f"/v2/models/{model}/versions/1"]


def test_head_answers_wherever_get_does_without_a_body(server, model):
    for path in _get_routes(model):
        get = httpx.get(server.http_url + path, headers=AUTH, timeout=30)
        head = httpx.head(server.http_url + path, headers=AUTH, timeout=30)
        assert (get.status_code, head.status_code) == (200, 200), path
        length = get.headers.get("content-length", "0")
        assert head.content == b"" and head.headers.get("content-length", "0") == length, path
    assert httpx.head(server.http_url + "/health", timeout=30).status_code == 200  # open, as GET is


def test_a_405_lists_the_methods_the_route_takes(server, model):
    for path in _get_routes(model)[1:]:  # POST / is TEI's embed
        reply = httpx.post(server.http_url + path, headers=AUTH, json={}, timeout=30)
        assert reply.status_code == 405 and {m.strip() for m in reply.headers["allow"].split(",")} == {"GET", "HEAD"}
    for path, _ in _routes(model).values():
        reply = httpx.put(server.http_url + path, headers=AUTH, json={}, timeout=30)
        # (KServe's infer path also matches its model-metadata GET route, a model name holding slashes.)
        assert reply.status_code == 405 and "POST" in {m.strip() for m in reply.headers["allow"].split(",")}, path


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_reading_an_infer_path_is_a_405_not_an_unknown_model(server, model, method):
    # A model name may hold slashes, but the metadata route takes none ending in a suffixed route's word: GET
    # /v2/models/NAME/infer is the infer route asked with the wrong method, whatever NAME is (as OPTIONS says).
    for path in (f"/v2/models/{model}/infer", f"/v2/models/{model}/versions/1/infer", "/v2/models/nope/infer"):
        reply = httpx.request(method, server.http_url + path, headers=AUTH, timeout=30)
        assert reply.status_code == 405 and reply.headers["allow"] == "POST", (path, reply.text)
        if method == "GET":
            assert "not allowed" in message(check_envelope("kserve", reply, 405))
    reply = httpx.request("OPTIONS", server.http_url + f"/v2/models/{model}/infer", headers=AUTH, timeout=30)
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
             "/": "tei", "/v2/models/{model}/infer": "kserve"}


@pytest.mark.parametrize("path", list(FAMILY_OF))
def test_every_error_of_every_route_is_in_its_familys_envelope(server, model, path):
    family, url = FAMILY_OF[path], server.http_url + path.format(model=model)
    errors = {
        401: httpx.post(url, content=b"{}", timeout=30),
        400: httpx.post(url, content=b"{nope", headers=AUTH, timeout=30),
        405: httpx.put(url, content=b"{}", headers=AUTH, timeout=30),
        413: httpx.post(url, content=b" " * (MAX_REQUEST_BYTES + 1), headers=AUTH, timeout=30),
        # X-Request-Timeout is read by every route that computes: an invalid one is the route's 400.
    }
    for status, reply in errors.items():
        assert reply.status_code == status, (status, reply.text)
        check_envelope(family, reply, status)
        assert reply.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("path,family", [("/v1/embeddings", "openai"), ("/embeddings", "openai"),
                                         ("/v1/attention", "openai"), ("/v1/rerank", "openai"),
                                         ("/v2/models/nope/infer", "kserve")])
def test_an_unknown_model_is_a_404_in_the_familys_envelope(server, path, family):
    body = {"/v1/attention": {"model": "nope", "inputs": "a"},
            "/v1/rerank": {"model": "nope", "query": "q", "documents": ["d"]},
            "/v2/models/nope/infer": {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]},
            }.get(path, {"model": "nope", "input": "a"})
    reply = httpx.post(server.http_url + path, json=body, headers=AUTH, timeout=30)
    assert "nope" in message(check_envelope(family, reply, 404))


@pytest.mark.parametrize("path,family", [("/v1/nope", "openai"), ("/embeddings/x", "openai"), ("/v2/nope", "kserve"),
                                         ("/nope", "tei"), ("//v1/embeddings", "openai"),
                                         ("/v1/%2e%2e/health", "openai"), ("/" + "x" * 8000, "tei")])
def test_unknown_paths_are_404_in_the_envelope_of_their_prefix(server, path, family):
    reply = exchange(server, raw_request("GET", path))
    check_envelope(family, reply, 404)


def _first_status(server, head: bytes) -> int:
    """The status of the first reply to a head sent alone (no body follows): 100 when the body is invited."""
    with Connection(server) as connection:
        connection.send(head)
        while b"\r\n" not in connection.buffer:
            assert connection._fill()
        return int(connection.buffer.split(b" ", 2)[1])


@pytest.mark.parametrize("family", ["openai", "tei", "kserve"])
def test_a_body_that_will_be_refused_is_not_invited_by_100_continue(server, model, family):
    # 100 Continue starts a client's upload: a body over max_request_bytes, or sent without a valid key, is refused
    # before a byte of it is sent; a good one is still invited.
    path, body = _routes(model)[family]
    expect = {"Expect": "100-continue"}
    too_large = raw_request("POST", path, headers={**expect, "Content-Length": str(MAX_REQUEST_BYTES + 1)})
    assert _first_status(server, too_large) == 413
    for auth in ({}, {"Authorization": "Bearer wrong"}):
        no_key = raw_request("POST", path, headers={**expect, "Content-Length": str(len(body)), **auth}, auth=False)
        assert _first_status(server, no_key) == 401
    with Connection(server) as connection:
        connection.send(raw_request("POST", path, headers={**expect, "Content-Length": str(len(body)),
                                                           "Content-Type": "application/json"}))
        while b"\r\n\r\n" not in connection.buffer:
            assert connection._fill()
        assert connection.buffer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        connection.buffer = b""
        connection.send(body)
        assert connection.reply().status == 200
    # An expectation other than 100-continue is ignored (RFC 9110 allows it): the request is answered as any.
    check_envelope(family, exchange(server, raw_request("POST", path, b"{}", headers={"Expect": "something-else"})),
                   400)


# --- protocol odds that must simply work ---------------------------------------------------------------------------

def test_pipelined_http10_chunked_and_expect_continue_requests_are_answered(server):
    with Connection(server) as connection:
        connection.send(raw_request("POST", "/v1/embeddings", EMBED) * 3 + raw_request("GET", "/info"))
        assert [connection.reply().status for _ in range(4)] == [200, 200, 200, 200]
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(EMBED), EMBED)
        connection.send(raw_request("POST", "/v1/embeddings", chunked, {"Transfer-Encoding": "chunked",
                                                                       "Content-Type": "application/json"}))
        assert connection.reply().status == 200
        connection.send(raw_request("POST", "/v1/embeddings", headers={
            "Expect": "100-continue", "Content-Length": str(len(EMBED)), "Content-Type": "application/json"}))
        time.sleep(0.2)
        connection.send(EMBED)
        assert connection.reply().status == 200
    http10 = raw_request("POST", "/v1/embeddings", EMBED).replace(b"HTTP/1.1", b"HTTP/1.0", 1)
    assert exchange(server, http10).status == 200


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
            # Others are served meanwhile.
            assert httpx.get(server.http_url + "/info", headers=AUTH, timeout=5).status_code == 200
            time.sleep(0.3)
        for c in clients:
            c.sock.settimeout(HEADER_TIMEOUT + 5)
            reply = c.reply()
            assert reply is not None and reply.status == 408 and reply.closes
            check_envelope("tei", reply, 408)
            assert c.closed_within(5)
        assert time.monotonic() - started < HEADER_TIMEOUT + 5
    finally:
        for c in clients:
            c.sock.close()


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(server):
    with Connection(server) as connection:
        connection.sock.settimeout(HEADER_TIMEOUT + 5)
        reply = connection.reply()
        assert reply is not None and reply.status == 408 and connection.closed_within(5)


@pytest.mark.parametrize("family", ["openai", "tei"])
def test_a_slow_body_gets_408_in_the_routes_envelope_and_the_connection_closes(server, model, family):
    path, body = _routes(model)[family]
    with Connection(server) as connection:
        started = time.monotonic()
        connection.send(raw_request("POST", path, headers={"Content-Length": str(len(body)),
                                                           "Content-Type": "application/json"}) + body[:5])
        connection.sock.settimeout(BODY_TIMEOUT + 5)
        reply = connection.reply()
        assert reply is not None and reply.closes
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
    mid-body: the client's network trouble is not the server's failure. Each is one INFO line, with no traceback
    and no `unexpected error`, and a 499 in the request metrics."""
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
