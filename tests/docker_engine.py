"""A Docker engine for the tests that need one: the running one, or a dockerd started here and stopped after."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose import require_tool

DAEMON_START_SECONDS = 60


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def unavailable(message: str) -> None:
    """Skipped on a developer's machine; under CI=true a failure, as for every tool CI installs."""
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must run the Docker tests", pytrace=False)
    pytest.skip(message)


@contextlib.contextmanager
def docker_engine() -> Iterator[None]:
    """Yields once `docker info` answers. Starts dockerd when no engine runs, and then stops it at the end (its
    containerd with it); an engine that was already running is left as it was."""
    require_tool("docker", "Debian: apt-get install docker.io")
    if engine_answers():
        yield
        return
    dockerd = shutil.which("dockerd")
    if not dockerd:
        unavailable("no Docker engine answers and dockerd is not installed (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        unavailable("no Docker engine answers, and only root may start dockerd")
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "dockerd.log"
        with open(log, "w") as out:
            daemon = subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + DAEMON_START_SECONDS
            while not engine_answers():
                if daemon.poll() is not None or time.monotonic() > end:
                    pytest.fail(f"dockerd did not start:\n{log.read_text()[-3000:]}", pytrace=False)
                time.sleep(0.5)
            yield
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
