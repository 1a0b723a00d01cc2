"""Shared fixtures: the real default checkpoint, its PyTorch encoder, and artifacts exported once per run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnserve.default_model import DEFAULT_MODEL_NAME, default_checkpoint_dir

# The servers the tests start serve in one process unless a test asks for workers: `--workers auto` (the default)
# measures each new model on its first start, and may choose two processes for a tiny one (server/workers/auto.py;
# tests/test_workers_auto.py tests it).
os.environ.setdefault("ATTNSERVE_WORKERS", "1")
# The suite runs more processes than the machine has cores (a worker per CPU and one more, and their servers), so
# no thread waits by spinning on a core another process needs: PyTorch's OpenMP threads sleep once their work is done
# (read when torch loads, which conftest imports nothing of), and the servers' and encode runs' onnxruntime threads
# sleep between a run's parallel steps (EngineConfig.spin_wait). Three exports side by side on 2 cores took 92 s
# with PyTorch's threads sleeping, against 166 s spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("ATTNSERVE_SPIN_WAIT", "off")

# Varied on purpose: unicode in several scripts, punctuation runs, emoji, and
# texts far past max_seq_length (256) so truncation is exercised.
VARIED_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé: naïve café, façade, Straße, smørrebrød — and “quotes”.",
    "東京は日本の首都です。北京是中国的首都。",
    "Привет, как дела? مرحبا بالعالم",
    "What?!... Really;; (yes) [no] {maybe} <tag> #hash @user $100 50% 🙂🚀",
    "a",
    " ".join(f"word{i} and more text" for i in range(150)),  # ~600 tokens: truncated
    "short " * 300,  # one word piece repeated past the limit
]


def link_but_data(source: str, destination: str) -> None:
    """copytree's copy_function for an artifact directory: its files hard-linked, but its data files
    (export/external_data.py) copied. onnx's loader refuses a data file with more than one link (a "hardlink
    attack", onnx's external_data_helper), and onnxruntime's quantizer loads with it: a link would make every
    directory that shares the file unreadable to it."""
    if source.endswith(".data"):
        shutil.copy2(source, destination)
    else:
        os.link(source, destination)


def shared_by_workers(tmp_path_factory, name: str, build) -> Path:
    """A directory that build(directory) writes once per test run and the run's pytest-xdist workers share: the
    first worker to take its lock builds it, the others wait and read it. Each worker gets hard links of it in a
    directory of its own (link_but_data), where its servers record their graph calibration."""
    from attnserve.default_model import build_lock

    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' base temporary directories share a parent
        shared = tmp_path_factory.getbasetemp().parent / "shared" / name
    else:
        shared = tmp_path_factory.getbasetemp() / "shared" / name
    built = shared.parent / f"{name}.built"
    if not built.exists():
        with build_lock(shared):
            if not built.exists():
                shutil.rmtree(shared, ignore_errors=True)
                build(shared)
                built.touch()
    out = tmp_path_factory.mktemp(name) / "artifacts"
    shutil.copytree(shared, out, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))
    return out


@pytest.fixture(scope="session")
def checkpoint():
    from attnserve.model.checkpoint import read_checkpoint

    return read_checkpoint(default_checkpoint_dir(), DEFAULT_MODEL_NAME)


@pytest.fixture(scope="session")
def encoder(checkpoint):
    from attnserve.model.checkpoint import load_encoder

    return load_encoder(checkpoint)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory, checkpoint) -> Path:
    """Exported once per test run, through the same code path as `attnserve export --all` (verification included),
    and shared by the run's pytest-xdist workers: the first to get the artifact lock exports, the others wait and
    read it. What the directory lacks of this install's variants is added (.ci/run's OpenVINO venv adds the
    OpenVINO graphs to the directory the main run exported).

    ATTNSERVE_TEST_ARTIFACTS names that directory, to reuse it across runs; otherwise it is the run's own (CI's
    runs export afresh).
    """
    from attnserve.default_model import build_lock
    from attnserve.export.artifacts import add_variants, all_variants, build_artifacts

    reuse = os.environ.get("ATTNSERVE_TEST_ARTIFACTS")
    if reuse:
        shared = Path(reuse)
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' base temporary directories share a parent
        shared = tmp_path_factory.getbasetemp().parent / "shared-artifacts" / "minilm"
    else:
        shared = tmp_path_factory.mktemp("shared-artifacts") / "minilm"
    if not (shared / "manifest.json").exists():
        with build_lock(shared):
            if not (shared / "manifest.json").exists():
                build_artifacts(checkpoint, shared, log=lambda m: None)
    add_variants(shared, all_variants(checkpoint), log=lambda m: None)  # nothing, where it has them all
    # Hard links in a directory of this session's own: engines record their graph calibration beside the
    # artifacts (calibration.json), which must not change the directory shared, nor carry over between runs.
    out = tmp_path_factory.mktemp("artifacts") / "minilm"
    shutil.copytree(shared, out, copy_function=link_but_data, ignore=shutil.ignore_patterns("calibration.json"))
    return out


@pytest.fixture(scope="session")
def engine(artifacts):
    """ATTNSERVE_TEST_GRAPH runs it on one graph of the manifest: .ci/run runs the engine's tests again on
    OpenVINO's fp32 graph (embeddings_openvino), in a venv with attnserve[openvino]."""
    from attnserve.config import EngineConfig
    from attnserve.engine.engine import Engine

    config = EngineConfig(graph=os.environ.get("ATTNSERVE_TEST_GRAPH", "auto"))
    return Engine.from_directory(artifacts, config, attention=True)


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory) -> Path:
    """A tiny random-weight cross-encoder (BertForSequenceClassification, MiniLM's tokenizer), saved by
    sentence-transformers' CrossEncoder."""
    from tests.checkpoints import save_cross_encoder

    return save_cross_encoder(tmp_path_factory.mktemp("cross_encoder") / "ckpt", default_checkpoint_dir())


