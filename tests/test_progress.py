"""Progress of the long jobs without a bar: each step of an export, and of a first start's calibration, says when
it starts; a step that runs long says it still runs, so no one watches a silent terminal for minutes."""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest

from attnserve.export.artifacts import VARIANTS, build_artifacts
from attnserve.model.checkpoint import read_checkpoint
from attnserve.progress import Progress

from .checkpoints import save_sentence_transformer, save_tiny_bert
from .conftest import run_cli

# Every step of an embedder's export, in order.
EXPORT_STEPS = ["checking the tokenizer", "loading the weights", "tracing the graph",
                "optimizing: fusing attention", "int8: finding the feed-forwards' outlier units",
                "int8: measuring the int8 graph", "int8: writing the chosen int8 graph", "fp16: converting",
                "verification: PyTorch",
                *(f"verifying {name} against PyTorch" for name in VARIANTS)]
STEP_LINE = re.compile(r"^\[ *\d+\.\ds\] ")


@pytest.fixture(scope="module")
def tiny_checkpoint_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny_progress")
    return save_sentence_transformer(save_tiny_bert(tmp / "bert"), tmp / "st", "mean", True)


def steps_in(lines: list[str]) -> list[str]:
    return [STEP_LINE.sub("", line) for line in lines if STEP_LINE.match(line) and "... still " not in line]


def assert_in_order(said: list[str], expected: list[str]) -> None:
    at = 0
    for step in expected:
        found = next((i for i, line in enumerate(said[at:], at) if line.startswith(step)), None)
        assert found is not None, f"no step {step!r} after {said[:at]}: {said}"
        at = found + 1


def test_every_export_step_has_a_line_in_order(tiny_checkpoint_dir, tmp_path):
    lines: list[str] = []
    build_artifacts(read_checkpoint(tiny_checkpoint_dir), tmp_path / "artifacts", log=lines.append)
    assert lines[0].startswith("exporting ") and lines[-1].startswith("wrote ")
    assert_in_order(steps_in(lines), EXPORT_STEPS)
    assert sum(line.startswith("verified ") for line in lines) == len(VARIANTS)  # each variant's result too


def test_attnserve_export_prints_its_steps(tiny_checkpoint_dir, tmp_path):
    result = run_cli("export", "--checkpoint", tiny_checkpoint_dir, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert_in_order(steps_in(result.stderr.splitlines()), EXPORT_STEPS)


def test_a_long_step_says_it_still_runs():
    stamps: list[tuple[float, str]] = []
    with Progress(lambda line: stamps.append((time.monotonic(), line)), heartbeat=0.4) as progress:
        progress.step("waiting")
        time.sleep(2.0)
        progress.log("waited")
    beats = [line for _, line in stamps if "... still waiting (" in line]
    assert len(beats) >= 2, stamps
    gaps = [b - a for (a, _), (b, _) in zip(stamps, stamps[1:], strict=False)]
    assert max(gaps) < 0.4 + 0.6, stamps  # the heartbeat, plus the thread's poll and a busy machine's delay


def test_a_step_with_lines_of_its_own_needs_no_heartbeat():
    lines: list[str] = []
    with Progress(lines.append, heartbeat=0.5) as progress:
        progress.step("talking")
        for _ in range(8):
            time.sleep(0.1)
            progress.log("a line")
    assert not any("still" in line for line in lines), lines


def test_a_first_start_says_it_calibrates(artifacts, tmp_path):
    """The graph calibration of a first start on a CPU (seconds to tens of seconds) prints its steps."""
    fresh = tmp_path / "artifacts"
    shutil.copytree(artifacts, fresh, copy_function=os.link, ignore=shutil.ignore_patterns("calibration.json"))
    (tmp_path / "in.txt").write_text("hello\n")
    result = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o.parquet", "--artifacts", fresh,
                     "--no-progress")
    assert result.returncode == 0, result.stderr
    said = [line.removeprefix("attnserve: ") for line in result.stderr.splitlines()]
    assert_in_order(steps_in(said), ["calibration (first start on this CPU; recorded for the next): opening",
                                     "calibration: timing embeddings", "calibration: timing"])
    again = run_cli("encode", tmp_path / "in.txt", "-o", tmp_path / "o2.parquet", "--artifacts", fresh,
                    "--no-progress")
    assert again.returncode == 0 and "calibration" not in again.stderr.replace("calibration.json", ""), again.stderr
