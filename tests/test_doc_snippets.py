"""Every fenced bash and python snippet in the README and docs/ runs as written, read from the pages themselves, each in
a folder of its own (examples/ beside it) against one `attnserve serve` of the default model on the documented ports.

A snippet's `attnserve serve ...` line runs as a server of its own on free ports until it serves; the lines after it
talk to the test's server, as they would to the one the line started. A snippet that cannot run here says why on the
line before its fence, `<!-- not run: REASON -->`, naming what it needs and the test that covers it instead.
Synopses (flags in brackets, INPUT and OUTPUT placeholders) are fenced as text.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnserve.config import ServerConfig
from attnserve.default_model import DEFAULT_MODEL_NAME, artifacts_dir_for
from attnserve.errors import ConfigError
from attnserve.server.ports import check_ports_free

from .conftest import link_but_data
from .serving import ServerProcess, serving

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
RUN = ("bash", "python")
# Fences that hold commands under another name would escape this test: commands are fenced bash or python.
COMMAND_LIKE = ("sh", "shell", "console", "zsh", "py", "python3", "pycon")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>[^>]+?) -->\s*$")
# What a reason may say: each names what the snippet needs that a test run cannot give it.
NEEDS = {"docker": r"docker|deploy/build-", "kubernetes": "kubectl|INGRESS_HOST|SERVICE_HOSTNAME", "grpcurl": "grpcurl",
         ".ci/run": r"pip install|python -m venv", "placeholder paths": r"DIR\b|/art/|/path/to/",
         "exports every graph": r"export --all"}
SERVE_LINE = re.compile(r"^attnserve serve\b(?P<flags>[^#&]*)&?\s*(#.*)?$")
DOCUMENTED_PORTS = {"port": 50051, "http_port": 8080, "metrics_port": 9000}


@dataclass(frozen=True)
class Snippet:
    name: str  # page:line
    lang: str
    body: str
    not_run: str | None


def snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            reason = NOT_RUN.search(text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1])
            line = text.count("\n", 0, m.start()) + 1
            found.append(Snippet(f"{page.relative_to(ROOT)}:{line}", m.group("lang"), m.group("body"),
                                 reason and reason.group("reason")))
    return found


SNIPPETS = snippets()
RUNNABLE = [s for s in SNIPPETS if s.lang in RUN and s.not_run is None]


def test_the_pages_fence_commands_as_bash_or_python_and_say_why_a_snippet_is_not_run():
    assert len(RUNNABLE) >= 15, [s.name for s in RUNNABLE]
    for s in SNIPPETS:
        assert s.lang not in COMMAND_LIKE, f"{s.name}: fence commands as bash or python, a synopsis as text"
        if s.not_run is None:
            continue
        assert s.lang in RUN, f"{s.name}: only a bash or python snippet needs a reason not to run"
        needs = [need for need in NEEDS if s.not_run.startswith(need)]
        assert needs, f"{s.name}: the reason {s.not_run!r} names none of {list(NEEDS)}"
        assert re.search(NEEDS[needs[0]], s.body), f"{s.name}: the snippet does not need {needs[0]}"
        assert s.not_run.startswith(".ci/run") or "tests/test_" in s.not_run, (
            f"{s.name}: name the test that covers it instead")


@pytest.fixture(scope="module")
def environment(artifacts, tmp_path_factory) -> dict[str, str]:
    """A cache with the default model's artifacts where `attnserve serve` and `encode` look for them; `attnserve`,
    `python` and `pip` of this interpreter first on PATH, as in the README's venv; curl failing on an HTTP error
    status (with the body said), as a snippet's reader would notice one."""
    cache = tmp_path_factory.mktemp("snippet-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTNSERVE_CACHE", str(cache))
        shutil.copytree(artifacts, artifacts_dir_for(DEFAULT_MODEL_NAME), copy_function=link_but_data,
                        ignore=shutil.ignore_patterns("calibration.json"))
    (cache / "curl").mkdir()
    (cache / "curl" / ".curlrc").write_text("fail-with-body\nsilent\nshow-error\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "ATTNSERVE_CACHE": str(cache), "PATH": path, "CURL_HOME": str(cache / "curl")}


@pytest.fixture(scope="module")
def documented_server(environment, tmp_path_factory):
    """The default model served on the ports the pages name."""
    try:
        check_ports_free(ServerConfig(host="127.0.0.1", **DOCUMENTED_PORTS))
    except ConfigError as e:
        pytest.fail(f"{e}: the snippets talk to a server on the documented ports")
    with serving(ServerProcess(None, **DOCUMENTED_PORTS, env={"ATTNSERVE_CACHE": environment["ATTNSERVE_CACHE"]},
                               log_path=tmp_path_factory.mktemp("documented") / "server.log")) as process:
        yield process


def run_ok(snippet: Snippet, argv: list[str], environment: dict[str, str], folder: Path) -> None:
    result = subprocess.run(argv, cwd=folder, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{snippet.name}:\n{snippet.body}\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.name for s in RUNNABLE])
def test_the_snippet_runs_as_written(snippet, documented_server, environment, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    if snippet.lang == "python":
        run_ok(snippet, [sys.executable, "-c", snippet.body], environment, tmp_path)
        return
    # The lines before a serve line run first, then the server it starts (ServerProcess gives it free ports) is
    # waited for until it serves and drained, then the lines after it.
    segment: list[str] = []
    for line in [*snippet.body.splitlines(), None]:
        serve = SERVE_LINE.match(line.strip()) if line is not None else None
        if line is not None and not serve:
            segment.append(line)
            continue
        if any(s.strip() and not s.strip().startswith("#") for s in segment):
            run_ok(snippet, ["bash", "-euo", "pipefail", "-c", "\n".join(segment)], environment, tmp_path)
        segment = []
        if serve:
            with serving(ServerProcess(None, *shlex.split(serve.group("flags")), cwd=tmp_path,
                                       env={"ATTNSERVE_CACHE": environment["ATTNSERVE_CACHE"]},
                                       log_path=tmp_path / "serve-line.log")):
                pass
