"""`attnserve loadtest`: check the outputs, wait for the target, run the load, report."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import grpc

from attnserve import __version__
from attnserve.client.client import open_channel
from attnserve.client.health import NotServing, wait_until_serving
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError
from attnserve.v1 import encoder_pb2 as pb
from attnserve.v1 import encoder_pb2_grpc

from .generator import LoadGenerator, LoadShape, Sample, embed_call
from .report import format_table, summarize
from .workload import build_workload

# The model's description, asked once the target serves (not the load's own --timeout).
MODEL_INFO_TIMEOUT_SECONDS = 10.0


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an unwritable report path before the load, not after minutes of it."""
    if path is None or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise AttnserveError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise AttnserveError(f"{flag} {path}: not writable by this user (uid {os.getuid()})")


def wait_for_target(client: ClientConfig, seconds: float) -> None:
    """Until the target's health service says SERVING; seconds 0: ask once."""
    with open_channel(client, health_checked=False) as channel:  # it asks for the health itself
        try:
            wait_until_serving(channel, client.target, seconds)
        except NotServing as error:
            raise NotServing(f"{error}{'' if seconds else ' (--wait-ready waits for it)'}", error.status) from None


def load_shape(config: LoadTestConfig) -> LoadShape:
    return LoadShape(0 if config.rate else config.concurrency, config.rate, config.duration, config.requests,
                     config.warmup)


async def run_load(config: LoadTestConfig, client: ClientConfig, requests: list[bytes]
                   ) -> tuple[pb.ModelInfo, list[Sample], bool]:
    async with open_channel(client, aio=True) as channel:
        try:  # also connects the channel, so that the first requests of the load do not pay for it
            info = await encoder_pb2_grpc.EncoderStub(channel).GetModelInfo(pb.GetModelInfoRequest(),
                                                                             timeout=MODEL_INFO_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            raise AttnserveError(f"{client.target}: no model info: {error.code().name}: {error.details()}") from None
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
    wait_for_target(client, config.wait_ready)
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
