"""deploy/'s files read for the tests: the Dockerfile by stage (dockerfile-parse, the build arguments' defaults filled
in), deploy/k8s/'s resources, and what the CLI accepts of a command line or of an environment of settings."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
from collections import Counter
from pathlib import Path
from unittest import mock

import yaml
from dockerfile_parse import DockerfileParser

from attnserve import config as config_module
from attnserve.cli import build_parser
from attnserve.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
# `python deploy/image/requirements.py PYPROJECT EXTRA... > FILE`, run in the stage REQUIREMENTS_STAGE, writes the
# requirement files the other stages copy in.
REQUIREMENTS_SCRIPT = "deploy/image/requirements.py"
REQUIREMENTS_STAGE = "requirements"
K8S = REPO / "deploy" / "k8s"
KUSTOMIZATION = "kustomization.yaml"  # kustomize's own file, not a Kubernetes resource


def substitute(text: str, values: dict[str, str | None]) -> str:
    """Docker's variable substitution: ${NAME:-default} (default when unset or empty), ${NAME}, $NAME."""
    def one(match: re.Match) -> str:
        value = values.get(match.group(1) or match.group(3) or match.group(4))
        return match.group(2) if match.group(2) is not None and not value else value or ""
    return re.sub(r"\$\{(\w+):-([^}]*)\}|\$\{(\w+)\}|\$(\w+)", one, text)


@dataclasses.dataclass
class Stage:
    name: str
    base: str  # after substitution: an image, or the name of an earlier stage
    instructions: list[tuple[str, str]]
    parent: Stage | None = None  # the stage it is FROM, when it is one
    requirements: dict[str, set[str]] = dataclasses.field(default_factory=dict)  # file -> extras, once read

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def lineage(self) -> list[Stage]:
        """This stage and the stages it is built FROM, the first one last."""
        return [self, *(self.parent.lineage() if self.parent else [])]

    def args(self) -> dict[str, str | None]:
        """The ARGs this stage declares, with their defaults (None: none)."""
        return {name: default if sep else None for name, sep, default in (v.partition("=") for v in self.values("ARG"))}

    def env(self) -> dict[str, str]:
        """ENV as a container of this stage sees it: its own over the inherited."""
        tokens = [t for stage in reversed(self.lineage()) for value in stage.values("ENV") for t in shlex.split(value)]
        return dict(token.partition("=")[::2] for token in tokens)

    def exec_form(self, instruction: str) -> list[str]:
        values = self.values(instruction)
        assert values, f"stage {self.name} has no {instruction}"
        argv = json.loads(values[-1])  # the exec form: no shell between Docker and the process
        assert isinstance(argv, list), f"stage {self.name}: {instruction} is not in exec form"
        return argv

    def healthcheck(self) -> list[str]:
        values = self.values("HEALTHCHECK")
        assert values, f"stage {self.name} has no HEALTHCHECK"
        match = re.search(r"\bCMD\s+(\[.*\])\s*$", values[-1])
        assert match, f"stage {self.name}: HEALTHCHECK is not `CMD [exec form]`: {values[-1]}"
        return json.loads(match.group(1))

    def runs(self) -> list[str]:
        """The stage's RUN commands, with its ARGs' defaults filled in (as an unset build argument leaves them)."""
        return [substitute(run, self.args()) for run in self.values("RUN")]

    def pip_installs(self) -> list[str]:
        return [run for run in self.runs() if re.search(r"\bpip\b.*\binstall\b", run)]

    def extras(self) -> set[str]:
        """The extras of attnserve this stage installs: with the requirement files it copies in, and its wheel."""
        found = {e.strip() for run in self.pip_installs()
                 for group in re.findall(r"attnserve-\*\.whl\)?\[([^\]]*)\]", run) for e in group.split(",")}
        return found.union(*(self.requirements[src] for src, _ in self.copies_from(REQUIREMENTS_STAGE)))

    def copies(self) -> list[tuple[str | None, list[str], str]]:
        """Each COPY as (the stage it copies from, or None for the build context; sources; destination), with the
        build arguments' defaults filled in."""
        out = []
        for value in self.values("COPY"):
            tokens = shlex.split(substitute(value, self.args()))
            source = next((t.split("=", 1)[1] for t in tokens if t.startswith("--from=")), None)
            paths = [t for t in tokens if not t.startswith("--")]
            out.append((source, paths[:-1], paths[-1]))
        return out

    def copies_from(self, stage: str) -> list[tuple[str, str]]:
        return [(src, dst) for source, sources, dst in self.copies() if source == stage for src in sources]

    def context_files(self) -> list[str]:
        """What this stage copies from the build context."""
        return [src for source, sources, _ in self.copies() if source is None for src in sources]