@pytest.fixture(scope="session")
def reranker_artifacts(cross_encoder_dir, tmp_path_factory) -> Path:
    """The cross-encoder exported as a reranker, through the same code path as `attnserve export`."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    return shared_by_workers(tmp_path_factory, "reranker", lambda out: build_artifacts(
        read_checkpoint(cross_encoder_dir, "tiny-reranker"), out, log=lambda m: None))


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory) -> Path:
    """A tiny random-weight CLIPModel with its CLIPProcessor, as transformers saves them (tests/checkpoints.py)."""
    from tests.checkpoints import save_tiny_clip

    return save_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


@pytest.fixture(scope="session")
def clip_artifacts(clip_dir, tmp_path_factory) -> Path:
    """The tiny CLIP exported as `attnserve export --all` would: its text tower's graphs and its image tower's."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint

    return shared_by_workers(tmp_path_factory, "clip_artifacts", lambda out: build_artifacts(
        read_checkpoint(clip_dir, "tiny-clip"), out, log=lambda m: None,
        variants=["embeddings", "embeddings_int8", "attention"]))


@pytest.fixture(scope="session")
def siglip_artifacts(tmp_path_factory) -> Path:
    """A tiny random-weight SiglipModel (tests/checkpoints.py), exported: its text tower's graphs and its image
    tower's."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint
    from tests.checkpoints import save_tiny_siglip

    def build(out: Path) -> None:
        checkpoint = save_tiny_siglip(out.parent / "tiny-siglip")
        build_artifacts(read_checkpoint(checkpoint, "tiny-siglip"), out, log=lambda m: None,
                        variants=["embeddings", "attention"])

    return shared_by_workers(tmp_path_factory, "siglip_artifacts", build)


@pytest.fixture(scope="session")
def siglip2_artifacts(tmp_path_factory) -> Path:
    """A tiny random-weight Siglip2Model (NaFlex: each image at its own size; tests/checkpoints.py), exported."""
    from attnserve.export.artifacts import build_artifacts
    from attnserve.model.checkpoint import read_checkpoint
    from tests.checkpoints import save_tiny_siglip2

    def build(out: Path) -> None:
        checkpoint = save_tiny_siglip2(out.parent / "tiny-siglip2")
        build_artifacts(read_checkpoint(checkpoint, "tiny-siglip2"), out, log=lambda m: None,
                        variants=["embeddings", "attention"])

    return shared_by_workers(tmp_path_factory, "siglip2_artifacts", build)


@pytest.fixture
def artifacts_copy(artifacts, tmp_path) -> Path:
    """A private copy for tests that damage files."""
    dst = tmp_path / "artifacts"
    shutil.copytree(artifacts, dst)
    return dst


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real console entry point in a fresh process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "attnserve.cli", *map(str, args)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


# The lines an export shows before its first step fails (attnserve/progress.py): what it exports, then each step
# with its time; they are progress, not part of the error.
_PROGRESS = re.compile(r"^(exporting .* to ONNX(: .*)?|building .* \(once: .*|\[ *\d+\.\ds\] .*|\.\.\. still .*)$")


def _log_line(line: str) -> bool:
    """A JSON log line below ERROR (serve logs an export's progress as such, where stderr is not a terminal)."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("level") in ("debug", "info", "warning")


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not line.startswith("attnserve: ") and not _PROGRESS.match(line)
             and not _log_line(line)]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="session")
