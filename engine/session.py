"""The sessions that run a graph: onnxruntime's (CUDA provider where there is one, CPU otherwise), or OpenVINO's.

A session (Session, declared here) is what the engine, the image tower, calibration and export's verification call,
and all they call: run(output names, feed) -> arrays, get_inputs() and get_outputs() (the graph's inputs and
outputs, each with its name), onnxruntime's InferenceSession methods, which the OpenVINO session
(engine/openvino_session.py) has too. open_session() and open_graph() return a Session, so mypy checks every call
on one against what both runtimes have. open_graph() opens one for a backend.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from attnserve.errors import ArtifactError, ConfigError

if TYPE_CHECKING:  # in annotations only: this module runs without importing numpy
    import numpy as np

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
# The CUDA provider's options (onnxruntime's CUDA execution provider docs):
#   use_tf32 0: fp32 graphs compute in fp32. Its default, TF32 matmuls, put the fp32 graphs 2.6e-3 from PyTorch on an
#     H200 (fp32's bar is 1e-4; bench/cuda_parity.py).
#   sdpa_kernel: the attention kernels the fused Attention ops may pick, as bits (flash 1, memory-efficient 2,
#     TensorRT fused 4, cuDNN 8, unfused 16, TensorRT flash 32, cross 64, causal 128): all but cuDNN's. Since
#     onnxruntime 1.31 an fp16 Attention op prefers cuDNN's SDPA on Hopper, which builds a plan for every new
#     batch shape: cold batches ran the fp16 graph at a fifth of the fp32 graph's speed on an H200, and a server,
#     whose batch shapes keep changing, at a sixteenth of offline (docs/performance.md, "CUDA").
CUDA_OPTIONS = {"use_tf32": "0", "sdpa_kernel": str(1 | 2 | 4 | 16 | 32 | 64 | 128)}
ONNXRUNTIME, OPENVINO = "onnxruntime", "openvino"
BACKENDS = (ONNXRUNTIME, OPENVINO)


@runtime_checkable
class GraphPort(Protocol):
    """A graph's input or output, as a session lists them (onnxruntime's NodeArg, openvino_session.OpenVINOPort)."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class Session(Protocol):
    """A graph opened on its runtime: onnxruntime's InferenceSession (or _ArenaPerRun over one), or
    openvino_session.OpenVINOSession. Safe to run from several threads at once."""

    def run(self, output_names: Sequence[str] | None, feed: dict[str, np.ndarray], /) -> list[np.ndarray]:
        """The outputs named (None: every output), in that order, for one feed of the graph's inputs by name."""
        ...

    def get_inputs(self) -> Sequence[GraphPort]:
        """The graph's inputs, in order."""
        ...

    def get_outputs(self) -> Sequence[GraphPort]:
        """The graph's outputs, in order."""
        ...


def available_providers() -> list[str]:
    import onnxruntime as ort

    return ort.get_available_providers()


def resolve_provider(requested: str) -> str:
    """"auto" | "cpu" | "cuda" -> the onnxruntime provider name, or a clear error."""
    available = available_providers()
    if requested == "cpu":
        return CPU
    if requested == "cuda":
        if CUDA not in available:
            raise ConfigError(
                "provider cuda requested, but this onnxruntime has no CUDA provider "
                f"(available: {', '.join(available)}); install attnserve[gpu] instead of attnserve[cpu]")
        return CUDA
    if requested == "auto":
        return CUDA if CUDA in available else CPU
    raise ConfigError(f"unknown provider {requested!r}: choose auto, cpu or cuda")


