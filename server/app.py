"""One serving process: the gRPC door (encoder service, KServe v2, TEI's, health, reflection) and the HTTP door over one
core and one batcher per model served, with TLS, API keys, metrics and a graceful stop shared by both."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from threadpoolctl import threadpool_limits

from attnserve.config import EngineConfig, ServerConfig
from attnserve.engine.calibration import CalibrationStopped
from attnserve.engine.engine import Engine
from attnserve.engine.token_ids import made_up_token_ids
from attnserve.engine.tokenizer import TokenizedInput
from attnserve.errors import ConfigError

from . import tracing
from .auth import ApiKeys
from .core import Core
from .grpc.auth import ApiKeyInterceptor
from .grpc.guard import RequestGuard, core_receive_limit
from .grpc.health import HealthService
from .grpc.kserve import InferenceService
from .grpc.kserve import add_to_server as add_kserve_to_server
from .grpc.service import PROTOCOL, SERVICE_NAME, EncoderService, add_to_server
from .grpc.tei import add_to_server as add_tei_to_server
from .http.door import HttpDoor
from .metrics import Metrics
from .model_sources import model_sources
from .models import Models, ServedModel
from .ports import check_ports_free
from .tls import grpc_credentials, http_ssl_context

if TYPE_CHECKING:  # a front-door worker's models: named here only, so that one process never imports ZeroMQ
    from .workers.front import RemoteModels

log = logging.getLogger("attnserve.server")

# Room for the reply's framing beyond max_response_bytes, which the request check estimates.
RESPONSE_SLACK_BYTES = 1 << 20
# On shutdown, how long no new call must arrive before grpc's own stop (whose late arrivals get CANCELLED),
# and the most time spent waiting for that quiet once the requests in flight are done.
DRAIN_QUIET_SECONDS, DRAIN_QUIET_LIMIT_SECONDS = 0.5, 3.0
# grpc's own stop, once attnserve's calls are done.
STOP_GRACE_SECONDS = 1.0
# Threads for tokenization and reply serialization (the event loop does neither).
IO_THREADS = 4


def _calibrate(models: list[ServedModel], stop: threading.Event) -> None:
    """Time each model's graphs, then start serve --build's builds: after the timing, which a build beside it would
    slow and so mislead."""
    for model in models:
        try:
            model.calibrate(stop)
        except CalibrationStopped:
            log.info("calibration stopped by the drain; the next start times the graphs again")
            return
        except Exception:  # noqa: BLE001 (the server serves on as it started: the defaults)
            log.exception("calibrating %s failed; it keeps its default graph and batch size", model.name)
    for model in models:
        model.start_builds()


def warm_up(engine: Engine) -> list[tuple[bool, float, int]]:
    """Run every graph once at a small and a full-budget shape, so the first request does not pay for it: the
    attention graphs where they are built (where they are not, the first attention request builds them:
    engine/builds.py).

    Returns (attention, seconds, tokens) of each graph's larger run: the batcher's first estimate of its speed.
    """
    budget = engine.batch_tokens
    ids = np.full(engine.manifest.served_max_length, made_up_token_ids(engine.manifest.vocab_size)[0],
                  dtype=np.int64)  # in any vocabulary
    timings = []
    for attention in (False, True):
        if attention and not engine.has_attention_graphs:
            continue
        # The attention graph only up to the length its maps are served at (a long-context model's would not fit).
        T = min(engine.manifest.attention_cap if attention else engine.manifest.served_max_length, budget)
        for rows, length in ((1, min(8, T)), (max(1, min(budget // T, engine.config.max_batch_size)), T)):
            if attention and rows > 1:
                rows = 2  # the attention graph's outputs grow with T^2: a small batch warms it enough
            batch = [TokenizedInput(ids[:length], False)] * rows
            if attention and engine.has_last_layer_graph:  # the attention lane's other graph (Engine.run)
                engine.run(batch, attention=True, last_layer=True)
            if not attention and engine.has_narrow_session:  # --pair-batches' half-width session
                engine.run(batch, narrow=True)
            started = time.perf_counter()
            engine.run(batch, attention=attention)
        timings.append((attention, time.perf_counter() - started, rows * length))
    return timings


async def start_models(models: Models) -> None:
    """Start every model's batchers and warm every model up at once, each in its own inference thread; the warm-up
    runs seed the batchers' estimates of their speed."""
    for model in models.all:
        for batcher in model.batchers:  # a model with task adapters has one per task
            batcher.start()
    loop = asyncio.get_running_loop()
    warmed = await asyncio.gather(*(loop.run_in_executor(model.inference, warm_up, model.engine)
                                    for model in models.all))
    for model, timings in zip(models.all, warmed, strict=True):
        for attention, seconds, tokens in timings:
            model.batcher.learn_rate(attention, seconds, tokens, tokens)


