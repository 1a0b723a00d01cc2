"""`attnserve serve --workers N`: this process is the engine process and the workers' supervisor.

It loads the models, runs their batchers, warm-up and calibration, and answers the workers' submits
(engine_side.py); it serves the metrics port, every process's metrics summed (prometheus_client's multiprocess
mode, PROMETHEUS_MULTIPROC_DIR set by the CLI before the client library is imported). It starts N front-door
workers (worker.py), which listen on the gRPC and HTTP ports together (SO_REUSEPORT: the kernel spreads the
connections), and reserves those ports first by binding them itself without listening, so that port 0 means one
free port for all of them.

A worker that dies is started again at once (its in-flight requests' clients saw their connection reset, and the
engine drops what it had queued for them); more than MAX_RESTARTS in RESTART_WINDOW_S ends the server with exit
status 1. If this process dies (the engine), each worker fails its requests in flight with UNAVAILABLE / 503 and
exits 1; there is no engine to restart in place, and the orchestrator restarts the server (as vLLM's API server
exits when its engine core does).

SIGTERM (or SIGINT) drains: the workers are sent SIGTERM and drain as one process does (new requests refused, those
in flight answered, through this process's batchers), then the batchers close and this process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from threadpoolctl import threadpool_limits

from attnserve.config import EngineConfig, ServerConfig
from attnserve.engine.engine import Engine
from attnserve.errors import ConfigError

from ..app import check_ports_free, start_calibration, start_models
from ..auth import ApiKeys
from ..metrics import Metrics
from ..model_sources import model_sources
from ..models import Models
from ..tls import grpc_credentials, http_ssl_context
from .engine_side import EngineService
from .front import EngineEntry, ModelEntry, ModelTable

log = logging.getLogger("attnserve.server")

MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0
# After the grace period, how long a draining worker may take before it is killed.
STOP_MARGIN_S = 5.0


def model_table(models: Models) -> ModelTable:
    def entry(engine: Engine) -> EngineEntry:
        return EngineEntry(engine.manifest.directory, engine.takes_token_types, engine.provider, engine.precision,
                           engine.config)

    return ModelTable([ModelEntry(m.name, m.info, m.pooling, entry(m.engine),
                                  {task: entry(engine) for task, (engine, _) in m.tasks.items()})
                       for m in models.all])


def reserve(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT, not listening: the workers bind the same port beside it (port
    0: the one the kernel picked), and no other program can take it while the server runs."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    reserved = socket.socket(family, socket.SOCK_STREAM)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    reserved.bind((host.strip("[]"), port))
    return reserved


class Supervisor:
    def __init__(self, engine_config: EngineConfig, config: ServerConfig, log_level: str):
        self.engine_config, self.config, self.log_level = engine_config, config, log_level
        self._workers: dict[int, asyncio.subprocess.Process] = {}
        self._restarts: list[float] = []
        self._stopping = asyncio.Event()
        self._failed: str | None = None
        self._directory = Path(tempfile.mkdtemp(prefix="attnserve-engine-"))
        self._address = f"ipc://{self._directory / 'engine.sock'}"
        self._reserved: list[socket.socket] = []
        self._watchers: list[asyncio.Task] = []

    async def run(self) -> int:
        config = self.config
        check_ports_free(config)  # before the models load, which can take minutes on a first run
        # Unreadable TLS files or API keys fail here, in one line, not in every worker started again and again.
        grpc_credentials(config), http_ssl_context(config), ApiKeys(config.api_keys())
        threadpool_limits(limits=1, user_api="blas")  # as one process does (app.serve)
        for name in ("port", "http_port"):
            if getattr(config, name) >= 0:
                self._reserved.append(reserve(config.host, getattr(config, name)))
        ports = {name: sock.getsockname()[1] for name, sock in
                 zip([n for n in ("port", "http_port") if getattr(config, n) >= 0], self._reserved, strict=True)}
        self.worker_config = config.__class__(**{**vars(config), **ports})
        metrics = Metrics()
        metrics_http = self._serve_metrics(metrics)  # before the models load: a port taken fails at once
        models = Models.load(model_sources(self.engine_config.artifacts, config, self.engine_config.precision,
                                           self.engine_config.provider), self.engine_config, config, metrics)
        service = EngineService(models, lambda: model_table(models))
        service.bind(self._address)
        service.start()
        await start_models(models)
        stop_calibration = threading.Event()
        calibration = start_calibration(models, stop_calibration)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        try:
            for _ in range(config.worker_count):
                await self._start_worker(service)
            starting = asyncio.ensure_future(service.wait_greeted(config.worker_count))
            stopped = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
            starting.cancel()
            stopped.cancel()
            if not self._stopping.is_set():  # every worker serves
                self._serving(models, ports, metrics_http)
                await self._stopping.wait()
        finally:
            await self._stop_workers()
            for model in models.all:
                for batcher in model.batchers:
                    batcher.close()
            for model in models.all:
                for batcher in model.batchers:
                    await batcher.join()
            await service.close()
            stop_calibration.set()
            calibration.join()
            if metrics_http is not None:
                metrics_http.shutdown()
                metrics_http.server_close()
            for model in models.all:
                model.shutdown()
            for sock in self._reserved:
                sock.close()
            shutil.rmtree(self._directory, ignore_errors=True)
            log.info("stopped", extra={"fields": {"event": "stopped"}})
        if self._failed:
            log.error(self._failed, extra={"fields": {"event": "workers_failed"}})
            return 1
        return 0

    def _serving(self, models: Models, ports: dict[str, int], metrics_http) -> None:
        config = self.config
        log.info("serving %s on gRPC %s:%d%s with %d workers", models.default.name, config.host, ports.get("port"),
                 f", HTTP port {ports['http_port']}" if "http_port" in ports else "", config.worker_count,
                 extra={"fields": {
                     "event": "serving", "model": models.default.name, "models": [m.name for m in models.all],
                     "workers": config.worker_count, "port": ports.get("port"), "http_port": ports.get("http_port"),
                     "metrics_port": metrics_http.server_port if metrics_http else None,
                     "graphs": {m.name: m.engine.describe() for m in models.all}}})

    def _serve_metrics(self, metrics: Metrics):
        if self.config.metrics_port < 0:
            return None
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # every process's files in PROMETHEUS_MULTIPROC_DIR, summed
        try:
            server, _ = start_http_server(self.config.metrics_port, self.config.host, registry=registry)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {self.config.host}:{self.config.metrics_port}: "
                              f"{e.strerror}") from None
        return server

    async def _start_worker(self, service: EngineService) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "attnserve.server.workers.worker", stdin=asyncio.subprocess.PIPE)
        assert process.stdin is not None
        # The configuration goes through a pipe: API keys are not put in an environment other processes can read.
        process.stdin.write(pickle.dumps({"config": self.worker_config, "log_level": self.log_level,
                                          "link": self._address}))
        await process.stdin.drain()
        process.stdin.close()
        self._workers[process.pid] = process
        self._watchers.append(asyncio.get_running_loop().create_task(self._watch(process, service)))
        if self._stopping.is_set():  # the drain began while it started: it drains too
            process.send_signal(signal.SIGTERM)

    async def _watch(self, process: asyncio.subprocess.Process, service: EngineService) -> None:
        code = await process.wait()
        self._workers.pop(process.pid, None)
        _mark_dead(process.pid)
        if self._stopping.is_set():
            return
        dropped = service.forget(f"worker-{process.pid}".encode())
        log.error("worker %d exited with %s; %d of its requests were dropped; starting another", process.pid,
                  code if code >= 0 else signal.Signals(-code).name, dropped,
                  extra={"fields": {"event": "worker_died", "pid": process.pid, "code": code, "dropped": dropped}})
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(self._restarts) > MAX_RESTARTS:
            self._failed = (f"{len(self._restarts)} workers died within {RESTART_WINDOW_S:g} s; stopping the server "
                            "(see the workers' lines above)")
            self._stopping.set()
            return
        await self._start_worker(service)

    async def _stop_workers(self) -> None:
        for process in list(self._workers.values()):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        waiting = [p.wait() for p in self._workers.values()]
        if waiting:
            await asyncio.wait([asyncio.ensure_future(w) for w in waiting],
                               timeout=self.config.grace_seconds + STOP_MARGIN_S)
            for process in self._workers.values():
                if process.returncode is None:
                    log.warning("worker %d did not stop within the grace period; killed", process.pid)
                    process.kill()
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)


def _mark_dead(pid: int) -> None:
    """A worker's live gauges leave the sums (prometheus_client's multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


async def serve_workers(engine_config: EngineConfig, config: ServerConfig, log_level: str) -> int:
    return await Supervisor(engine_config, config, log_level).run()
