"""One front-door worker of `serve --workers N` (started by supervisor.py, its settings read from stdin): the gRPC and
HTTP doors on the ports every worker shares, over the engine process's models (front.py). It stops on SIGTERM or
SIGINT with the drain of one process, and when the engine process is gone, with exit status 1."""

from __future__ import annotations

import asyncio
import logging
import pickle
import sys

from threadpoolctl import threadpool_limits

from attnserve.config import ServerConfig

from .. import logs
from ..app import Server, run_until_signalled
from ..metrics import Metrics
from .front import HELLO_TIMEOUT_S, EngineLink, RemoteModels

log = logging.getLogger("attnserve.server")


async def run(config: ServerConfig, link_address: str) -> int:
    # The reply's analyses (attention rollout's products) run here: numpy's BLAS kept to one thread, as in one process.
    threadpool_limits(limits=1, user_api="blas")
    sys.setswitchinterval(config.gil_switch_interval_ms / 1e3)  # as in the engine process (config.py says why)
    stopping = asyncio.Event()
    server: Server | None = None

    def engine_lost() -> None:
        if server is not None:
            asyncio.ensure_future(server.not_serving())
        stopping.set()

    link = EngineLink(link_address, engine_lost)
    try:
        table = await link.connect()
    except asyncio.TimeoutError:
        log.error("the engine process did not answer this worker within %g s", HELLO_TIMEOUT_S,
                  extra={"fields": {"event": "engine_silent"}})
        await link.close()
        return 1
    server = Server(RemoteModels(table, link), config, Metrics(), worker=True)
    try:
        await run_until_signalled(server, stopping)
    finally:
        await link.close()
    return 1 if link.lost else 0


def main() -> int:
    settings = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 (from the supervisor, our parent, by a pipe)
    config: ServerConfig = settings["config"]
    logs.configure(settings["log_level"], config.log_format)
    return asyncio.run(run(config, settings["link"]))


if __name__ == "__main__":
    sys.exit(main())