def start_calibration(models: Models, stop: threading.Event) -> threading.Thread:
    """A first start on this CPU served at once, on each precision's default graph and batch budget: its graphs
    are timed now, one model after another, beside the requests (engine/calibration.py; recorded for the next
    start). What it chooses takes over from the next batch."""
    thread = threading.Thread(target=_calibrate, args=(models.all, stop), name="attnserve-calibration", daemon=True)
    thread.start()
    return thread


class Server:
    """One serving process: started by start(), stopped by stop(); `attnserve serve` runs serve()."""

    def __init__(self, models: Models | RemoteModels, config: ServerConfig, metrics: Metrics, worker: bool = False):
        """models: loaded with Models.load(..., metrics), each with its batcher and inference thread; or, worker
        True, one front-door worker of `serve --workers N` (server/workers/): the doors alone, on ports shared with
        the other workers, over the engine process's models (RemoteModels), which owns the batchers, warm-up,
        calibration and the metrics port."""
        self.models, self.config, self.metrics, self.worker = models, config, metrics, worker
        # The models whose engines, batchers and calibration run in this process; None in a worker (the engine
        # process's): the doors serve self.models either way, through the core's contract (server/contract.py).
        self.local = models if isinstance(models, Models) else None
        self._io = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="attnserve-io")
        self.health = HealthService()
        self.port = self.metrics_port = self.http_port = None
        self._metrics_http = None
        self._grpc: grpc.aio.Server | None = None
        self._http: HttpDoor | None = None
        self._batchers_started = False
        self._calibration: threading.Thread | None = None  # a first start's graph timing (_calibrate)
        self._stop_calibration = threading.Event()
        self.core: Core | None = None
        self._health_names: tuple[str, ...] = ()

    async def start(self) -> None:
        config, models = self.config, self.models
        # Unreadable TLS files or API keys fail before anything starts.
        credentials, http_ssl, keys = grpc_credentials(config), http_ssl_context(config), ApiKeys(config.api_keys())
        tracing.setup(config.otlp_endpoint)
        self.core = Core(models, config, self._io, IO_THREADS)
        server = self._grpc_server(self.core, keys)
        # The server, the service and each model ("attnserve.v1.Encoder/NAME"): SERVING only after warm-up.
        health_names = self._health_names = ("", SERVICE_NAME,
                                             *(f"{SERVICE_NAME}/{model.name}" for model in models.all))
        for service in health_names:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server)
        await self._listen(server, self.core, credentials, http_ssl, keys)
        self._grpc = server
        await server.start()
        started = time.perf_counter()
        if self.local is not None:
            await start_models(self.local)
            self._batchers_started = True
        for service in health_names:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self.core.warmed_up()
        if self.local is None:
            log.info("worker %d serving", os.getpid(), extra={"fields": {"event": "worker_serving"}})
            return
        self._log_serving(self.local, credentials is not None, keys, started)
        self._calibration = start_calibration(self.local, self._stop_calibration)

    def _grpc_server(self, core: Core, keys: ApiKeys) -> grpc.aio.Server:
        """The gRPC server with every service but health's states and reflection, not yet listening."""
        config = self.config
        guard = RequestGuard(config.max_request_bytes, self._count_refused)
        # The key is checked first: a call without one is refused before its bytes are parsed.
        server = grpc.aio.server(interceptors=[ApiKeyInterceptor(keys, self._count_refused), guard], options=[
            # max_request_bytes itself is enforced per message by the guard, which answers it; grpc's own
            # limit, higher, only bounds what one message can take before that.
            ("grpc.max_receive_message_length", core_receive_limit(config.max_request_bytes)),
            ("grpc.max_send_message_length", config.max_response_bytes + RESPONSE_SLACK_BYTES),
            # A port in use is an error, not a second listener; the workers of --workers N share theirs.
            ("grpc.so_reuseport", int(self.worker)),
            *([("grpc.max_connection_age_ms", int(config.max_connection_age * 1e3)),
               ("grpc.max_connection_age_grace_ms", int(config.grace_seconds * 1e3))]
              if config.max_connection_age else []),
        ])
        add_to_server(EncoderService(core, self.metrics), server)
        add_kserve_to_server(InferenceService(core, self.metrics), server)
        add_tei_to_server(core, self.metrics, server)  # TEI's gRPC API, for its clients as they are
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        return server

    async def _listen(self, server: grpc.aio.Server, core: Core, credentials: grpc.ServerCredentials | None,
                      http_ssl: ssl.SSLContext | None, keys: ApiKeys) -> None:
        """Bind every door's port (gRPC, metrics, HTTP), each failure one ConfigError naming its address."""
        config = self.config
        address = f"{config.host}:{config.port}"
        if not self.worker:  # the supervisor of the workers checked them before any started
            check_ports_free(config)
        try:
            self.port = (server.add_secure_port(address, credentials) if credentials
                         else server.add_insecure_port(address))
        except RuntimeError as e:
            raise ConfigError(f"cannot listen on {address}: {e}") from None
        if not self.port:
            raise ConfigError(f"cannot listen on {address} (in use, or not an address of this machine?)")
        if config.metrics_port >= 0 and not self.worker:
            from prometheus_client import start_http_server

            try:
                self._metrics_http, _ = start_http_server(config.metrics_port, config.host,
                                                          registry=self.metrics.registry)
            except OSError as e:
                raise ConfigError(
                    f"cannot serve metrics on {config.host}:{config.metrics_port}: {e.strerror}") from None
            self.metrics_port = self._metrics_http.server_port
        if config.http_port >= 0:
            self._http = HttpDoor(core, self.metrics, keys, config, self._io)
            try:
                self.http_port = await self._http.start(config.host, config.http_port, http_ssl, STOP_GRACE_SECONDS,
                                                        reuse_port=self.worker)
            except OSError as e:
                raise ConfigError(f"cannot listen for HTTP on {config.host}:{config.http_port}: {e.strerror}") from None

    def _log_serving(self, models: Models, tls: bool, keys: ApiKeys, started: float) -> None:
        """The line a person looks for: what serves, and where each door is (in JSON, the same as one event)."""
        config = self.config
        default = models.default.engine
        addresses = self.addresses(tls)
        more = f" and {len(models.all) - 1} more" if len(models.all) > 1 else ""
        log.info("serving %s%s on %s", models.default.name, more,
                 ", ".join(f"{door} {where}" for door, where in addresses.items()), extra={"fields": {
                     "event": "serving", "model": models.default.name, "models": [m.name for m in models.all],
                     "provider": default.provider, "precision": default.precision,
                     "graphs": {m.name: m.engine.describe() for m in models.all},
                     "address": f"{config.host}:{self.port}", "http_port": self.http_port, "addresses": addresses,
                     "tls": tls, "mutual_tls": bool(config.tls_client_ca),
                     "api_keys": keys.required, "metrics_port": self.metrics_port,
                     "warm_up_ms": round((time.perf_counter() - started) * 1e3)}})

    async def not_serving(self) -> None:
        """Health NOT_SERVING for the server and every model (a worker whose engine process is gone)."""
        for service in self._health_names:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    def addresses(self, tls: bool) -> dict[str, str]:
        """Where each door listens, as a client names it: gRPC host:port, HTTP and metrics as URLs."""
        host = self.config.host
        netloc = f"[{host}]" if ":" in host else host
        found = {"gRPC": f"{netloc}:{self.port}"}
        if self.http_port is not None:
            found["HTTP"] = f"{'https' if tls else 'http'}://{netloc}:{self.http_port}"
            found["explorer"] = f"{found['HTTP']}/explorer"  # the attention explorer, in a browser
        if self.metrics_port is not None:
            found["metrics"] = f"http://{netloc}:{self.metrics_port}/metrics"
        return found

    async def stop(self) -> None:
        """Drain: NOT_SERVING, new requests refused, requests in flight finish within the grace period.

        New requests are refused by both doors (UNAVAILABLE, HTTP 503: clients retry elsewhere) while the
        listeners stay open, and the doors stop only once the core is idle: grpc cancels calls that arrive
        during its shutdown with CANCELLED (grpc/grpc#41785), which clients do not retry.
        """
        grace = self.config.grace_seconds
        log.info("draining", extra={"fields": {"event": "draining", "grace_seconds": grace}})
        end = time.monotonic() + grace
        self._stop_calibration.set()  # a first start's timing leaves the CPU to the requests in flight
        await self.health.enter_graceful_shutdown()
        local = self.local.all if self.local is not None else []  # a worker's batchers are the engine process's
        for model in local:
            for batcher in model.batchers:
                batcher.close()
        if self.core is not None:
            self.core.drain()
            if await self.core.wait_quiet(grace, quiet=0.0):  # the requests in flight are done
                left = end - time.monotonic()
                await self.core.wait_quiet(min(DRAIN_QUIET_LIMIT_SECONDS, left), DRAIN_QUIET_SECONDS)
            else:
                log.warning("grace period over; cancelling the requests still in flight",
                            extra={"fields": {"event": "grace_expired"}})
        # Health watchers have seen NOT_SERVING: their streams end now, so grpc's stop has none to cancel.
        await self.health.close(min(STOP_GRACE_SECONDS, max(0.0, end - time.monotonic())))
        if self._grpc is not None:
            # What is left holds no work: calls that arrived just now.
            await self._grpc.stop(min(STOP_GRACE_SECONDS, max(0.0, end - time.monotonic())))
        if self._http is not None:
            await self._http.stop()
        if self._batchers_started:
            for model in local:
                for batcher in model.batchers:
                    await batcher.join()
        if self.core is not None:
            await self.core.close()
        self._release()
        await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)  # the spans still buffered
        log.info("stopped", extra={"fields": {"event": "stopped"}})

    def _count_refused(self, method: str, code: grpc.StatusCode) -> None:
        """A call RequestGuard ended (a message over the size limit or not parsing), counted as the service counts."""
        service, _, name = method.strip("/").rpartition("/")
        if service == SERVICE_NAME:
            self.metrics.observe_request(PROTOCOL, name, code.name)

    async def abandon(self) -> None:
        """After a failed start: release what was taken, without a drain (nothing was served)."""
        if self._grpc is not None:
            await self._grpc.stop(0)
        if self._http is not None:
            await self._http.stop()
        self._release()

    def _release(self) -> None:
        # A calibration still timing stops before its next run and is awaited: onnxruntime aborted the process
        # ("terminate called without an active exception") when it exited under a session's run.
        self._stop_calibration.set()
        if self._calibration is not None:
            self._calibration.join()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
        self._io.shutdown(wait=False)
        if self.local is not None:
            for model in self.local.all:
                model.shutdown()