@dataclasses.dataclass
class Dockerfile:
    global_args: dict[str, str | None]  # the ARGs before the first FROM, which FROM lines may use
    stages: dict[str, Stage]


def read_dockerfile(path: Path = REPO / "Dockerfile") -> Dockerfile:
    global_args: dict[str, str | None] = {}
    stages: dict[str, Stage] = {}
    current = None
    for item in DockerfileParser(str(path), cache_content=True).structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: FROM {item['value']}"
            base = substitute(words[0], global_args)
            current = stages[words[2]] = Stage(words[2], base, [], stages.get(base))
        elif item["instruction"] == "ARG" and current is None:
            name, sep, default = item["value"].partition("=")
            global_args[name] = default if sep else None
        elif item["instruction"] != "COMMENT":
            assert current is not None, f"{item['instruction']} before the first FROM"
            current.instructions.append((item["instruction"], item["value"]))
    # The requirement files the requirements stage writes with the script, and the extras of each.
    script = re.escape(Path(REQUIREMENTS_SCRIPT).name)
    runs = stages[REQUIREMENTS_STAGE].runs() if REQUIREMENTS_STAGE in stages else []
    written = {path: set(extras.split()) for run in runs
               for extras, path in re.findall(rf"{script}\s+\S+((?:\s+[\w-]+)*)\s*>\s*(\S+)", run)}
    for stage in stages.values():
        stage.requirements = written
    return Dockerfile(global_args, stages)


def k8s_files() -> list[Path]:
    return [path for path in sorted(K8S.glob("*.yaml")) if path.name != KUSTOMIZATION]


def k8s_manifests() -> dict[str, dict]:
    """deploy/k8s/'s resources, the file each is in under "_file": by kind where a kind has one ("Deployment"), by
    kind and name where it has several ("Service/attnserve-grpc")."""
    docs = [doc | {"_file": path.name} for path in k8s_files() for doc in yaml.safe_load_all(path.read_text())]
    kinds = Counter(doc["kind"] for doc in docs)
    keys = [doc["kind"] if kinds[doc["kind"]] == 1 else f"{doc['kind']}/{doc['metadata']['name']}" for doc in docs]
    twice = [key for key, n in Counter(keys).items() if n > 1]
    assert not twice, f"two of each of {twice}"
    return dict(zip(keys, docs, strict=True))


def server_container(resources: dict[str, dict]) -> dict:
    (only,) = resources["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def port_named(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def cli_error(argv: list[str]) -> str | None:
    """None when the CLI's parser accepts argv; otherwise what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        said = err.getvalue().strip().splitlines()
        return f"`attnserve {shlex.join(argv)}`: {said[-1] if said else f'exit {e.code}'}"
    return None


def config_dataclasses() -> list[type]:
    """Every dataclass in attnserve/config.py whose fields name environment variables."""
    return [cls for cls in vars(config_module).values()
            if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == config_module.__name__
            and any("env" in f.metadata for f in dataclasses.fields(cls))]


def known_environment() -> set[str]:
    names = {f.metadata["env"] for cls in config_dataclasses() for f in dataclasses.fields(cls) if "env" in f.metadata}
    return names | {"ATTNSERVE_CACHE"}  # default_model.py: where the default model's artifacts are cached


def configuration_errors(env: dict[str, str]) -> list[str]:
    """What reading every settings dataclass as the CLI does (their checks included) refuses, with env's ATTNSERVE_*
    variables the only ones set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    errors = []
    with mock.patch.dict(os.environ, clean | {k: str(v) for k, v in env.items() if k.startswith("ATTNSERVE_")},
                         clear=True):
        for cls in config_dataclasses():
            try:
                config_module.from_args(cls, argparse.Namespace())
            except ConfigError as e:
                errors.append(f"{cls.__name__}: {e}")
    return errors
