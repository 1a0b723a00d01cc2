"""docker-compose.yml as Debian's docker-compose 1.29 reads it: a real parser, which needs no Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"


def compose_config(*profiles: str) -> dict:
    """`docker-compose config` (variables at their defaults), parsed."""
    exe = shutil.which("docker-compose")
    if exe is None:
        message = "Debian's docker-compose (1.29) is not installed: apt-get install docker-compose"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (.ci/run installs it)")
        pytest.skip(message)
    # The compose file's ${VARS} must take their defaults, whatever this shell has set.
    env = {k: v for k, v in os.environ.items() if k not in variables_of(COMPOSE_FILE.read_text())}
    args = [exe, "-f", str(COMPOSE_FILE), *(x for p in profiles for x in ("--profile", p)), "config"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, f"docker-compose config failed:\n{done.stderr}"
    return yaml.safe_load(done.stdout)


def variables_of(text: str) -> set[str]:
    import re

    return set(re.findall(r"\$\{(\w+)", text))


def environment(service: dict) -> dict[str, str]:
    """A service's environment as a dict, whichever form the file used."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}
