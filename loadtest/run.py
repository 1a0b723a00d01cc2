"""`attnserve loadtest`: check the outputs, wait for the target, run the load, report."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve import __version__
from attnserve.client.client import open_channel
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .generator import LoadGenerator, LoadShape, Sample, embed_call
from .report import format_table, summarize
from .workload import build_workload

# Asking whether the target serves (not the load's own --timeout): poll interval, and the least and most
# one question may take.
READY_POLL_SECONDS, PROBE_SECONDS, READY_TIMEOUT_SECONDS = 0.5, 2.0, 10.0


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an unwritable report path before the load, not after minutes of it."""
    if path is None or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise AttnserveError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise AttnserveError(f"{flag} {path}: not writable by this user (uid {os.getuid()})")


async def wait_until_serving(channel: grpc.aio.Channel, target: str, seconds: float) -> pb.ModelInfo:
    """The model the target serves, once its health service says SERVING; seconds 0: ask once."""
    health = health_pb2_grpc.HealthStub(channel)
    end = time.monotonic() + seconds
    last = "no answer"
    while True:
        probe = max(PROBE_SECONDS, min(end - time.monotonic(), READY_TIMEOUT_SECONDS))
        try:
            status = await health.Check(health_pb2.HealthCheckRequest(), timeout=probe, wait_for_ready=seconds > 0)
            if status.status == health_pb2.HealthCheckResponse.SERVING:
                return await encoder_pb2_grpc.EncoderStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                                 timeout=READY_TIMEOUT_SECONDS)
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
        except grpc.aio.AioRpcError as error:
            last = f"{error.code().name}: {error.details()}"
        if time.monotonic() + READY_POLL_SECONDS >= end:
            waited = f" after waiting {seconds:g} s" if seconds else " (--wait-ready waits for it)"
            raise AttnserveError(f"{target} is not serving{waited}: {last}")
        await asyncio.sleep(READY_POLL_SECONDS)


def load_shape(config: LoadTestConfig) -> LoadShape:
    return LoadShape(0 if config.rate else config.concurrency, config.rate, config.duration, config.requests,
                     config.warmup)


async def run_load(config: LoadTestConfig, client: ClientConfig, requests: list[bytes]
                   ) -> tuple[pb.ModelInfo, list[Sample], bool]:
    async with open_channel(client, aio=True) as channel:
        info = await wait_until_serving(channel, client.target, config.wait_ready)
        generator = LoadGenerator(embed_call(channel), requests, load_shape(config), client.timeout)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop sending, then report what was sent
            loop.add_signal_handler(sig, generator.stop)
        samples = await generator.run()
    return info, samples, generator.stopped_early


def run_loadtest(config: LoadTestConfig, client: ClientConfig) -> int:
    check_writable(config.json, "--json")
    check_writable(config.plot, "--plot")
    if config.plot:
        from attnserve.client.plot import pyplot

        pyplot()  # a missing matplotlib is an error now, not after the run
    workload = build_workload(config)
    info, samples, stopped = asyncio.run(run_load(config, client, workload.requests))
    report = {"target": client.target, "model": f"{info.model}, {info.provider} {info.precision}",
              "input": workload.description, "lb_policy": client.lb_policy, "stopped_early": stopped,
              **summarize(samples, load_shape(config), workload.inputs_per_request), "attnserve_version": __version__}
    if config.json == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_table(report))
        if config.json:
            Path(config.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if config.plot:
        from .plot import draw_latency

        draw_latency(samples, report, Path(config.plot))
    if report["requests"]["sent"] and not report["requests"]["ok"]:
        raise AttnserveError(f"no request succeeded: {report['codes']}")
    return 0
