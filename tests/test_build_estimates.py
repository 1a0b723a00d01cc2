"""A build's estimates follow this machine's measured speed (issue 45: "about 6 s" took 17 s on a busy 2-core
machine): engine/speed.py's probe against the reference machine's, the correction the last export recorded, and
within an export the pace of the stages already run. The probe's result and the clock are given, not timed."""

from __future__ import annotations

import re

import pytest

from attnserve.engine import speed
from attnserve.engine.builds import estimated_seconds
from attnserve.engine.manifest import load_manifest
from attnserve.export.artifacts import build_artifacts
from attnserve.model.checkpoint import read_checkpoint
from attnserve.progress import Progress

from .checkpoints import save_tiny_bert

REFERENCE = speed.REFERENCE_PROBE_SECONDS


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A cache of the test's own: no correction recorded, and none left behind."""
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))


def probed(monkeypatch, seconds: float) -> None:
    """The probe's result, as if this machine had just measured it."""
    monkeypatch.setattr(speed, "_probed_once", lambda: seconds)


def test_the_slowdown_is_the_probe_against_the_reference_times_the_recorded_correction():
    assert speed.slowdown(probe=REFERENCE) == pytest.approx(1.0)
    assert speed.slowdown(probe=3 * REFERENCE) == pytest.approx(3.0)
    speed.learn(estimated=60.0, pace=2.0)  # the last export took twice its estimates
    assert speed.recorded_correction() == pytest.approx(2.0)
    assert speed.slowdown(probe=3 * REFERENCE) == pytest.approx(6.0)
    speed.learn(estimated=2.0, pace=5.0)  # a tiny export's fixed costs teach nothing
    assert speed.recorded_correction() == pytest.approx(2.0)
    assert speed.slowdown(probe=1e6) == speed.FACTOR_LIMITS[1]  # bounded


def test_a_builds_estimate_scales_with_the_measured_speed(artifacts, monkeypatch):
    """estimated_seconds(manifest, names, gpu), as BackgroundBuilds asks it for a Retry-After."""
    manifest = load_manifest(artifacts, check_hashes=False)
    probed(monkeypatch, REFERENCE)
    at_reference = estimated_seconds(manifest, ["attention", "attention_last"], False)
    probed(monkeypatch, 2.5 * REFERENCE)
    busy = estimated_seconds(manifest, ["attention", "attention_last"], False)
    assert busy == pytest.approx(2.5 * at_reference)


def test_an_exports_stage_estimates_scale_with_the_measured_speed(monkeypatch, tmp_path):
    """The table says about 4 s for a tiny model's trace; on a machine measured 10 times as slow, 40 s or so."""
    probed(monkeypatch, 10 * REFERENCE)
    lines: list[str] = []
    build_artifacts(read_checkpoint(save_tiny_bert(tmp_path / "bert")), tmp_path / "out", log=lines.append,
                    variants=["embeddings"])
    stage = next(line for line in lines if "stage 1 of 1: trace" in line)
    seconds = int(re.search(r"\(about (\d+) s;", stage)[1])  # type: ignore[index]
    assert 40 <= seconds <= 50, stage


def test_the_stages_run_set_the_pace_of_those_left():
    now = [0.0]
    lines: list[str] = []
    progress = Progress(lines.append, clock=lambda: now[0])
    progress.plan([("first", 2.0), ("second", 6.0)])
    progress.stage("first")
    assert lines[-1].endswith("stage 1 of 2: first (about 2 s; about 8 s left in all)")
    now[0] = 6.0  # it took 3 times its estimate
    progress.stage("second")
    assert lines[-1].endswith("stage 2 of 2: second (about 18 s; about 18 s left in all)")
    now[0] = 6.0 + 12.0
    assert progress.pace(running=True) == pytest.approx(18.0 / 8.0)
