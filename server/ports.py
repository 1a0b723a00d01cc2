"""The ports a server listens on, checked before anything else starts: apart from server/app.py so that `serve`
checks them first of all, before `--workers auto` measures (and, on a first start, exports) the default model, and
before prometheus_client is imported (the workers' multiprocess metrics need that order)."""

from __future__ import annotations

import socket

from attnserve.config import ServerConfig
from attnserve.errors import ConfigError

# The ports a server listens on: (field of ServerConfig, what listens there).
PORTS = (("port", "gRPC"), ("http_port", "HTTP"), ("metrics_port", "metrics"))


def _bind_problem(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on (e.g. "Address already in use"); None when it can."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As grpc, aiohttp and prometheus's server do: a port in TIME_WAIT is no obstacle. No SO_REUSEPORT: a
        # server's workers share their ports with it (server/workers/), so a probe with it would bind beside another
        # attnserve's and find the port free; without it, any listener there, sharing or not, makes the bind fail.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as e:
            return e.strerror
    return None


def check_ports_free(config: ServerConfig) -> None:
    """Bind-test every configured port before anything starts (the models load), and name every one that is taken
    in one line: grpc's own failure is a multi-line core log, and finding them one start at a time is slow."""
    taken: dict[str, list[str]] = {}  # why -> the ports, as "0.0.0.0:50051 (gRPC, --port)"
    for name, door in PORTS:
        port = getattr(config, name)
        if port > 0 and (why := _bind_problem(config.host, port)):
            taken.setdefault(why, []).append(f"{config.host}:{port} ({door}, --{name.replace('_', '-')})")
    if taken:
        raise ConfigError("cannot listen on " + "; ".join(f"{' and '.join(ports)}: {why}"
                                                          for why, ports in taken.items()))
