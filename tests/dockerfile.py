"""The Dockerfile by stage, as dockerfile-parse reads it, with its build arguments' defaults filled in."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
# The script every stage's requirements come from: `python .../requirements.py PYPROJECT EXTRA... > FILE`,
# run in the stage of that name.
REQUIREMENTS_SCRIPT = "deploy/image/requirements.py"
REQUIREMENTS_STAGE = "requirements"


def substitute(text: str, values: dict[str, str | None]) -> str:
    """Docker's variable substitution: ${NAME:-default} (default when unset or empty), ${NAME}, $NAME."""
    def one(match: re.Match) -> str:
        name = match.group(1) or match.group(3) or match.group(4)
        value = values.get(name)
        if match.group(2) is not None and not value:
            return match.group(2)
        return value or ""
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
        out: dict[str, str | None] = {}
        for value in self.values("ARG"):
            name, sep, default = value.partition("=")
            out[name] = default if sep else None
        return out

    def env(self) -> dict[str, str]:
        """ENV as a container of this stage sees it: its own over the inherited."""
        out = {}
        for stage in reversed(self.lineage()):
            for value in stage.values("ENV"):
                for token in shlex.split(value):
                    key, _, val = token.partition("=")
                    out[key] = val
        return out

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

    def written_requirements(self) -> dict[str, set[str]]:
        """The requirement files this stage writes with the script, and the extras of each."""
        script = re.escape(Path(REQUIREMENTS_SCRIPT).name)
        return {path: set(extras.split()) for run in self.runs()
                for extras, path in re.findall(rf"{script}\s+\S+((?:\s+[\w-]+)*)\s*>\s*(\S+)", run)}

    def extras(self) -> set[str]:
        """The extras of attnserve this stage installs: with the requirement files it copies in, and its wheel."""
        found = set()
        for run in self.pip_installs():
            for group in re.findall(r"attnserve-\*\.whl\)?\[([^\]]*)\]", run):
                found |= {e.strip() for e in group.split(",")}
        for src, _ in self.copies_from(REQUIREMENTS_STAGE):
            found |= self.requirements[src]
        return found

    def copies(self) -> list[tuple[str | None, list[str], str]]:
        """Each COPY as (the stage it copies from or None for the build context, sources, destination), with the
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

    def build_args(self) -> set[str]:
        """Every build argument the file declares."""
        return set(self.global_args) | {name for stage in self.stages.values() for name in stage.args()}


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    parser = DockerfileParser(str(path), cache_content=True)
    global_args: dict[str, str | None] = {}
    stages: dict[str, Stage] = {}
    current = None
    for item in parser.structure:
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
    written = stages[REQUIREMENTS_STAGE].written_requirements() if REQUIREMENTS_STAGE in stages else {}
    for stage in stages.values():
        stage.requirements = written
    return Dockerfile(global_args, stages)
