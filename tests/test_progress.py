"""Progress of the long jobs without a bar: each step of an export, and of a first start's calibration, says when it
starts; a step that runs long says it still runs, so no one watches a silent terminal for minutes."""

from __future__ import annotations

import re
import shutil
import time

import pytest

from attnserve.export.artifacts import all_variants
from attnserve.model.checkpoint import read_checkpoint
from attnserve.progress import Progress

from .checkpoints import save_sentence_transformer, save_tiny_bert
from .conftest import link_but_data, run_cli

# Every step of an embedder's `export --all` (onnxruntime's graphs: OpenVINO is not installed here), in order, each
# stage announced with its number and estimate.
EXPORT_STEPS = ["checking the tokenizer", "stage 1 of 6: trace", "loading the weights", "PyTorch's outputs",
                "tracing the graph in fp32", "verifying embeddings against PyTorch",
                "stage 2 of 6: the fused graph", "optimizing", "verifying embeddings_fused against PyTorch",
                "stage 3 of 6: the fp16 graph", "fp16: ", "verifying embeddings_fp16 against PyTorch",
                "stage 4 of 6: the quantized embeddings' ranges", "loading the weights", "PyTorch's embeddings of the",
                "stage 5 of 6: the int8 graph", "int8: finding the feed-forwards' outlier units",
                "int8: measuring the int8 graph", "int8: writing the chosen int8 graph",
                "verifying embeddings_int8 against PyTorch", "verifying embeddings_int8_skip_layer_norm against",
                "stage 6 of 6: the attention graphs", "loading the weights", "tracing the attention graph",
                "verifying attention against PyTorch", "verifying attention_last against PyTorch"]
STEP_LINE = re.compile(r"^\[ *\d+\.\ds\] ")
STAGE = re.compile(r"stage \d+ of \d+: .* \(about \d+ (s|min); about \d+ (s|min) left in all\)$")


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
    result = run_cli("export", "--all", "--checkpoint", tiny_checkpoint_dir, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("exporting ") and lines[-1].startswith("wrote ")
    assert_in_order(steps_in(lines), EXPORT_STEPS)
    assert all(STAGE.search(line) for line in lines if "stage " in line and " of 6: " in line), lines
    variants = all_variants(read_checkpoint(tiny_checkpoint_dir))
    assert sum(line.startswith("verified ") for line in lines) == len(variants)  # each variant's result
    # What reads as a failure is said as what it is: no "0 Attention nodes" for a family whose attention the
    # optimizer does not fuse, and here, a BERT, every layer's attention fused.
    assert not any(" 0 Attention" in line or "error" in line.lower() for line in lines), lines
    assert any("attention fused in all 2 layers" in line for line in lines), lines


def test_the_first_export_of_a_run_is_one_stage(tiny_checkpoint_dir, tmp_path):
    """Without --all, export builds the graph a CPU run needs: one stage, the trace, with its estimate."""
    result = run_cli("export", "--checkpoint", tiny_checkpoint_dir, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    stages = [line for line in steps_in(result.stderr.splitlines()) if line.startswith("stage ")]
    assert len(stages) == 1 and STAGE.search(stages[0]) and stages[0].startswith("stage 1 of 1: trace"), stages


def test_a_long_step_says_it_still_runs():
    stamps: list[tuple[float, str]] = []
    with Progress(lambda line: stamps.append((time.monotonic(), line)), heartbeat=0.4) as progress:
        progress.step("waiting")
        time.sleep(2.0)
        progress.log("waited")
    assert len([line for _, line in stamps if "... still waiting (" in line]) >= 2, stamps
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
    shutil.copytree(artifacts, fresh, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))
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
