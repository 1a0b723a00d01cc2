"""The default model's cache: processes started together on an empty cache build it once."""

from __future__ import annotations

import os
import subprocess
import sys

from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for
from attnserve.engine.manifest import load_manifest


def test_concurrent_first_runs_build_the_cache_once(tmp_path, monkeypatch):
    """Three processes on one empty cache, as replicas start: one exports (in its build child), the others wait on
    the directory's lock and then find its manifest, and every one gets the same verified directory."""
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    code = "from attnserve.default_model import resolve_artifacts; print(resolve_artifacts(None))"
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=dict(os.environ)) for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err for _, err in outputs]
    expected = artifacts_dir_for(DEFAULT_MODEL_NAME)
    assert [out.strip() for out, _ in outputs] == [str(expected)] * 3
    assert sum(err.count(" to ONNX: ") for _, err in outputs) == 1, [err for _, err in outputs]
    load_manifest(expected)  # every file it lists, whole