def server(artifacts, tmp_path_factory):
    """One `attnserve serve` process shared by the tests that leave it as they found it."""
    from tests.serving import ServerProcess, serving

    process = ServerProcess(artifacts, log_path=tmp_path_factory.mktemp("server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="session")
def stub(server):
    with server.channel() as channel:
        yield server.stub(channel)


# The shared reranker takes at most this many inputs a request, so that tests/test_server_rerank.py can send one
# more; the other tests send fewer.
RERANKER_MAX_INPUTS = 8


@pytest.fixture(scope="session")
def reranker_server(reranker_artifacts, tmp_path_factory):
    """One `attnserve serve` process of the tiny reranker, shared as `server` is."""
    from tests.serving import ServerProcess, serving

    process = ServerProcess(reranker_artifacts, env={"ATTNSERVE_MAX_INPUTS_PER_REQUEST": str(RERANKER_MAX_INPUTS)},
                            log_path=tmp_path_factory.mktemp("reranker_server") / "server.log")
    with serving(process):
        yield process


@pytest.fixture(scope="session")
def clip_server(clip_artifacts, tmp_path_factory):
    """One `attnserve serve` process of the tiny CLIP (texts and images), shared as `server` is."""
    from tests.serving import ServerProcess, serving

    process = ServerProcess(clip_artifacts, log_path=tmp_path_factory.mktemp("clip_server") / "server.log")
    with serving(process):
        yield process


# The hosts image_workers fetches image URLs from, and its limits on them.
URL_LIMITS = ("--allow-image-urls", "127.0.0.1", "--max-image-url-bytes", "100000", "--image-url-timeout", "1")


@pytest.fixture(scope="session")
def image_workers(clip_artifacts, siglip2_artifacts, tmp_path_factory):
    """The tiny CLIP (the default model) and the tiny SigLIP 2 ("siglip2") behind two front-door workers: images
    are decoded there, fetched there from URLs (URL_LIMITS), and only their pixels cross to the engine process."""
    from tests.serving import ServerProcess, serving

    process = ServerProcess(None, "--workers", "2", "--model", f"clip={clip_artifacts}", "--model",
                            f"siglip2={siglip2_artifacts}", *URL_LIMITS,
                            log_path=tmp_path_factory.mktemp("image_workers") / "server.log")
    with serving(process):
        yield process


# The shared server with a guard and a small queue: a few requests' tokens fill it (RESOURCE_EXHAUSTED, HTTP 429).
GUARD_KEY = "sk-guarded"
GUARDED_QUEUE_TOKENS = 1024
# ... and the names it also answers to, beside the model's own (serve --served-model-name).
GUARDED_ALIASES = ("minilm", "text-embedding-3-small")


@pytest.fixture(scope="session")
def guarded_server(artifacts, tmp_path_factory):
    """One `attnserve serve --api-key GUARD_KEY --max-queue-tokens 1024 --served-model-name ...`, shared by the
    tests of API keys, of a full queue and of aliases; each counts from the metrics as it found them."""
    from tests.serving import ServerProcess, serving

    aliases = [flag for alias in GUARDED_ALIASES for flag in ("--served-model-name", alias)]
    process = ServerProcess(artifacts, "--api-key", GUARD_KEY, "--max-queue-tokens", str(GUARDED_QUEUE_TOKENS),
                            *aliases, log_path=tmp_path_factory.mktemp("guarded_server") / "server.log")
    with serving(process):
        yield process


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml's addopts): a worker per usable CPU and one more, at most 4. The suite's exports and
    servers use a core each only in part (tracing, imports and start-ups run on one; Docker's image build waits on
    the package index, a server's test on its replies), so on 2 cores a third worker fills what two leave idle: a
    full run took 1,204 s with 3 workers against 1,295 s with 2. Past 4, memory rather than cores bounds them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cpus + 1))


# The files that take longest, collected first, the longest first (seconds of a 2-worker run): pytest-xdist hands its
# workers whole files in collection order (pyproject.toml's --no-loadscope-reorder; by default it sorts them by their
# number of tests, which left Docker's image and schemathesis's five servers to the end, running alone). Docker's
# build leads: it waits on the package index while the others compute.
FIRST = ("test_docker_fleet.py",  # 346
         "test_encode.py",  # 213
         "test_family_conformance.py",  # 157
         "test_real_models.py",  # 123
         "test_http_schemathesis.py",  # 122
         "test_variants_on_demand.py",  # 111
         "test_first_calls.py",  # 84
         "test_cross_encoder_families.py",  # 81
         "test_encode_drivers.py",  # 69
         "test_doc_snippets.py",  # 65
         "test_explorer.py",  # 58
         "test_colbert.py", "test_export_long_context.py", "test_splade.py", "test_http_hostile.py",
         "test_loadtest.py")  # about 50 each


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: the others keep their order
