"""onnxruntime sessions on the CUDA provider where there is one, the CPU provider otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnserve.errors import ArtifactError, ConfigError

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


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


def open_session(path: Path, provider: str, threads: int = 0, arena: bool = True,
                 disabled_optimizers: Sequence[str] = ()):
    """arena False: no onnxruntime CPU memory arena, which otherwise keeps the largest run's memory for good.
    disabled_optimizers: onnxruntime graph transformers not to apply at load (a variant's own, from its manifest)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: the provider-assignment warnings are expected
    options.enable_cpu_mem_arena = arena
    if threads:
        options.intra_op_num_threads = threads
    providers = [provider, CPU] if provider == CUDA else [CPU]
    try:
        session = ort.InferenceSession(str(path), options, providers=providers,
                                       disabled_optimizers=list(disabled_optimizers))
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ArtifactError(f"onnxruntime could not load {path}: {str(e).splitlines()[0]}") from None
    if session.get_providers()[0] != provider:
        raise ConfigError(f"{provider} could not start for {path.name} (CUDA libraries missing?)")
    return session