@functools.cache
def load_cuda_libraries() -> None:
    """The CUDA provider links libcudart, libcublas and libcudnn, which pip installs as nvidia-* wheels
    (onnxruntime-gpu[cuda,cudnn]) outside the loader's search path: onnxruntime's preload_dlls (1.21 and later)
    loads them from there, or by their names from the system's CUDA (an image's LD_LIBRARY_PATH). It prints what it
    could not load: to stderr, where the server's log is, not to a command's stdout."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        with contextlib.redirect_stdout(sys.stderr):
            preload()


class _ArenaPerRun:
    """A session whose CPU memory arena is emptied after every run (onnxruntime's arena shrinkage run option): within
    a run, the arena reuses each layer's buffers, and between runs, the memory goes back. Without an arena, each
    large buffer was mapped and faulted in anew for every layer: the Qwen3-0.6B shape's 3,344-token check row took
    57 s, and 34 s with this, at the same peak (3.35 against 3.28 GiB)."""

    def __init__(self, session):
        import onnxruntime as ort

        self._session = session
        self._options = ort.RunOptions()
        self._options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def run(self, output_names: Sequence[str] | None, feed: dict[str, np.ndarray], /) -> list[np.ndarray]:
        return self._session.run(output_names, feed, self._options)

    def get_inputs(self) -> Sequence[GraphPort]:
        return self._session.get_inputs()

    def get_outputs(self) -> Sequence[GraphPort]:
        return self._session.get_outputs()


# The spin of sessions that check or measure a graph (export's verification, int8's searches): they run beside
# PyTorch, another export, or, building a graph a request asked for, the requests a server answers, so their threads
# sleep between a run's parallel steps rather than spin on cores the others need. Three exports side by side on 2
# cores took 81 s instead of 106; alone, MiniLM's `export --all` took about as long either way.
CHECK_SPIN = "off"


def open_session(path: Path, provider: str, threads: int = 0, arena: bool | str = True,
                 disabled_optimizers: Sequence[str] = (), prepack: bool = True, spin: str = "on") -> Session:
    """arena False: no onnxruntime CPU memory arena, which otherwise keeps the largest run's memory for good;
    "per_run": an arena emptied after each run (_ArenaPerRun: an export's verification sessions).
    disabled_optimizers: onnxruntime graph transformers not to apply at load (a variant's own, from its manifest).
    prepack False: the matrix products read their weights where the external-data file is mapped, rather than
    from a second, repacked copy: one copy of the weights in memory instead of two, for runs about 10% slower (an
    export's verification sessions: its peak; a server keeps the faster runs).
    spin: the intra-op threads' spin-waiting (EngineConfig.spin_wait). "on": within runs and between them, for
    batches that follow each other (encode). "run": within a run, stopping as soon as it returns
    (session.force_spinning_stop): a server's door needs the cores between its batches (0.3 ms of CPU a request
    with a tiny model, spinning), and a lone request's run needs the threads awake (all-MiniLM-L6-v2 int8, one
    12-token text: 1.93 ms a run against 2.63 ms with "off", 1.72 ms with "on", which burnt a core while idle).
    "off": they sleep at once, and each parallel step of a run wakes them."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: the provider-assignment warnings are expected
    options.enable_cpu_mem_arena = bool(arena)
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if threads:
        options.intra_op_num_threads = threads
    if spin == "off":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif spin == "run":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    providers = [(provider, CUDA_OPTIONS), CPU] if provider == CUDA else [CPU]
    if provider == CUDA:
        load_cuda_libraries()
    try:
        session = ort.InferenceSession(str(path), options, providers=providers,
                                       disabled_optimizers=list(disabled_optimizers))
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ArtifactError(f"onnxruntime could not load {path}: {str(e).splitlines()[0]}") from None
    if session.get_providers()[0] != provider:
        raise ConfigError(f"{provider} could not start for {path.name} (CUDA libraries missing?)")
    return _ArenaPerRun(session) if arena == "per_run" and provider == CPU else session


def open_graph(path: Path, backend: str, precision: str, provider: str, threads: int = 0, arena: bool | str = True,
               disabled_optimizers: Sequence[str] = (), prepack: bool = True, spin: str = "on") -> Session:
    """A session for a graph variant on its backend. onnxruntime runs every graph on `provider`; OpenVINO runs
    fp32 and bf16 graphs on the CPU (arena, disabled_optimizers, prepack and spin are onnxruntime's, and do not
    apply)."""
    if backend == OPENVINO:
        if provider != CPU:
            raise ConfigError("the OpenVINO backend runs on the CPU; use --provider cpu or another precision")
        from .openvino_session import OpenVINOSession, openvino_available

        if not openvino_available():
            raise ConfigError(f"{path.name} runs on OpenVINO ({precision}), which is not installed: "
                              "pip install 'attnserve[openvino]'")
        return OpenVINOSession(path, precision, threads)
    if backend != ONNXRUNTIME:
        raise ArtifactError(f"{path.name}: unknown backend {backend!r} (one of {', '.join(BACKENDS)}); re-export")
    return open_session(path, provider, threads, arena, disabled_optimizers, prepack, spin)
