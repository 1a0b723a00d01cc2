"""docker-compose.yml as Debian's docker-compose 1.29 reads it (a real parser, which needs no Docker engine for
`config`), and run by it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"


def unavailable(message: str) -> NoReturn:
    """Skipped on a developer machine; under CI=true a failure (.ci/run installs every tool the tests need)."""
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI must have it", pytrace=False)
    pytest.skip(message)


def require_tool(name: str, install: str) -> str:
    """The tool's path, or unavailable."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    return path or unavailable(f"{name} is not installed ({install})")


def compose_config(*profiles: str, env: dict[str, str] | None = None) -> dict:
    """`docker-compose config`, parsed: validated, anchors merged, the file's ${VARIABLES} at their defaults (or
    env's values), whatever this shell or a .env file sets."""
    project = ComposeProject("attnserve-config", env or {})
    try:
        done = project.run(*(x for p in profiles for x in ("--profile", p)), "config", timeout=60)
        return yaml.safe_load(done.stdout)
    finally:
        project.close()


def environment(service: dict) -> dict[str, str]:
    """A service's environment as a dict, whichever form the file used."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


class ComposeProject:
    """docker-compose.yml under a project name of its own, with only the variables given (no .env file, none of this
    shell's), so that a test neither sees nor touches a user's stack."""

    def __init__(self, name: str, env: dict[str, str]):
        self.name = name
        self.exe = require_tool("docker-compose", "Debian: apt-get install docker-compose")
        variables = set(re.findall(r"\$\{(\w+)", COMPOSE_FILE.read_text()))
        self.env = {k: v for k, v in os.environ.items() if k not in variables and not k.startswith("COMPOSE_")} | env
        self._folder = tempfile.TemporaryDirectory()
        self.no_env_file = Path(self._folder.name) / "empty.env"
        self.no_env_file.write_text("")

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        command = [self.exe, "-f", str(COMPOSE_FILE), "--env-file", str(self.no_env_file), "-p", self.name, *args]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=self.env)
        assert done.returncode == 0, f"{shlex.join(command)}: exit {done.returncode}\n{done.stderr}"
        return done

    def containers(self, service: str) -> list[str]:
        """The names of a service's containers, in the order of their replica number."""
        labels = (f"com.docker.compose.project={self.name}", f"com.docker.compose.service={service}")
        args = ["docker", "ps", "-a", "--format", "{{.Names}}", *(f"--filter=label={label}" for label in labels)]
        names = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout.split()
        return sorted(names, key=lambda n: int(n.rsplit("_", 1)[-1]) if n.rsplit("_", 1)[-1].isdigit() else 0)

    def close(self) -> None:
        self._folder.cleanup()
