"""`attnserve loadtest`: check the outputs, wait for the target, run the load, report."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from attnserve import __version__
from attnserve.client.client import Input
from attnserve.config import ClientConfig, LoadTestConfig
from attnserve.errors import AttnserveError

from .generator import LoadGenerator, LoadShape, Sample
from .grpc_call import grpc_target
from .http_call import http_target
from .kserve_call import kserve_grpc_target, kserve_http_target
from .report import format_table, summarize
from .workload import build_workload

TARGETS = {"grpc": grpc_target, "http": http_target, "kserve": kserve_grpc_target,
           "kserve-http": kserve_http_target}


def check_writable(path: str | None, flag: str) -> None:
    """Refuse an unwritable report path before the load, not after minutes of it."""
    if path is None or path == "-":
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise AttnserveError(f"{flag} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (Path(path).exists() and not os.access(path, os.W_OK)):
        raise AttnserveError(f"{flag} {path}: not writable by this user (uid {os.getuid()})")


def load_shape(config: LoadTestConfig) -> LoadShape:
    return LoadShape(0 if config.rate else config.concurrency, config.rate, config.duration, config.requests,
                     config.warmup)


async def run_load(config: LoadTestConfig, client: ClientConfig, batches: Sequence[Sequence[Input]]
                   ) -> tuple[dict, list[Sample], bool]:
    """Wait for the target, then load it; what it is (for the report), every sample, whether a signal stopped it."""
    async with TARGETS[config.protocol](config, client) as target:
        requests = [target.serialize(batch) for batch in batches]
        generator = LoadGenerator(target.call, requests, load_shape(config), client.timeout)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):  # stop sending, then report what was sent
            loop.add_signal_handler(sig, generator.stop)
        samples = await generator.run()
    return {"model": target.model, "protocol": config.protocol, "route": target.route}, samples, generator.stopped_early


def run_loadtest(config: LoadTestConfig, client: ClientConfig) -> int:
    check_writable(config.json, "--json")
    check_writable(config.plot, "--plot")
    if config.plot:
        from attnserve.client.plot import pyplot

        pyplot()  # a missing matplotlib is an error now, not after the run
    workload = build_workload(config)
    about, samples, stopped = asyncio.run(run_load(config, client, workload.batches))
    report = {"target": client.target, **about, "input": workload.description, "lb_policy": client.lb_policy,
              "stopped_early": stopped, **summarize(samples, load_shape(config), workload.inputs_per_request),
              "attnserve_version": __version__}
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
