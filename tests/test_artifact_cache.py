"""The default model's cache: processes started together on an empty cache build it once."""

from __future__ import annotations

import shutil
import threading
import time

import attnserve.export.artifacts as artifacts_module
from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for, resolve_artifacts


def test_concurrent_first_runs_build_the_cache_once(artifacts, tmp_path, monkeypatch):
    """Two replicas on one empty cache: the second waits for the first's build instead of replacing it.

    The export itself is the real artifact directory copied in slowly, so the test takes a second, not a minute.
    """
    monkeypatch.setenv("ATTNSERVE_CACHE", str(tmp_path / "cache"))
    builds = []

    def slow_build(ckpt, out, log=None):
        builds.append(out)
        time.sleep(0.5)
        shutil.copytree(artifacts, out)

    monkeypatch.setattr(artifacts_module, "build_artifacts", slow_build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_artifacts(None))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [artifacts_dir_for(DEFAULT_MODEL_NAME)] * 3
    assert len(builds) == 1 and (results[0] / "manifest.json").is_file()
