"""docker-compose.yml as Debian's docker-compose 1.29 reads it: a real parser, which needs no Docker engine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"


def require_tool(name: str, install: str) -> str:
    """The tool's path; skipped on a developer machine without it, a failure in CI (.ci/run installs it)."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path:
        return path
    message = f"{name} is not installed ({install})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must have it", pytrace=False)
    pytest.skip(message)


def compose_config(*profiles: str, env: dict[str, str] | None = None) -> dict:
    """`docker-compose config`, parsed: validated, anchors merged, variables interpolated.

    The file's ${VARIABLES} take their defaults (or env's values), whatever this shell or a .env file sets.
    """
    exe = require_tool("docker-compose", "Debian: apt-get install docker-compose")
    variables = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
    clean = {k: v for k, v in os.environ.items() if k not in variables and not k.startswith("COMPOSE_")}
    with tempfile.TemporaryDirectory() as folder:
        no_env_file = Path(folder) / "empty.env"  # docker-compose refuses /dev/null: "not a file"
        no_env_file.write_text("")
        command = [exe, "-f", str(COMPOSE_FILE), "--env-file", str(no_env_file),
                   *(x for p in profiles for x in ("--profile", p))]
        result = subprocess.run([*command, "config"], cwd=REPO, capture_output=True, text=True, timeout=60,
                                env={**clean, **(env or {})})
    assert result.returncode == 0, f"{shlex.join(command)} config:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


def environment(service: dict) -> dict[str, str]:
    """A service's environment as a dict, whichever form the file used."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}
