"""The load over HTTP: OpenAI's POST /v1/embeddings, through aiohttp's client.

Balancing: the target's name is resolved once, before the load, to every address it has (the system's resolver,
or the DNS server a dns://SERVER/NAME:PORT target names, as gRPC's dns resolver does), and requests go to those
addresses in turn (round robin). aiohttp keeps a pool of keep-alive connections per address; the pools share one
limit, the closed loop's concurrency, so each stream has its connection and no request waits for one. Resolving
once, rather than per connection, is what spreads the load: aiohttp resolving a name itself would open every
connection to the first address that answers. A replica added during the run is not seen; one gone is answered
with CONNECTION_FAILED, retried (on the next address) as any refusal is.

What comes back is read as the gRPC load reads its status: 200 with `usage.prompt_tokens` as the tokens; an
error's reason is the OpenAI envelope's `code` in capitals (QUEUE_FULL, SHUTTING_DOWN), retryable by the same
rule as over gRPC (client/status.py RETRYABLE_REASONS), else by the status alone, as a proxy would answer (429,
502, 503). Retry-After (retry-after-ms first, as the openai SDK reads it) is the server's wait.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from ipaddress import ip_address
from urllib.parse import urlsplit

import aiohttp
import orjson

from attnserve.client.client import Input
from attnserve.client.health import NotServing
from attnserve.client.reach import why_no_http
from attnserve.client.status import RETRYABLE_REASONS
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError, ConfigError

from .generator import Answer
from .target import MODEL_INFO_TIMEOUT_SECONDS, Target

EMBEDDINGS_PATH, INFO_PATH, HEALTH_PATH = "/v1/embeddings", "/info", "/health"
FRAMED_HEADER = "Inference-Header-Content-Length"  # KServe's: where a body's JSON ends and its binary tensors begin
# The server's deadline header: it answers 504 once the request's time is spent, as gRPC's deadline does.
TIMEOUT_HEADER = "X-Request-Timeout"
# The client waits this much longer than the deadline it sends, so the server's 504 comes back rather than a
# client-side TIMEOUT racing it.
CLIENT_GRACE_SECONDS = 1.0
# Statuses that say "not now" when no attnserve reason came with them: from a proxy, a load balancer, another server.
RETRYABLE_STATUSES = frozenset({429, 502, 503})
HEALTH_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class HttpTarget:
    """Where the load goes: http(s)://HOST:PORT, HOST:PORT, or dns://[DNS_SERVER:PORT]/HOST:PORT."""

    scheme: str
    host: str
    port: int
    dns_server: tuple[str, int] | None = None  # None: the system's resolver

    @classmethod
    def parse(cls, target: str, tls: bool) -> HttpTarget:
        dns_server = None
        if target.startswith("dns:"):
            parts = urlsplit(target)
            if parts.netloc:
                server = urlsplit(f"//{parts.netloc}")
                dns_server = (server.hostname or "", server.port or 53)
            target = parts.path.lstrip("/")
        parts = urlsplit(target if "//" in target else f"//{target}")
        scheme = parts.scheme or ("https" if tls else "http")
        try:
            port = parts.port
        except ValueError:
            port = None
        if scheme not in ("http", "https") or not parts.hostname or port is None or parts.path.strip("/"):
            raise ConfigError(f"--target {target!r}: over http give http(s)://HOST:PORT, HOST:PORT or "
                              "dns://[DNS_SERVER:PORT]/HOST:PORT (the server's --http-port)")
        return cls(scheme, parts.hostname, port, dns_server)

    @property
    def authority(self) -> str:
        return f"{netloc(self.host)}:{self.port}"


def netloc(address: str) -> str:
    """An address as a URL has it: an IPv6 one in brackets."""
    return f"[{address}]" if ":" in address else address


def _is_address(host: str) -> bool:
    try:
        ip_address(host)
        return True
    except ValueError:
        return False


async def resolve(target: HttpTarget) -> list[str]:
    """Every address of the target's host, in the order the resolver gave them."""
    if _is_address(target.host):
        return [target.host]
    if target.dns_server:
        addresses = await asyncio.to_thread(_ask_dns_server, target.host, *target.dns_server)
    else:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise AttnserveError(f"{target.authority}: cannot resolve {target.host}: {error}") from None
        addresses = [str(info[4][0]) for info in found]
    unique = list(dict.fromkeys(addresses))
    if not unique:
        raise AttnserveError(f"{target.authority}: {target.host} has no address")
    return unique


