"""Why a target did not answer, in words a person can act on: nothing listens there, or a server of the other
protocol does (the HTTP port given to a gRPC client, or the gRPC port to an HTTP client).

The clients ask only after a call failed without an answer from attnserve, so a working target costs nothing.
The probe opens one connection and sends what every gRPC client sends first, HTTP/2's connection preface and
an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server answers with its SETTINGS frame and no complaint; an
HTTP/1.1 server answers with a status line (a 400 or 505), since the preface reads as a request line
`PRI * HTTP/2.0`.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from attnserve.config import ServerConfig

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + SETTINGS, empty
SETTINGS_FRAME_TYPE = 0x04
PROBE_SECONDS = 2.0
# The ports a server listens on unless told otherwise, named in the advice (from the configuration, not copied).
GRPC_PORT = ServerConfig.__dataclass_fields__["port"].default
HTTP_PORT = ServerConfig.__dataclass_fields__["http_port"].default

NOTHING, HTTP1, HTTP2, UNKNOWN = "nothing", "http/1.1", "http/2", "unknown"


def host_port(target: str) -> tuple[str, int] | None:
    """HOST:PORT, [V6]:PORT, http(s)://HOST:PORT or dns:///HOST:PORT as (host, port); None for a target the
    probe does not read (several addresses, a Unix socket, no port)."""
    if target.startswith("dns:"):
        target = urlsplit(target).path.lstrip("/")
    elif target.split(":", 1)[0] in ("ipv4", "ipv6", "unix", "unix-abstract", "vsock"):
        return None
    parts = urlsplit(target if "//" in target else f"//{target}")
    try:
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname and port else None


def what_listens(host: str, port: int, timeout: float = PROBE_SECONDS) -> str:
    """NOTHING (refused, or no such host), HTTP1, HTTP2 (gRPC, or another HTTP/2 server) or UNKNOWN."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(PREFACE)
            reply = b""
            while len(reply) < 9:
                data = conn.recv(64)
                if not data:
                    break
                reply += data
    except ConnectionRefusedError:
        return NOTHING
    except OSError:  # a timeout, a reset, a name that does not resolve: the client's own message says more
        return UNKNOWN
    if reply.startswith(b"HTTP/"):
        return HTTP1
    if len(reply) >= 9 and reply[3] == SETTINGS_FRAME_TYPE:
        return HTTP2
    return UNKNOWN


def no_server(authority: str) -> str:
    return f"no attnserve server at {authority} (start one with `attnserve serve`)"


def why_no_grpc(target: str, flag: str = "--target") -> str | None:
    """Why a gRPC call to target found no gRPC server; None when the probe cannot tell (a server speaking TLS
    to a client that does not is UNKNOWN: the client's own message stands). flag: the command's flag that names
    the server (encode's is --server)."""
    address = host_port(target)
    if address is None:
        return None
    authority = _authority(*address)
    found = what_listens(*address)
    if found == NOTHING:
        return no_server(authority)
    if found == HTTP1:
        return f"{authority} speaks HTTP, not gRPC: the gRPC port is {GRPC_PORT} by default ({flag})"
    return None


def why_no_http(host: str, port: int) -> str | None:
    """Why an HTTP request to host:port found no HTTP server; None when the probe cannot tell."""
    authority = _authority(host, port)
    found = what_listens(host, port)
    if found == NOTHING:
        return no_server(authority)
    if found == HTTP2:
        return f"{authority} speaks gRPC, not HTTP: the HTTP port is {HTTP_PORT} by default (--target)"
    return None


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