async def serve(engine_config: EngineConfig, config: ServerConfig) -> int:
    """Serve the models of engine_config.artifacts or config.model / model_repository until SIGTERM or SIGINT,
    then drain and return 0."""
    check_ports_free(config)  # before the models load, which can take minutes on a first run
    sys.setswitchinterval(config.gil_switch_interval_ms / 1e3)
    # onnxruntime's threads do the serving's heavy work. numpy's BLAS (attention rollout's matrix products, MaxSim)
    # would start threads of its own on the same cores, whose spinning slowed the attention graph's runs beside
    # them by 1.6x (bench/bench_attention.py: rollout-only requests 0.40 of embeddings' tokens/s, 0.63 with one).
    threadpool_limits(limits=1, user_api="blas")
    metrics = Metrics()
    models = Models.load(model_sources(engine_config.artifacts, config, engine_config.precision,
                                       engine_config.provider), engine_config, config, metrics)
    await run_until_signalled(Server(models, config, metrics))
    return 0


async def run_until_signalled(server: Server, stopping: asyncio.Event | None = None) -> None:
    """Start the server and serve until SIGTERM or SIGINT (or until `stopping` is set otherwise), then drain."""
    stopping = stopping or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await server.start()
    except BaseException:
        await server.abandon()
        raise
    try:
        await stopping.wait()
    finally:
        await server.stop()
        await _let_calls_finish(STOP_GRACE_SECONDS)


async def _let_calls_finish(timeout: float) -> None:
    """grpc's stop returns once its core holds no call, while the tasks of the calls it ended may still be
    unwinding; the loop's end would cancel them, and grpc logs each such cancellation with a raw traceback."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=timeout)
