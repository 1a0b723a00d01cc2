"""`serve --workers auto` (server/workers/auto.py): the count follows the measured door and graph costs, is measured
on a model's first start on a machine and read back on the next, and never fails a start."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest

from attnserve.server.workers.auto import FORMAT_VERSION, Measured, choose, predicted_rate, record_path
from attnserve.server_process import ServerProcess


@pytest.mark.parametrize("door, graph, graph_cpu, cpus, chosen", [
    # all-MiniLM-L6-v2 on 2 CPUs, as measured: the graph's CPU limits; a second door only takes from it
    (0.34e-3, 1.97e-3, 3.72e-3, 2, 1),
    # a 1-layer hidden-32 model (bench/bench_front_door.py): the door is all the cost. On 2 CPUs a second door is
    # predicted 1.27x, within the margin (measured: 1.02x to 1.24x); on 4 CPUs, 3 doors give 2.4x
    (0.29e-3, 0.012e-3, 0.012e-3, 2, 1),
    (0.29e-3, 0.012e-3, 0.012e-3, 4, 3),
    (0.29e-3, 1e-6, 1e-6, 1, 1),  # one CPU: never more doors than CPUs
    (0.1e-3, 1e-2, 1e-4, 8, 1),  # doors that could serve 10x what the graph can: one is enough
])
def test_the_choice_follows_the_costs_and_is_never_more_processes_for_nothing(door, graph, graph_cpu, cpus, chosen):
    assert choose(Measured(door=door, graph=graph, graph_cpu=graph_cpu, cpus=cpus)) == chosen


def test_a_gpu_gets_doors_up_to_the_cores():
    # an H200's MiniLM fp16: about 2.3 million tokens/s (docs/performance.md, "CUDA"), 12 tokens a text
    gpu = Measured(door=0.29e-3, graph=12 / 2.3e6, graph_cpu=0.02e-3, cpus=16)
    assert 8 < choose(gpu) <= 16  # the doors share the cores with the engine process
    assert predicted_rate(16, gpu) > 10 * predicted_rate(1, gpu)


def test_auto_measures_on_the_first_start_and_reads_the_record_after(artifacts, tmp_path):
    cache = tmp_path / "cache"

    def start(name: str) -> str:
        server = ServerProcess(artifacts, "--workers", "auto", "--log-format", "text", log_path=tmp_path / name,
                               env={"ATTNSERVE_CACHE": str(cache), "ATTNSERVE_WORKERS": None})
        try:
            server.wait_serving(timeout=120)
        finally:
            assert server.terminate() == 0
        return (tmp_path / name).read_text()

    first = start("first.log")
    measured = re.search(r"workers auto: (\d+) \(measured on this machine's first start, recorded in", first)
    assert measured, first
    count = int(measured.group(1))
    file = cache / "workers" / record_path(artifacts).name  # named by the manifest's digest
    record = json.loads(file.read_text())
    assert record["format_version"] == FORMAT_VERSION
    (entry,) = record["choices"].values()
    assert entry["workers"] == count and entry["measured"]["cpus"] >= 1 and entry["measured"]["graph"] > 0
    assert choose(Measured(**entry["measured"])) == count
    second = start("second.log")
    assert f"workers auto: {count} (recorded in {file}" in second, second
    file.write_text("{not json")  # a record that is not one is measured again, never a failed start
    third = start("third.log")
    assert "ignoring the workers record" in third and f"workers auto: {count} (measured" in third, third


def test_a_large_model_on_a_cpu_is_not_loaded_twice_to_be_timed(artifacts, tmp_path, caplog, monkeypatch):
    from attnserve.config import EngineConfig, ServerConfig
    from attnserve.server.workers import auto

    copy = tmp_path / "large"
    copy.mkdir()
    for file in artifacts.iterdir():  # never a second link to a data file: onnx refuses to read one with two
        if file.is_file() and file.suffix != ".data":
            os.link(file, copy / file.name)
    with open(copy / "weights.data", "wb") as f:  # sparse: its size, not its disk
        f.truncate(auto.LARGE_ON_CPU + 1)
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    opened = []
    monkeypatch.setattr("attnserve.engine.engine.Engine.from_directory", lambda *a, **k: opened.append(a))
    with caplog.at_level(logging.INFO, logger="attnserve.server"):
        assert auto.auto_workers(EngineConfig(artifacts=str(copy), provider="cpu"), ServerConfig()) == 1
    assert not opened and "workers auto: 1 (not measured: a model of" in caplog.text