def _ask_dns_server(name: str, server: str, port: int) -> list[str]:
    try:
        from dnslib import QTYPE, DNSRecord
    except ImportError:
        raise AttnserveError("a dns://SERVER/ target over http needs dnslib (pip install dnslib)") from None
    try:
        reply = DNSRecord.parse(DNSRecord.question(name, "A").send(server, port, timeout=5))
    except OSError as error:
        raise AttnserveError(f"DNS server {server}:{port}: no answer for {name}: {error}") from None
    return [str(record.rdata) for record in reply.rr if record.rtype == QTYPE.A]


def ssl_context(client: ClientConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=client.tls_ca)
    if client.tls_cert:
        context.load_cert_chain(client.tls_cert, client.tls_key)
    return context


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The server's wait in seconds: retry-after-ms, else Retry-After's whole seconds (a date is not used)."""
    for name, scale in (("retry-after-ms", 1e-3), ("Retry-After", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError):
            continue
    return None


def error_reason(body: bytes) -> str | None:
    """An OpenAI error envelope's code as attnserve's reason ("queue_full" -> "QUEUE_FULL"); None if absent."""
    try:
        code = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return code.upper() if isinstance(code, str) else None


def error_message(body: bytes) -> str:
    """The message of an error body, in TEI's envelope (/info's) or OpenAI's; else the body's start."""
    try:
        error = orjson.loads(body)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def openai_tokens(body: bytes, headers: Mapping[str, str]) -> int:
    return int(orjson.loads(body)["usage"]["prompt_tokens"])


class HttpSender:
    """Sends on one aiohttp session, to the target's addresses in turn: POSTs to `path`, and reads a 200's tokens
    with tokens_of(body, headers). framed: each request starts with its JSON's length (4 bytes, little-endian), sent
    as KServe's Inference-Header-Content-Length header (kserve_call.py's binary tensors)."""

    def __init__(self, session: aiohttp.ClientSession, target: HttpTarget, addresses: list[str],
                 client: ClientConfig, path: str = EMBEDDINGS_PATH,
                 tokens_of: Callable[[bytes, Mapping[str, str]], int] = openai_tokens, framed: bool = False):
        self._session, self._target = session, target
        self.path, self._tokens_of, self._framed = path, tokens_of, framed
        self._bases = itertools.cycle([f"{target.scheme}://{netloc(a)}:{target.port}" for a in addresses])
        self._server_hostname = None if _is_address(target.host) or target.scheme == "http" else target.host
        self.headers = {"Host": target.authority, "Content-Type": "application/json"}
        if client.api_key:
            self.headers["Authorization"] = f"Bearer {client.api_key}"
        self._timeouts: dict[float, tuple[aiohttp.ClientTimeout, dict[str, str]]] = {}

    async def get(self, base: str, path: str, timeout: float) -> tuple[int, bytes]:
        async with self._session.get(base + path, headers=self.headers, server_hostname=self._server_hostname,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            return reply.status, await reply.read()

    async def post(self, base: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        async with self._session.post(base + path, data=body, headers=self.headers,
                                      server_hostname=self._server_hostname,
                                      timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            return reply.status, await reply.read()

    def bases(self, n: int) -> list[str]:
        return [next(self._bases) for _ in range(n)]

    def _for(self, timeout: float) -> tuple[aiohttp.ClientTimeout, dict[str, str]]:
        """The client timeout and headers of a request with this deadline, made once."""
        if timeout not in self._timeouts:
            self._timeouts[timeout] = (aiohttp.ClientTimeout(total=timeout + CLIENT_GRACE_SECONDS),
                                       {**self.headers, TIMEOUT_HEADER: f"{timeout:g}"})
        return self._timeouts[timeout]

    async def call(self, request: bytes, timeout: float) -> Answer:
        client_timeout, headers = self._for(timeout)
        data: bytes | memoryview = request
        if self._framed:
            headers = {**headers, FRAMED_HEADER: str(int.from_bytes(request[:4], "little"))}
            data = memoryview(request)[4:]
        try:
            async with self._session.post(next(self._bases) + self.path, data=data, headers=headers,
                                          timeout=client_timeout, server_hostname=self._server_hostname) as reply:
                body = await reply.read()
                status, wait = reply.status, retry_after(reply.headers) if reply.status != 200 else None
                reply_headers = reply.headers
        except aiohttp.ClientConnectorError:
            return Answer("CONNECTION_FAILED", ok=False, refused=True)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError):
            return Answer("CONNECTION_LOST", ok=False, refused=True)
        except asyncio.TimeoutError:
            return Answer("TIMEOUT", ok=False)
        if status == 200:
            return Answer("200", ok=True, tokens=self._tokens_of(body, reply_headers))
        reason = error_reason(body)
        refused = reason in RETRYABLE_REASONS if reason else status in RETRYABLE_STATUSES
        return Answer(str(status), ok=False, refused=refused, retry_after=wait)


async def wait_serving(sender: HttpSender, target: str, where: HttpTarget, addresses: int, seconds: float,
                       health_path: str = HEALTH_PATH) -> None:
    """Until GET health_path on one of the addresses is 200; seconds 0: ask each once. target: as the user gave
    it."""
    end = time.monotonic() + seconds
    while True:
        last, unanswered = "", False
        for base in sender.bases(addresses):
            try:
                status, _ = await sender.get(base, health_path, MODEL_INFO_TIMEOUT_SECONDS)
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                last = f"{type(error).__name__}: {error}"
                unanswered = isinstance(error, aiohttp.ClientError)
                continue
            if status == 200:
                return
            last = f"HTTP {status}"
        if time.monotonic() >= end:
            # No HTTP answer: say what is (not) there (nothing, or the gRPC port), rather than aiohttp's words.
            explained = await asyncio.to_thread(why_no_http, where.host, where.port) if unanswered else None
            if explained:
                raise NotServing(explained, None, explained=True)
            raise NotServing(f"{target} is not serving: {last}{'' if seconds else ' (--wait-ready waits for it)'}",
                             None)
        await asyncio.sleep(HEALTH_POLL_SECONDS)


async def model_info(sender: HttpSender, target: str) -> dict:
    """TEI's /info: the model's name (the OpenAI route's `model`) and its dtype."""
    (base,) = sender.bases(1)
    try:
        status, body = await sender.get(base, INFO_PATH, MODEL_INFO_TIMEOUT_SECONDS)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        raise AttnserveError(f"{target}: no model info: {type(error).__name__}: {error}") from None
    if status != 200:
        raise AttnserveError(f"{target}: no model info: HTTP {status}: {error_message(body)}")
    return orjson.loads(body)


@asynccontextmanager
async def open_sender(config: LoadTestConfig, client: ClientConfig, health_path: str = HEALTH_PATH, **sending
                      ) -> AsyncIterator[tuple[HttpSender, HttpTarget, int]]:
    """A sender to the target once it serves (GET health_path is 200): (the sender, where it sends, how many
    addresses). sending: HttpSender's path, tokens_of and framed."""
    target = HttpTarget.parse(client.target, client.tls or bool(client.tls_ca or client.tls_cert))
    addresses = await resolve(target)
    # Closed loop: a connection per stream. Open loop: as many as the schedule has in flight.
    connector = aiohttp.TCPConnector(limit=config.concurrency if not config.rate else 0, limit_per_host=0,
                                     ssl=ssl_context(client) if target.scheme == "https" else False)
    async with aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",)) as session:
        sender = HttpSender(session, target, addresses, client, **sending)
        await wait_serving(sender, client.target, target, len(addresses), config.wait_ready, health_path)
        yield sender, target, len(addresses)


@asynccontextmanager
async def http_target(config: LoadTestConfig, client: ClientConfig) -> AsyncIterator[Target]:
    async with open_sender(config, client) as (sender, target, addresses):
        info = await model_info(sender, client.target)
        model, fmt = info["model_id"], config.encoding_format
        truncate = {} if config.truncate is None else {"truncate": config.truncate}  # unset: the server decides

        def serialize(inputs: Sequence[Input]) -> bytes:
            return orjson.dumps({"input": list(inputs), "model": model, "encoding_format": fmt, **truncate},
                                option=orjson.OPT_SERIALIZE_NUMPY)

        yield Target(sender.call, serialize, f"{model}, {info['model_dtype']}",
                     f"http ({fmt}), round robin over {addresses} address(es) of {target.host}")
